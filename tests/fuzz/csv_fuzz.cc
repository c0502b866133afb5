// datasets::ReadCsv on the input written to a file.
//
// Input: the label column (a signed byte), num_classes (one byte: 0 = from
// the data), a scale selector (1 or 1/255, the values `cohort partition`
// uses), then the file. Checks that an accepted file is a valid dataset of
// finite features with the label column removed.
#include <algorithm>
#include <cmath>
#include <string>

#include "datasets/csv.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/temp_file.h"

namespace cohort::fuzz {
namespace {

void Run(FuzzInput& in) {
  static TempFile file(".csv");
  datasets::CsvOptions options;
  options.label_column = static_cast<int8_t>(in.Byte());
  options.num_classes = in.Byte();
  options.scale = in.Bool() ? 1.0f / 255 : 1.0f;
  file.Write(in.Rest());

  StatusOr<datasets::Dataset> data = datasets::ReadCsv(file.path(), options);
  if (!data.ok()) {
    FUZZ_CHECK(data.status().message().find(file.path()) != std::string::npos,
               "the error must name the file: " + data.status().ToString());
    return;
  }
  FUZZ_CHECK(datasets::Validate(*data, "csv").ok(), "accepted an invalid dataset");
  FUZZ_CHECK(data->size() > 0, "accepted a file without samples");
  // A requested count below 2 is raised to 2 (the models need two classes).
  FUZZ_CHECK(options.num_classes == 0 || data->num_classes == std::max(options.num_classes, 2u),
             "num_classes");
  for (float v : data->features) FUZZ_CHECK(std::isfinite(v), "non-finite feature");
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
