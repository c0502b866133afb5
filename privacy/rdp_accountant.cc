#include "privacy/rdp_accountant.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "privacy/log_space.h"

namespace cohort::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr std::array<double, 151> MakeDefaultOrders() {
  std::array<double, 151> orders{};
  size_t n = 0;
  for (int x = 1; x <= 99; ++x) orders[n++] = 1.0 + x / 10.0;
  for (int a = 12; a <= 63; ++a) orders[n++] = a;
  return orders;
}
constexpr std::array<double, 151> kDefaultOrders = MakeDefaultOrders();

// log(exp(a) - exp(b)) for a >= b; NaN when b > a (the caller gives up).
double LogSub(double a, double b) {
  if (b == -kInf) return a;
  if (b > a) return std::numeric_limits<double>::quiet_NaN();
  if (a == b) return -kInf;
  return b + std::log(std::expm1(a - b));
}

// log(erfc(x)). std::erfc underflows past x ≈ 26 and loses relative
// accuracy well before; from x = 3 on, the continued fraction
//   erfc(x) = exp(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
// (Abramowitz & Stegun 7.1.14), evaluated from its tail, keeps full
// relative precision in log space.
double LogErfc(double x) {
  if (x < 3.0) return std::log(std::erfc(x));
  double tail = x;
  for (int k = 80; k >= 1; --k) tail = x + (k / 2.0) / tail;
  return -x * x - 0.5 * std::log(std::numbers::pi) - std::log(tail);
}

// log(A_α) for an integer α >= 2 (Mironov et al. 2019, Section 3.3):
//   A_α = Σ_{i=0..α} C(α, i) q^i (1-q)^(α-i) exp((i² - i) / (2σ²)).
double LogAIntegerOrder(double q, double sigma, int alpha) {
  double log_a = -kInf;
  for (int i = 0; i <= alpha; ++i) {
    const double term = LogBinomial(alpha, i) + i * std::log(q) + (alpha - i) * std::log1p(-q) +
                        (double(i) * i - i) / (2 * sigma * sigma);
    log_a = LogAdd(log_a, term);
  }
  return log_a;
}

