#include "privacy/rdp_wor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "privacy/log_space.h"

namespace cohort::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Up to this order the forward-difference term is evaluated (O(α²) work);
// above it only the cap 2 e^{(j-1) ε(j)}, as dp_accounting does.
constexpr int kMaxDifferencedOrder = 256;

// (j - 1) ε(j) = j (j - 1) / (2 z²): the Gaussian's CGF at j - 1.
double GaussianCgf(double z, int j) { return double(j) * (j - 1) / (2 * z * z); }

// out[l - 1] = log |Δ^l g (0)| for l = 1..n, g(k) = e^{(k-1) ε(k)}. The
// differences are taken in place, in log space with a sign per entry (pass
// l leaves Δ^l g(j) in entry j), because the terms grow like e^{k²/(2z²)}
// and cannot be formed directly; dp_accounting differences the same way.
std::vector<double> LogForwardDifferences(double z, int n) {
  std::vector<double> mag(n + 1);
  std::vector<bool> positive(n + 1, true);
  for (int k = 0; k <= n; ++k) mag[k] = GaussianCgf(z, k);
  std::vector<double> out(n);
  for (int l = 1; l <= n; ++l) {
    for (int j = 0; j + l <= n; ++j) {
      const double a = mag[j], b = mag[j + 1];  // Entry j becomes b - a.
      if (positive[j] == positive[j + 1]) {
        if (b > a) {
          mag[j] = b + std::log1p(-std::exp(a - b));
          positive[j] = positive[j + 1];
        } else if (b < a) {
          mag[j] = a + std::log1p(-std::exp(b - a));
          positive[j] = !positive[j + 1];
        } else {
          mag[j] = -kInf;
          positive[j] = true;
        }
      } else {
        mag[j] = LogAdd(a, b);
        positive[j] = positive[j + 1];
      }
    }
    out[l - 1] = mag[0];
  }
  return out;
}

// log of the j = 2 term's bound without q² C(α,2): min(4 (e^{ε(2)} - 1),
// 2 e^{ε(2)}), the same in Theorems 9 and 27.
double LogSecondTerm(double eps2) {
  return std::min(std::log(4.0) + eps2 + std::log1p(-std::exp(-eps2)), eps2 + std::log(2.0));
}

// log(A) at integer `alpha`: log(1 + q² C(α,2) e^{log_second} + Σ_{j=3..α}
// q^j C(α,j) e^{log_term(j)}), the shape both theorems share.
template <typename LogTerm>
double LogASum(double q, int alpha, double log_second, const LogTerm& log_term) {
  if (alpha <= 1) return 0;
  const double log_q = std::log(q);
  double log_a = LogAdd(0, 2 * log_q + LogBinomial(alpha, 2) + log_second);
  for (int j = 3; j <= alpha; ++j) {
    log_a = LogAdd(log_a, log_term(j) + j * log_q + LogBinomial(alpha, j));
  }
  return log_a;
}

// log(A) at integer `alpha` (the header's sum); `diffs` from
// LogForwardDifferences with n >= min(alpha, kMaxDifferencedOrder) + 1.
double LogAInteger(double q, double z, int alpha, const std::vector<double>& diffs) {
  return LogASum(q, alpha, LogSecondTerm(1 / (z * z)), [&](int j) {
    double s = std::log(2.0) + GaussianCgf(z, j);
    if (alpha <= kMaxDifferencedOrder) {
      const double lo = diffs[2 * (j / 2) - 1], hi = diffs[2 * ((j + 1) / 2) - 1];
      s = std::min(s, std::log(4.0) + 0.5 * (lo + hi));
    }
    return s;
  });
}

