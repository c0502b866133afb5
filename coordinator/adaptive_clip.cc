#include "coordinator/adaptive_clip.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace cohort::coordinator {

StatusOr<double> AdaptiveUpdateNoiseMultiplier(double noise_multiplier, double count_stddev) {
  const double z = noise_multiplier, two_sb = 2 * count_stddev;
  if (!(z > 0) || std::isinf(z) || !(two_sb > z) || std::isinf(two_sb)) {
    return InvalidArgumentError(
        "privacy.adaptive_clip.clipped_count_stddev " + fmt::format("{}", count_stddev) +
        " must be finite and above privacy.noise_multiplier " + fmt::format("{}", z) + " / 2");
  }
  return 1 / std::sqrt(1 / (z * z) - 1 / (two_sb * two_sb));
}

double NextClipNorm(double clip, double noisy_count, uint32_t cohort,
                    const config::AdaptiveClipConfig& adaptive, double max_clip) {
  const double mean_bit = noisy_count / static_cast<double>(cohort);
  double next =
      clip * std::exp(-adaptive.learning_rate() * (mean_bit - adaptive.target_quantile()));
  if (max_clip > 0) next = std::min(next, max_clip);
  return std::max(next, kMinAdaptiveClip);
}

bool IsUnclipped(std::span<const float> update, double clip) {
  double sum = 0;
  for (float v : update) sum += double(v) * v;
  return std::sqrt(sum) <= clip;
}

}  // namespace cohort::coordinator
