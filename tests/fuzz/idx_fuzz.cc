// datasets::ReadIdx on an image file and a label file cut from the input.
//
// Input: num_classes (one byte), the label file's length (16-bit little
// endian), the label file, then the image file. Either may be gzip (the
// reader decides by content). Checks that an accepted pair is a valid
// dataset with pixels in [0, 1].
#include <string>

#include "datasets/idx.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/temp_file.h"

namespace cohort::fuzz {
namespace {

void Run(FuzzInput& in) {
  static TempFile images(".idx3");
  static TempFile labels(".idx1");
  const uint32_t num_classes = in.Byte();
  labels.Write(in.LengthPrefixed());
  images.Write(in.Rest());

  StatusOr<datasets::Dataset> data = datasets::ReadIdx(images.path(), labels.path(), num_classes);
  if (!data.ok()) {
    const std::string& message = data.status().message();
    FUZZ_CHECK(message.find(images.path()) != std::string::npos ||
                   message.find(labels.path()) != std::string::npos,
               "the error must name a file: " + data.status().ToString());
    return;
  }
  FUZZ_CHECK(datasets::Validate(*data, "idx").ok(), "accepted an invalid dataset");
  FUZZ_CHECK(data->num_classes == num_classes, "num_classes");
  for (float v : data->features) FUZZ_CHECK(v >= 0.0f && v <= 1.0f, "pixel outside [0, 1]");
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
