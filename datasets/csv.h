// CSV datasets: one sample per line, a label column and numeric features.
//
// The format (`cohort partition --help` says the same):
// - fields are separated by commas; a line whose only field holds ';', a tab
//   or '|' is refused, naming the delimiter it seems to use; no quoting;
// - the first line is a header, and skipped, when one of its feature fields
//   is not a number, or when its label is not a number but the label on the
//   next line is;
// - every other line has as many fields as the first data line;
// - the label (column `label_column`, 0-based) is a class index (0, 1, ...)
//   or a class name; names are mapped to indices in sorted (byte) order, so
//   the same names always get the same indices; a file's labels are all
//   indices or all names;
// - every other field is a feature: a finite decimal number ("1", "-0.5",
//   "2.5e-3"), spaces around it allowed.
// Errors name the file, the line and, where one field is wrong, its column
// (1-based).
#ifndef COHORT_DATASETS_CSV_H_
#define COHORT_DATASETS_CSV_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"
#include "datasets/dataset.h"

namespace cohort::datasets {

// The most distinct class names one file may hold.
inline constexpr size_t kMaxCsvClassNames = 65536;

struct CsvOptions {
  int label_column = 0;      // Index of the label column.
  uint32_t num_classes = 0;  // 0: max label + 1, or the number of names.
  float scale = 1.0f;        // Multiplies every feature.
  // Names to map labels with (class i is class_names[i]): a test file gets
  // its training file's, and a label not among them is an error naming its
  // line. Empty: indices, or names found in this file.
  std::vector<std::string> class_names;
  // Where progress on a file of at least `progress_min_bytes` goes (the
  // CLI's stderr; common/progress.h); null: none.
  FILE* progress = nullptr;
  uint64_t progress_min_bytes = uint64_t{50} << 20;
};

struct CsvTable {
  Dataset data;
  // Class i's name when the labels were names; empty when they were indices.
  std::vector<std::string> class_names;
};

StatusOr<CsvTable> ReadCsvTable(const std::string& path, const CsvOptions& options = {});

// ReadCsvTable's data alone.
StatusOr<Dataset> ReadCsv(const std::string& path, const CsvOptions& options = {});

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_CSV_H_
