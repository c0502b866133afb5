// RDP of the Gaussian mechanism under fixed-size sampling without
// replacement: the sampling the coordinator actually does (a cohort of m of
// the n available clients, every m-subset equally likely).
//
// The bound is Wang, Balle, Kasiviswanathan 2019 ("Subsampled Rényi
// Differential Privacy and Analytical Moments Accountant", arXiv:1808.00087,
// Theorem 27, the Gaussian-specific strengthening of their Theorem 9), as
// dp_accounting's `_compute_rdp_sample_wor_gaussian` evaluates it. For an
// integer order α >= 2 and q = m / n:
//   A = 1 + q² C(α,2) min(4 (e^{ε(2)} - 1), 2 e^{ε(2)})
//         + Σ_{j=3..α} q^j C(α,j) min(4 √(B(2⌊j/2⌋) B(2⌈j/2⌉)), 2 e^{(j-1) ε(j)}),
//   ε(j) = j / (2 z²),  B(l) = |Δ^l e^{(k-1) ε(k)}| at k = 0,
// and RDP(α) = log(A) / (α - 1); a fractional order interpolates log(A)
// linearly between the neighbouring integers (their Corollary 10). Above
// order 256 only the second argument of each min is used, as dp_accounting
// does there (a valid, looser bound).
//
// The neighbouring relation is REPLACE-ONE: the two datasets have the same
// size n (n is public) and differ in one record's value. `noise_multiplier`
// z is therefore the noise's standard deviation over the L2 distance by
// which replacing one record can move the sum, which is TWICE the clip norm
// when every record is clipped to a ball of radius C (u and u' can point in
// opposite directions). DP-FedAvg's noise σC thus has z = σ / 2 here
// (coordinator/strategy_dp.h). Mixing this with the add/remove Poisson
// analysis of rdp_accountant.h in one accountant composes two different
// adjacencies and is not meaningful; the coordinator uses this one only.
//
// The GENERAL bound of the same paper (Theorem 9) needs only the base
// mechanism's RDP curve ε(j) at the integer orders, and holds for any
// mechanism under replace-one adjacency; with ε(∞) = ∞ its factor
// min{2, (e^{ε(∞)} - 1)^j} is 2:
//   A = 1 + q² C(α,2) min(4 (e^{ε(2)} - 1), 2 e^{ε(2)})
//         + Σ_{j=3..α} q^j C(α,j) 2 e^{(j-1) ε(j)},
// RDP(α) = log(A) / (α - 1), fractional orders interpolated as above. It is
// an upper bound even at q = 1, where it lies above ε(α) (the caller may
// take the smaller: sampling never hurts). Distributed DP's released-model
// view (privacy/skellam.h) uses it with the Skellam mechanism's curve.
//
// Pure functions; thread-compatible.
#ifndef COHORT_PRIVACY_RDP_WOR_H_
#define COHORT_PRIVACY_RDP_WOR_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "privacy/rdp_accountant.h"

namespace cohort::privacy {

// RDP at each of `orders` (each > 1) of one step with sampling fraction `q`
// in [0, 1] and replace-one noise multiplier `noise_multiplier` >= 0: 0 when
// q is 0, +inf when the noise multiplier is 0 or an order is infinite,
// α / (2 z²) when q is 1. The caller checks the ranges.
std::vector<double> SampledWithoutReplacementGaussianRdp(double q, double noise_multiplier,
                                                         std::span<const double> orders);

// Theorem 9's bound at each of `orders` (each > 1) for a base mechanism
// whose RDP at integer order j >= 2 is `rdp_at(j)` (>= 0, +inf allowed),
// sampled at fraction `q` in [0, 1]: 0 when q is 0, +inf at an infinite
// order or where a needed ε(j) is +inf. The caller checks q.
std::vector<double> SampledWithoutReplacementRdp(double q, const std::function<double(int)>& rdp_at,
                                                 std::span<const double> orders);

// Adds `steps` steps of SampledWithoutReplacementGaussianRdp to `accountant`
// (at its orders). kInvalidArgument, naming the value, for q outside [0, 1]
// or a noise multiplier that is not finite and > 0; the accountant is then
// unchanged.
Status ComposeSampledWithoutReplacement(RdpAccountant& accountant, double q,
                                        double noise_multiplier, uint64_t steps = 1);

}  // namespace cohort::privacy

#endif  // COHORT_PRIVACY_RDP_WOR_H_
