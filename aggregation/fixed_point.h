// Fixed-point encoding of weighted updates for secure aggregation: sums are
// taken mod 2^32, so floats become integers first.
//
// encode(v, w) = stochastic_round(clip(v, +-clip) * w * scale) mod 2^32
// decode(sum)  = int32(sum) / (scale * total_weight)
//
// `scale` is chosen once per round so that the sum of every encoding fits in
// an int32: total_weight * clip * scale + clients < 2^31.
#ifndef COHORT_AGGREGATION_FIXED_POINT_H_
#define COHORT_AGGREGATION_FIXED_POINT_H_

#include <cstdint>
#include <optional>
#include <span>

#include "common/rng.h"
#include "common/status.h"

namespace cohort::aggregation {

struct FixedPoint {
  float clip = 1.0f;
  double scale = 0;
};

// kInvalidArgument when the bound cannot hold (clip or weights too large for
// even scale 1), so a misconfigured run fails at start-up, not by wrapping.
StatusOr<FixedPoint> ChooseFixedPoint(float clip, double max_total_weight, uint32_t max_clients);

// `rng` drives the stochastic rounding only; it must not be the mask PRG.
void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out);

// EncodeFixedPoint of (after - before) followed by `tail`, into `out`
// (after.size() + tail.size() words), without a float copy of the
// difference: the same words as encoding the concatenation. False when a
// difference is NaN or Inf (`out` is then meaningless); `tail` must be
// finite.
[[nodiscard]] bool EncodeDelta(std::span<const float> after, std::span<const float> before,
                               std::span<const float> tail, double weight, const FixedPoint& fp,
                               Rng& rng, std::span<uint32_t> out);

// L2 norm bounding (secagg.l2_clip), before encoding: writes
// delta = after - before (float, as EncodeDelta takes it) scaled by
// min(1, bound / ||delta||) into `out` (after.size() floats), so ||out|| <=
// bound to float rounding. Returns ||delta|| before scaling, computed in
// double; NaN or Inf when a difference is not finite (`out` is then
// meaningless). `bound` > 0.
double BoundL2Norm(std::span<const float> after, std::span<const float> before, float bound,
                   std::span<float> out);

namespace internal {
// EncodeFixedPoint with the AVX2 kernels (encoding and rounding bits) on or
// off (tests: both must agree).
// `avx2` on a CPU without AVX2 is undefined behaviour.
void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out, bool avx2);
}  // namespace internal

void DecodeFixedPoint(std::span<const uint32_t> sum, double total_weight, const FixedPoint& fp,
                      std::span<float> out);

// Training metrics travel inside a secure round's masked vector, after the
// model delta, so the coordinator learns only their weighted means. Each is
// clamped to a range (loss [0, kMaxSecureLoss], accuracy [0, 1], seconds
// [0, kMaxSecureSeconds]) and mapped onto [0, clip] like any coordinate.
inline constexpr size_t kSecureMetricSlots = 3;
inline constexpr double kMaxSecureLoss = 100;
inline constexpr double kMaxSecureSeconds = 1e5;
struct SecureMetrics {
  double loss = 0, accuracy = 0, seconds = 0;
};
// `slots` has kSecureMetricSlots values.
void MetricsToSlots(const SecureMetrics& metrics, float clip, std::span<float> slots);
// The inverse on decoded (weighted-mean) slots; NaN in, NaN out.
SecureMetrics SlotsToMetrics(std::span<const float> slots, float clip);

// Federated evaluation in a secure round (rounds.federated_eval_every):
// three more slots after the training metrics. The masked mean weighs each
// client by its training samples n, but the evaluation is to be weighed by
// its test samples m, so a client sends r = min(m / n, kMaxEvalRatio) /
// kMaxEvalRatio, r·loss and r·accuracy (loss clamped to [0,
// kMaxSecureLoss]): the means of the last two over the first are the
// test-sample-weighted means. A client with more than kMaxEvalRatio times as
// many test as training samples counts as kMaxEvalRatio times; one that
// did not evaluate sends zeros.
inline constexpr size_t kSecureEvalSlots = 3;
inline constexpr double kMaxEvalRatio = 16;
struct SecureEval {
  double loss = 0, accuracy = 0;
  double samples = 0;  // Σ m over the accepted inputs (to the fixed point's precision).
};
// `slots` has kSecureEvalSlots values; `test_samples` 0: not evaluated.
void EvalToSlots(uint64_t test_samples, uint64_t train_samples, double loss, double accuracy,
                 float clip, std::span<float> slots);
// The inverse on decoded (weighted-mean) slots, `weight` the accepted
// inputs' Σ n; nullopt when no accepted client evaluated.
std::optional<SecureEval> SlotsToEval(std::span<const float> slots, float clip, double weight);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_FIXED_POINT_H_
