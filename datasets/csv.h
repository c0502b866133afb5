// CSV datasets: one sample per line, a label column and numeric features.
#ifndef COHORT_DATASETS_CSV_H_
#define COHORT_DATASETS_CSV_H_

#include <string>

#include "common/status.h"
#include "datasets/dataset.h"

namespace cohort::datasets {

struct CsvOptions {
  int label_column = 0;      // Index of the label column.
  uint32_t num_classes = 0;  // 0: max label + 1.
  float scale = 1.0f;        // Multiplies every feature.
};

// A first line that does not parse as numbers is taken as a header. Every
// other line must have the same number of columns, an integer label >= 0 and
// finite numbers; errors name the file, line and column.
StatusOr<Dataset> ReadCsv(const std::string& path, const CsvOptions& options = {});

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_CSV_H_
