// IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed.
#ifndef COHORT_DATASETS_IDX_H_
#define COHORT_DATASETS_IDX_H_

#include <string>

#include "common/status.h"
#include "datasets/dataset.h"

namespace cohort::datasets {

// Reads an unsigned-byte image file (magic 0x00000803, any number of
// dimensions after the count) and a label file (magic 0x00000801). Pixels are
// scaled by 1/255. Errors name the file and the problem (bad magic, counts
// that differ, truncated data, labels >= num_classes).
StatusOr<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path,
                          uint32_t num_classes = 10);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_IDX_H_
