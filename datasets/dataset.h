// An in-memory labelled dataset: row-major float32 features and int32 labels.
#ifndef COHORT_DATASETS_DATASET_H_
#define COHORT_DATASETS_DATASET_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace cohort::datasets {

struct Dataset {
  uint32_t num_features = 0;
  uint32_t num_classes = 0;
  std::vector<float> features;  // size() * num_features values.
  std::vector<int32_t> labels;  // Each in [0, num_classes).

  size_t size() const { return labels.size(); }
  std::span<const float> row(size_t i) const {
    return {features.data() + i * num_features, num_features};
  }
};

// The rows of `data` at `indices`, in that order.
Dataset Subset(const Dataset& data, std::span<const uint32_t> indices);

// Samples per class (num_classes entries).
std::vector<uint64_t> LabelCounts(const Dataset& data);

// Checks sizes and label range; names `source` in the error.
Status Validate(const Dataset& data, const std::string& source);

// OK when `path` is a regular file or a link to one; call it before opening
// a data file for reading. A FIFO would block the open until some writer
// came, and a device can stream without end, so such paths (and
// directories) are kInvalidArgument, naming the path and what it is;
// kNotFound when nothing is there.
Status CheckRegularFile(const std::string& path);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_DATASET_H_
