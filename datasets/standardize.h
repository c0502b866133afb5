// Per-feature standardization for `cohort partition --standardize`:
// x' = (x - mean) / std, with each feature's mean and (population) standard
// deviation from the training set only, applied the same way to every
// client's rows and to the test set, and written beside the shards so that
// new data can be scaled the same way.
#ifndef COHORT_DATASETS_STANDARDIZE_H_
#define COHORT_DATASETS_STANDARDIZE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "datasets/dataset.h"

namespace cohort::datasets {

struct Standardization {
  // Per feature, as applied. A feature whose std is 0 (one value in every
  // row) is left as it is: mean 0 and std 1 here, and listed in `constant`.
  std::vector<double> mean, std;
  std::vector<uint32_t> constant;  // Such features, ascending.
  uint64_t rows = 0;               // Training rows the figures came from.
};

// The figures of `train` (which must have at least one row).
Standardization FitStandardization(const Dataset& train);

// Scales `data`'s features in place; kInvalidArgument when its feature
// count differs from the fitted one.
Status ApplyStandardization(const Standardization& s, Dataset& data);

// Writes `path` as CSV: a header "feature,column,mean,std", then one line per
// feature with its 0-based index among the features, its 0-based column in
// the input file (the label at `label_column` skipped), and the mean and std
// applied, exact (%.17g).
Status WriteStandardization(const Standardization& s, int label_column, const std::string& path);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_STANDARDIZE_H_
