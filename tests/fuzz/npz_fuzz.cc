// train::ReadNpz and LoadInitialModel (`cohort coordinator --initial-model`)
// on the input written to a file.
//
// Input: one flag byte, then the bytes. With flag bit 0 set, the bytes are
// one .npy entry, stored in a zip as "w.npy" (so the fuzzer works on the
// .npy header and data); else they are the whole file (libzip's parser).
// Checks that an accepted archive's arrays hold what their shapes say, that
// a loaded model has the size asked for and only finite values, and that
// every error names the file. Seed corpus (corpus/npz, not written by
// make_corpus): tests/data's two .npz files, and numpy.save's .npy of each
// dtype kind, behind their flag and size bytes.
#include <zip.h>

#include <cmath>
#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/temp_file.h"
#include "train/npz.h"

namespace cohort::fuzz {
namespace {

// `npy` as the only entry of a zip at `path`.
void WriteZip(const std::string& path, const std::string& npy) {
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  FUZZ_CHECK(z != nullptr, "cannot create the zip");
  zip_source_t* src = zip_source_buffer(z, npy.data(), npy.size(), 0);
  zip_file_add(z, "w.npy", src, ZIP_FL_OVERWRITE);
  FUZZ_CHECK(zip_close(z) == 0, "cannot write the zip");
}

void Run(FuzzInput& in) {
  static TempFile file(".npz");
  const uint8_t flags = in.Byte();
  const uint8_t size = in.Byte();
  auto rest = in.Rest();
  const std::string bytes(reinterpret_cast<const char*>(rest.data()), rest.size());
  if ((flags & 1) != 0) {
    WriteZip(file.path(), bytes);
  } else {
    file.Write(bytes);
  }
  constexpr uint64_t kMax = 1 << 16;
  StatusOr<std::vector<train::NpyArray>> arrays = train::ReadNpz(file.path(), kMax);
  if (!arrays.ok()) {
    FUZZ_CHECK(arrays.status().message().find(file.path()) != std::string::npos,
               "the error must name the file: " + arrays.status().ToString());
  } else {
    uint64_t total = 0;
    for (const train::NpyArray& a : *arrays) {
      uint64_t count = 1;
      for (uint64_t d : a.shape) count *= d;
      FUZZ_CHECK(count == a.values.size(), "an array holds other than its shape's count");
      total += count;
    }
    FUZZ_CHECK(total <= kMax, "more values than the cap");
  }
  config::ExternalModel model;
  model.set_num_params(1 + size % 16);
  StatusOr<std::vector<float>> flat = train::LoadInitialModel(file.path(), model);
  if (!flat.ok()) {
    FUZZ_CHECK(flat.status().message().find(file.path()) != std::string::npos,
               "the error must name the file: " + flat.status().ToString());
    return;
  }
  FUZZ_CHECK(flat->size() == model.num_params(), "a model of another size was accepted");
  for (float v : *flat) FUZZ_CHECK(std::isfinite(v), "a non-finite initial value");
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
