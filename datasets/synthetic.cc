#include "datasets/synthetic.h"

#include <vector>

#include "common/rng.h"

namespace cohort::datasets {

Dataset MakeSynthetic(const SyntheticOptions& o) {
  Rng rng(DeriveSeed(o.seed, 0x5717));
  std::vector<float> means(size_t{o.num_classes} * o.num_features);
  for (float& m : means) m = static_cast<float>(rng.Normal()) * o.separation;
  Dataset data;
  data.num_features = o.num_features;
  data.num_classes = o.num_classes;
  data.labels.resize(o.num_samples);
  data.features.resize(size_t{o.num_samples} * o.num_features);
  for (uint32_t i = 0; i < o.num_samples; ++i) {
    const auto y = static_cast<int32_t>(rng.UniformInt(o.num_classes));
    data.labels[i] = y;
    for (uint32_t f = 0; f < o.num_features; ++f) {
      data.features[size_t{i} * o.num_features + f] =
          means[size_t{static_cast<uint32_t>(y)} * o.num_features + f] +
          static_cast<float>(rng.Normal());
    }
  }
  return data;
}

}  // namespace cohort::datasets
