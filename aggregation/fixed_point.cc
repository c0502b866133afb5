#include "aggregation/fixed_point.h"

#include <algorithm>
#include <cmath>

namespace cohort::aggregation {

StatusOr<FixedPoint> ChooseFixedPoint(float clip, double max_total_weight, uint32_t max_clients) {
  if (!std::isfinite(clip) || clip <= 0)
    return InvalidArgumentError("fixed point: clip must be > 0");
  if (!std::isfinite(max_total_weight) || max_total_weight <= 0) {
    return InvalidArgumentError("fixed point: total weight must be > 0");
  }
  // Each encoding may round up by one unit, hence the `max_clients` slack.
  const double room = 2147483647.0 - max_clients;
  const double scale = std::floor(room / (double{clip} * max_total_weight));
  if (!(scale >= 1)) {
    return InvalidArgumentError("fixed point: " + std::to_string(max_total_weight) +
                                " total weight x clip " + std::to_string(clip) +
                                " overflows 32 bits; lower the clip or the weights");
  }
  return FixedPoint{clip, scale};
}

void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out) {
  const double factor = weight * fp.scale;
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = std::clamp(static_cast<double>(values[i]), -double{fp.clip}, double{fp.clip});
    const double x = v * factor;
    const double lo = std::floor(x);
    const double q = lo + (rng.UniformDouble() < x - lo ? 1.0 : 0.0);
    out[i] = static_cast<uint32_t>(static_cast<int64_t>(q));
  }
}

void DecodeFixedPoint(std::span<const uint32_t> sum, double total_weight, const FixedPoint& fp,
                      std::span<float> out) {
  const double inv = 1.0 / (fp.scale * total_weight);
  for (size_t i = 0; i < sum.size(); ++i) {
    out[i] = static_cast<float>(static_cast<int32_t>(sum[i]) * inv);
  }
}

}  // namespace cohort::aggregation