// log(A_α) for a fractional α > 1 (Mironov et al. 2019, Section 3.3): A_α
// split at z0 = σ² log(1/q - 1) + 1/2 into two series over i = 0, 1, ...
// whose terms carry the generalised binomial coefficient C(α, i) (negative
// for some i once i > α) and an erfc factor; summed until both terms are
// below e^-30, as the reference implementations stop. NaN when the
// alternating sums cannot be taken in log space.
double LogAFractionalOrder(double q, double sigma, double alpha) {
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  const double two_s2 = 2 * sigma * sigma, s_sqrt2 = sigma * std::sqrt(2.0);
  double log_a0 = -kInf, log_a1 = -kInf;
  double log_binom = 0;  // log|C(α, i)|, updated from i to i + 1.
  bool negative = false;
  constexpr int kMaxTerms = 100000;
  for (int i = 0; i < kMaxTerms; ++i) {
    const double j = alpha - i;
    const double log_s0 = log_binom + i * log_q + j * log_1mq + (double(i) * i - i) / two_s2 +
                          std::log(0.5) + LogErfc((i - z0) / s_sqrt2);
    const double log_s1 = log_binom + j * log_q + i * log_1mq + (j * j - j) / two_s2 +
                          std::log(0.5) + LogErfc((z0 - j) / s_sqrt2);
    if (negative) {
      log_a0 = LogSub(log_a0, log_s0);
      log_a1 = LogSub(log_a1, log_s1);
    } else {
      log_a0 = LogAdd(log_a0, log_s0);
      log_a1 = LogAdd(log_a1, log_s1);
    }
    if (std::isnan(log_a0) || std::isnan(log_a1)) return log_a0 + log_a1;
    if (std::max(log_s0, log_s1) < -30) return LogAdd(log_a0, log_a1);
    // C(α, i + 1) = C(α, i) (α - i) / (i + 1).
    log_binom += std::log(std::abs(alpha - i)) - std::log(i + 1.0);
    if (alpha - i < 0) negative = !negative;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

std::span<const double> DefaultOrders() { return kDefaultOrders; }

double SampledGaussianRdp(double q, double noise_multiplier, double order) {
  if (q == 0) return 0;
  if (noise_multiplier == 0 || std::isinf(order)) return kInf;
  if (q == 1) return order / (2 * noise_multiplier * noise_multiplier);
  const double log_a = order == std::floor(order)
                           ? LogAIntegerOrder(q, noise_multiplier, static_cast<int>(order))
                           : LogAFractionalOrder(q, noise_multiplier, order);
  // A_α >= 1 in exact arithmetic; a NaN means the series failed: +inf
  // rules the order out instead of under-reporting ε.
  if (std::isnan(log_a)) return kInf;
  return std::max(0.0, log_a) / (order - 1);
}

StatusOr<PrivacySpent> EpsilonFromRdp(std::span<const double> orders, std::span<const double> rdp,
                                      double delta) {
  if (orders.empty() || orders.size() != rdp.size()) {
    return InvalidArgumentError("privacy accounting: " + std::to_string(orders.size()) +
                                " orders and " + std::to_string(rdp.size()) + " RDP values");
  }
  if (!(delta > 0 && delta < 1)) {
    return InvalidArgumentError("privacy accounting: delta must be in (0, 1), got " +
                                fmt::format("{}", delta));
  }
  PrivacySpent best{kInf, 0};
  for (size_t k = 0; k < orders.size(); ++k) {
    const double a = orders[k];
    if (!(a > 1) || std::isinf(a)) {
      return InvalidArgumentError("privacy accounting: order " + fmt::format("{}", a) +
                                  " is not a finite number above 1");
    }
    if (std::isnan(rdp[k]) || std::isinf(rdp[k])) continue;
    const double eps = rdp[k] + std::log1p(-1 / a) - (std::log(delta) + std::log(a)) / (a - 1);
    if (eps < best.epsilon) best = {eps, a};
  }
  // The bound can fall below 0 for a tiny RDP and a large delta (sigma 20,
  // q 1, delta 0.5: -0.69); no mechanism is better than (0, delta)-DP, and
  // status and report read a negative epsilon as "no privacy".
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

RdpAccountant::RdpAccountant(std::span<const double> orders)
    : orders_(orders.begin(), orders.end()), rdp_(orders.size(), 0.0) {}

Status RdpAccountant::Compose(double q, double noise_multiplier, uint64_t steps) {
  if (!(q >= 0 && q <= 1)) {
    return InvalidArgumentError("privacy accounting: sampling rate " + fmt::format("{}", q) +
                                " is not in [0, 1]");
  }
  if (!(noise_multiplier > 0) || std::isinf(noise_multiplier)) {
    return InvalidArgumentError("privacy accounting: noise multiplier " +
                                fmt::format("{}", noise_multiplier) + " is not finite and > 0");
  }
  if (steps == 0 || q == 0) return OkStatus();
  for (size_t k = 0; k < orders_.size(); ++k) {
    rdp_[k] += static_cast<double>(steps) * SampledGaussianRdp(q, noise_multiplier, orders_[k]);
  }
  return OkStatus();
}

Status RdpAccountant::AddRdp(std::span<const double> rdp, uint64_t steps) {
  if (rdp.size() != orders_.size()) {
    return InvalidArgumentError("privacy accounting: " + std::to_string(rdp.size()) +
                                " RDP values for " + std::to_string(orders_.size()) + " orders");
  }
  for (double r : rdp) {
    if (!(r >= 0)) {
      return InvalidArgumentError("privacy accounting: RDP value " + fmt::format("{}", r) +
                                  " is not >= 0");
    }
  }
  if (steps == 0) return OkStatus();  // 0 x inf would be NaN.
  for (size_t k = 0; k < orders_.size(); ++k) rdp_[k] += static_cast<double>(steps) * rdp[k];
  return OkStatus();
}

StatusOr<PrivacySpent> RdpAccountant::Spent(double delta) const {
  return EpsilonFromRdp(orders_, rdp_, delta);
}

}  // namespace cohort::privacy
