// The privacy accountant: Rényi differential privacy (RDP) of the sampled
// Gaussian mechanism, composed over steps and converted to (ε, δ).
//
// The mechanism (Mironov, Talwar, Zhang 2019, "Rényi Differential Privacy of
// the Sampled Gaussian Mechanism", arXiv:1908.10530): each step includes
// every record (a client, in DP-FedAvg) independently with probability q
// (Poisson sampling), sums the included records' contributions clipped to
// L2 norm C, and adds N(0, σ²C²) to every coordinate; σ is the noise
// multiplier. Adjacent inputs differ by adding or removing one record. Its
// RDP at order α is log(A_α) / (α - 1) (Section 3.3), with A_α a finite
// binomial sum for integer α and a convergent series of erfc terms for
// fractional α, both evaluated in log space as Opacus and TF Privacy do.
// RDP composes by addition, per order, over steps and over mechanisms of
// different q and σ.
//
// The conversion to (ε, δ) is the one Opacus's get_privacy_spent uses today:
// Balle et al. 2020 ("Hypothesis Testing Interpretations and Rényi
// Differential Privacy", arXiv:1905.09982, Theorem 21; the same bound as
// Canonne, Kamath, Steinke 2020, Proposition 12):
//   ε = RDP(α) + log((α - 1) / α) - (log δ + log α) / (α - 1),
// minimised over the orders. It is tighter than Mironov 2017's
// ε = RDP(α) + log(1/δ) / (α - 1).
//
// Pure functions of their arguments: no secret, no clock, no randomness,
// and the same result on every call. Thread-compatible.
#ifndef COHORT_PRIVACY_RDP_ACCOUNTANT_H_
#define COHORT_PRIVACY_RDP_ACCOUNTANT_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace cohort::privacy {

// Opacus's DEFAULT_ALPHAS: 1.1, 1.2, ..., 10.9 (1 + x/10 for x in 1..99) and
// the integers 12..63; 151 orders, ascending.
std::span<const double> DefaultOrders();

// RDP at `order` (> 1) of one step of the sampled Gaussian mechanism with
// sampling rate `q` in [0, 1] and noise multiplier `noise_multiplier` >= 0:
// 0 when q is 0, +inf when the noise multiplier is 0, order / (2σ²) when q
// is 1. +inf where the series cannot be evaluated (a safe answer: the order
// is then never the one chosen). The caller checks the ranges (the
// accountant below does).
double SampledGaussianRdp(double q, double noise_multiplier, double order);

struct PrivacySpent {
  double epsilon = 0;
  double order = 0;  // The order that gave the smallest ε.
};

// The smallest ε over `orders` for the RDP values `rdp` (one per order) at
// `delta` (Balle et al. 2020, above). kInvalidArgument when the spans differ
// in length or are empty, an order is not > 1, or delta is not in (0, 1).
// ε is +inf when every RDP value is +inf, and never below 0 (the bound
// goes negative for a tiny RDP and a large delta; it is clamped at 0).
StatusOr<PrivacySpent> EpsilonFromRdp(std::span<const double> orders, std::span<const double> rdp,
                                      double delta);

// Composes runs of the sampled Gaussian mechanism: the RDP at each order is
// the sum of the steps'. Copyable value type; not thread-safe.
class RdpAccountant {
 public:
  // `orders` must each be > 1 (checked by Compose's caller's validation;
  // EpsilonFromRdp refuses others).
  explicit RdpAccountant(std::span<const double> orders = DefaultOrders());

  // Adds `steps` steps with sampling rate `q` and noise multiplier
  // `noise_multiplier`. kInvalidArgument, naming the value, for q outside
  // [0, 1] or a noise multiplier that is not finite and > 0; the state is
  // then unchanged.
  Status Compose(double q, double noise_multiplier, uint64_t steps = 1);
  // Adds `steps` times `rdp`, one value per order of orders(), computed by
  // another mechanism's analysis (privacy/rdp_wor.h,
  // privacy/skellam.h). kInvalidArgument for
  // a length mismatch or a value that is NaN or below 0 (+inf is allowed:
  // no privacy at that order); the state is then unchanged.
  Status AddRdp(std::span<const double> rdp, uint64_t steps = 1);
  // ε at `delta` for everything composed so far.
  StatusOr<PrivacySpent> Spent(double delta) const;

  std::span<const double> orders() const { return orders_; }
  std::span<const double> rdp() const { return rdp_; }

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

}  // namespace cohort::privacy

#endif  // COHORT_PRIVACY_RDP_ACCOUNTANT_H_
