// Seeded synthetic classification data for tests and benchmarks: one
// Gaussian blob per class, so small models learn it in a few steps.
#ifndef COHORT_DATASETS_SYNTHETIC_H_
#define COHORT_DATASETS_SYNTHETIC_H_

#include <cstdint>

#include "datasets/dataset.h"

namespace cohort::datasets {

struct SyntheticOptions {
  uint32_t num_samples = 1000;
  uint32_t num_features = 20;
  uint32_t num_classes = 4;
  float separation = 2.0f;  // Distance scale between class means.
  uint64_t seed = 0;
};

// Same options, same bytes, on every platform.
Dataset MakeSynthetic(const SyntheticOptions& options);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_SYNTHETIC_H_
