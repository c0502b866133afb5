#include "aggregation/secagg_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "aggregation/secagg_internal.h"

namespace cohort::aggregation {
namespace {

using secagg_internal::Str;

// log P[X = i] for X ~ Binomial(k, p).
double LogBinomialPmf(uint32_t k, uint32_t i, double p) {
  return std::lgamma(k + 1.0) - std::lgamma(i + 1.0) - std::lgamma(k - i + 1.0) + i * std::log(p) +
         (k - i) * std::log1p(-p);
}

double BinomialCdfBelow(uint32_t k, uint32_t t, double p) {  // P[X < t]
  if (p <= 0) return t > 0 ? 1.0 : 0.0;
  if (p >= 1) return t > k ? 1.0 : 0.0;
  double sum = 0;
  for (uint32_t i = 0; i < t && i <= k; ++i) sum += std::exp(LogBinomialPmf(k, i, p));
  return std::min(sum, 1.0);
}

}  // namespace

uint32_t MaxCorruptNeighbours(uint32_t n, uint32_t k, double corrupt) {
  const auto in_cohort = static_cast<uint32_t>(std::ceil(corrupt * n - 1e-9));
  if (k + 1 >= n || corrupt <= 0) return std::min(in_cohort, k);
  // Union bound over the n clients of P[more than c of k neighbours
  // corrupt], with the tail summed from the top (one pass, O(k), and no
  // cancellation in 1 - CDF).
  const double budget = std::ldexp(1.0, -20) / n;
  double tail = 0;  // P[X > c] for the c of the current step.
  uint32_t c = k;
  while (c > 0) {
    const double next = tail + std::exp(LogBinomialPmf(k, c, corrupt));  // P[X > c - 1]
    if (next > budget) break;
    tail = next;
    --c;
  }
  return std::min(c, in_cohort);
}

uint32_t SecureThreshold(uint32_t n, uint32_t k, double corrupt) {
  return (k + MaxCorruptNeighbours(n, k, corrupt)) / 2 + 1;
}

StatusOr<SecAggParams> ChooseSecAggParams(uint32_t n, double dropout, double corrupt, bool complete,
                                          size_t length) {
  // Two clients are a cohort only when neither is assumed to collude with
  // the coordinator (corrupt = 0 gives k = 1, t = 1): each sum then hides
  // both inputs from the coordinator, and a lone survivor is refused
  // (SignSurvivors: fewer than t neighbours left).
  if (n < 2) return InvalidArgumentError("secagg: need at least 2 clients");
  if (!(dropout >= 0 && dropout < 1) || !(corrupt >= 0 && corrupt < 0.5)) {
    return InvalidArgumentError("secagg: dropout must be in [0, 1) and corrupt in [0, 0.5)");
  }
  SecAggParams p;
  p.n = n;
  p.length = length;
  p.k = n - 1;
  if (!complete && n > 16) {
    // Union bounds over the clients. Security (the corrupt neighbours of
    // one client exceed what t tolerates) has 2^-20 inside SecureThreshold;
    // an abort (too few neighbours survive) gets 2^-10: it costs one round,
    // not privacy.
    const double abort_budget = std::ldexp(1.0, -10) / n;
    for (uint32_t k = 4; k < n - 1; k += 2) {
      const uint32_t t = SecureThreshold(n, k, corrupt);
      if (t <= k && BinomialCdfBelow(k, t, 1.0 - dropout) <= abort_budget) {
        p.k = k;
        break;
      }
    }
  }
  p.t = SecureThreshold(n, p.k, corrupt);
  if (p.t > p.k) {
    return InvalidArgumentError("secagg: no threshold fits " + Str(n) + " clients with " +
                                fmt::format("{:g}", corrupt) + " of them corrupt");
  }
  return p;
}

Status CheckSecAggParams(uint32_t n, uint32_t k, uint32_t t, double corrupt) {
  if (n < 2 || k == 0 || k >= n || t == 0 || t > k || (k + 1 < n && k % 2 != 0)) {
    return FailedPreconditionError("secagg setup: n=" + Str(n) + ", k=" + Str(k) + ", t=" + Str(t) +
                                   " do not describe a neighbour graph and threshold");
  }
  const uint32_t needed = SecureThreshold(n, k, corrupt);
  if (t < needed) {
    return FailedPreconditionError(
        "secagg setup: threshold t=" + Str(t) + " is weaker than this client's t=" + Str(needed) +
        " for n=" + Str(n) + ", k=" + Str(k) + " with up to " +
        Str(MaxCorruptNeighbours(n, k, corrupt)) + " corrupt neighbours (corrupt fraction " +
        fmt::format("{:g}", corrupt) + "): two halves of the neighbours could each reach t");
  }
  return OkStatus();
}

}  // namespace cohort::aggregation
