// Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021,
// "Differentially Private Learning with Adaptive Clipping", Algorithm 1
// with the geometric update): the clip norm C follows a target quantile γ
// of the cohort's update norms, estimated from one bit per client. Under
// central DP the coordinator takes the bits and noises their sum; under
// distributed DP (privacy/skellam.h ChooseClipCountParams) each client
// sends its bit with its Skellam noise share in one word of the masked
// vector, and the same rule runs on the unmasked noisy count.
//
// Each round, every cohort member's bit b_i = [‖Δ_i‖ <= C] is summed, the
// coordinator adds N(0, σ_b²) to the sum, b̄ = noisy sum / m with m the
// round's fixed cohort size (a dropped client counts as b = 0, as it counts
// as a zero update in the mean), and the next round clips at
//   C ← C · exp(−η_C (b̄ − γ)).
// Privacy: the bits are released (noised) beside the update sum, so the
// pair is one Gaussian mechanism on the vector (Σ clip(Δ_i) / (z_Δ C),
// Σ b_i / σ_b). Replacing one client moves it by at most
// (2C / (z_Δ C), 1 / σ_b) in each part, so its squared sensitivity in noise
// units is 4 / z_Δ² + 1 / σ_b² = 4 (z_Δ^-2 + (2σ_b)^-2). With
//   z_Δ = (z^-2 − (2σ_b)^-2)^-1/2
// that is 4 / z², exactly what the update alone had at noise multiplier z:
// the accountant keeps charging the configured privacy.noise_multiplier
// (coordinator/strategy_dp.h, replace-one, z / 2), and the update's noise is
// z_Δ C, slightly more than z C. Under add/remove adjacency the same
// identity holds with b − 1/2 (the paper's Section 3).
//
// Pure functions; thread-compatible.
#ifndef COHORT_COORDINATOR_ADAPTIVE_CLIP_H_
#define COHORT_COORDINATOR_ADAPTIVE_CLIP_H_

#include <cstdint>
#include <span>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::coordinator {

// The smallest clip norm the update rule goes to (privacy.clip_norm's
// lower limit): a run of all-unclipped rounds shrinks C geometrically.
inline constexpr double kMinAdaptiveClip = 1e-9;

// z_Δ = (z^-2 − (2 σ_b)^-2)^-1/2. kInvalidArgument, naming both fields,
// unless z > 0 and 2 σ_b > z (the config validator refuses such configs).
StatusOr<double> AdaptiveUpdateNoiseMultiplier(double noise_multiplier, double count_stddev);

// The geometric update: clip · exp(−learning_rate (noisy_count / cohort −
// target_quantile)), clamped to [kMinAdaptiveClip, max_clip] (no upper
// bound when max_clip is 0: server.max_update_norm refuses an update longer
// than it, so C must not pass it). `cohort` > 0.
double NextClipNorm(double clip, double noisy_count, uint32_t cohort,
                    const config::AdaptiveClipConfig& adaptive, double max_clip = 0);

// b_i: whether `update`'s L2 norm (summed in double) is at most `clip`.
bool IsUnclipped(std::span<const float> update, double clip);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_ADAPTIVE_CLIP_H_