// RDP at each finite order of `orders` from log(A) at the integers (memoised
// up to `top`, the largest ceil(order)): log(A) interpolated linearly
// between neighbouring integers (Corollary 10), over α - 1; +inf where it is
// NaN (two infinite terms). Infinite orders are left as `rdp` has them.
template <typename LogAAt>
void RdpFromLogA(std::span<const double> orders, int top, const LogAAt& log_a_integer,
                 std::vector<double>& rdp) {
  std::vector<double> log_a(top + 1, -1);  // Memo; log(A) >= 0.
  auto log_a_at = [&](int alpha) {
    if (log_a[alpha] < 0) log_a[alpha] = log_a_integer(alpha);
    return log_a[alpha];
  };
  for (size_t k = 0; k < orders.size(); ++k) {
    const double alpha = orders[k];
    if (std::isinf(alpha)) continue;
    const double lo = std::floor(alpha), t = alpha - lo;
    const double cgf =
        t == 0 ? log_a_at(static_cast<int>(lo))
               : (1 - t) * log_a_at(static_cast<int>(lo)) + t * log_a_at(static_cast<int>(lo) + 1);
    rdp[k] = std::isnan(cgf) ? kInf : cgf / (alpha - 1);
  }
}

// The largest integer order `orders` needs (its finite ones, rounded up).
int TopOrder(std::span<const double> orders) {
  int top = 1;
  for (double order : orders) {
    if (!std::isinf(order)) top = std::max(top, static_cast<int>(std::ceil(order)));
  }
  return top;
}

}  // namespace

std::vector<double> SampledWithoutReplacementGaussianRdp(double q, double noise_multiplier,
                                                         std::span<const double> orders) {
  std::vector<double> rdp(orders.size(), 0.0);
  if (q == 0) return rdp;
  const double z = noise_multiplier;
  for (size_t k = 0; k < orders.size(); ++k) {
    if (z == 0 || std::isinf(orders[k])) {
      rdp[k] = kInf;
    } else if (q == 1) {
      rdp[k] = orders[k] / (2 * z * z);
    }
  }
  if (z == 0 || q == 1) return rdp;
  const int top = TopOrder(orders);
  const std::vector<double> diffs =
      LogForwardDifferences(z, std::min(top, kMaxDifferencedOrder) + 1);
  RdpFromLogA(
      orders, top, [&](int alpha) { return LogAInteger(q, z, alpha, diffs); }, rdp);
  return rdp;
}

std::vector<double> SampledWithoutReplacementRdp(double q, const std::function<double(int)>& rdp_at,
                                                 std::span<const double> orders) {
  std::vector<double> rdp(orders.size(), 0.0);
  if (q == 0) return rdp;
  for (size_t k = 0; k < orders.size(); ++k) {
    if (std::isinf(orders[k])) rdp[k] = kInf;
  }
  const int top = TopOrder(orders);
  // log of the j-th term's bound, 2 e^{(j-1) ε(j)}, for j = 3..top.
  std::vector<double> log_term(top + 1, kInf);
  for (int j = 3; j <= top; ++j) log_term[j] = std::log(2.0) + (j - 1) * rdp_at(j);
  const double log_second = top >= 2 ? LogSecondTerm(rdp_at(2)) : 0;
  RdpFromLogA(
      orders, top,
      [&](int alpha) { return LogASum(q, alpha, log_second, [&](int j) { return log_term[j]; }); },
      rdp);
  return rdp;
}

Status ComposeSampledWithoutReplacement(RdpAccountant& accountant, double q,
                                        double noise_multiplier, uint64_t steps) {
  if (!(q >= 0 && q <= 1)) {
    return InvalidArgumentError("privacy accounting: sampling fraction " + fmt::format("{}", q) +
                                " is not in [0, 1]");
  }
  if (!(noise_multiplier > 0) || std::isinf(noise_multiplier)) {
    return InvalidArgumentError("privacy accounting: noise multiplier " +
                                fmt::format("{}", noise_multiplier) + " is not finite and > 0");
  }
  if (steps == 0 || q == 0) return OkStatus();
  return accountant.AddRdp(
      SampledWithoutReplacementGaussianRdp(q, noise_multiplier, accountant.orders()), steps);
}

}  // namespace cohort::privacy
