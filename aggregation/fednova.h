// FedNova's client-side arithmetic (Wang et al. 2020, "Tackling the
// Objective Inconsistency Problem in Heterogeneous Federated Optimization",
// Section 4 and the authors' distoptim/FedNova.py): the normaliser a of a
// client's local steps, and the slot that carries it inside a secure
// round's masked vector.
//
// A client that took tau steps of SGD moved by Δ = -η Σ_t c_t g_t; the
// normaliser is a = Σ_t c_t, the sum of its steps' weights:
//   plain SGD:              c_t = 1,                    a = tau
//   heavy-ball momentum ρ:  c_t = Σ_{j<=t} ρ^(t-j)      a = (tau - ρ (1 - ρ^tau) / (1 - ρ)) / (1 -
//   ρ)
// (PyTorch's SGD without dampening or Nesterov: the buffer starts at the
// first gradient). Weight decay is part of the gradient and changes
// nothing. The client sends d = Δ / a weighted by n; the coordinator
// scales the weighted mean of the d by tau_eff = Σ n a / Σ n
// (coordinator/strategy_fednova.h).
#ifndef COHORT_AGGREGATION_FEDNOVA_H_
#define COHORT_AGGREGATION_FEDNOVA_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace cohort::aggregation {

// The normaliser of `steps` SGD steps with `momentum` in [0, 1); 0 for 0
// steps. Computed in double.
double FedNovaNorm(uint64_t steps, double momentum);

// The most steps an honest client of `samples` takes: `epochs` x
// ceil(samples / batch_size), the native trainer's (a client may take
// fewer). The coordinator refuses more and a client's session does not
// send more (model.external runs count their own).
inline uint64_t FedNovaMaxSteps(uint32_t epochs, uint32_t batch_size, uint64_t samples) {
  const uint64_t batch = batch_size == 0 ? 1 : batch_size;
  return uint64_t{epochs} * ((samples + batch - 1) / batch);
}

// The update a FedNova client sends: out = (after - before) / norm, each
// difference taken in float (as a plain delta is), divided in double and
// rounded to float once. All three spans have one size; `norm` > 0. False
// when a value of `out` is not finite (`out` is still written).
bool NormaliseDelta(std::span<const float> after, std::span<const float> before, double norm,
                    std::span<float> out);

// The largest normaliser a secure round carries: a client's a is clamped to
// [0, kMaxFedNovaNorm] and mapped onto [0, clip] like a metric (the sum's
// fixed-point grid then resolves tau_eff to about kMaxFedNovaNorm / 2^31 per
// client). A plain round refuses an update whose a is outside [1, this].
inline constexpr double kMaxFedNovaNorm = 1e5;
inline constexpr size_t kSecureFedNovaSlots = 1;

// The slot of normaliser `norm` (clamped; NaN: 0).
float FedNovaToSlot(double norm, float clip);
// The inverse on a decoded (weighted-mean) slot: tau_eff = Σ n a / Σ n.
double SlotToTauEff(float slot, float clip);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_FEDNOVA_H_
