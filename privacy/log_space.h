// Arithmetic on logarithms, shared by the accountants (privacy/): their sums
// have terms too large or too small for a double.
#ifndef COHORT_PRIVACY_LOG_SPACE_H_
#define COHORT_PRIVACY_LOG_SPACE_H_

#include <algorithm>
#include <cmath>
#include <limits>

namespace cohort::privacy {

// log(exp(a) + exp(b)) without overflow; -inf is log(0).
inline double LogAdd(double a, double b) {
  const double hi = std::max(a, b), lo = std::min(a, b);
  if (lo == -std::numeric_limits<double>::infinity()) return hi;
  return hi + std::log1p(std::exp(lo - hi));
}

// log of the binomial coefficient C(n, k), n >= k >= 0.
inline double LogBinomial(double n, double k) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0);
}

}  // namespace cohort::privacy

#endif  // COHORT_PRIVACY_LOG_SPACE_H_
