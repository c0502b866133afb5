// datasets::ReadShard on the input written to a file.
//
// Input: one flag byte, then the file. With flag bit 0 set, the harness
// first rewrites the three CRC-32 fields to match the bytes they cover, so
// the fuzzer gets past the checksums to the size and value checks.
// Checks that an accepted shard is a valid dataset whose file size is the
// one the header promises, and that WriteShard + ReadShard give it back.
#include <cmath>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "datasets/shard.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/temp_file.h"

namespace cohort::fuzz {
namespace {

void PutU32At(std::string& file, size_t offset, uint32_t v) { std::memcpy(&file[offset], &v, 4); }

uint32_t CrcOf(const std::string& file, uint64_t begin, uint64_t size) {
  if (begin > file.size()) return 0;
  size = std::min<uint64_t>(size, file.size() - begin);
  return Crc32({reinterpret_cast<const uint8_t*>(file.data()) + begin, size});
}

// Makes the checksums agree with the bytes, as far as the header's sizes
// fit the file.
void FixChecksums(std::string& file) {
  if (file.size() < datasets::kShardHeaderBytes) return;
  const auto* h = reinterpret_cast<const uint8_t*>(file.data());
  const uint64_t n = GetU64(h + 16);
  const uint64_t width = GetU32(h + 12) == 1 ? 1 : 4;
  const uint64_t features = GetU32(h + 24);
  const uint64_t labels_begin = datasets::kShardHeaderBytes;
  if (n <= file.size()) {
    const uint64_t labels_end = labels_begin + n * 4;
    PutU32At(file, 32, CrcOf(file, labels_begin, n * 4));
    if (features <= file.size()) PutU32At(file, 36, CrcOf(file, labels_end, n * features * width));
  }
  PutU32At(file, 40, CrcOf(file, 0, 40));
}

void Run(FuzzInput& in) {
  static TempFile file(".shard");
  static TempFile copy(".shard");
  const uint8_t flags = in.Byte();
  auto rest = in.Rest();
  std::string bytes(reinterpret_cast<const char*>(rest.data()), rest.size());
  if ((flags & 1) != 0) FixChecksums(bytes);
  file.Write(bytes);

  StatusOr<datasets::Dataset> data = datasets::ReadShard(file.path());
  if (!data.ok()) {
    FUZZ_CHECK(data.status().message().find(file.path()) != std::string::npos,
               "the error must name the file: " + data.status().ToString());
    return;
  }
  FUZZ_CHECK(datasets::Validate(*data, "shard").ok(), "accepted an invalid dataset");
  const uint64_t width = GetU32(reinterpret_cast<const uint8_t*>(bytes.data()) + 12) == 1 ? 1 : 4;
  FUZZ_CHECK(bytes.size() ==
                 datasets::kShardHeaderBytes + data->size() * 4 + data->features.size() * width,
             "file size differs from what the header promises");
  for (float v : data->features) FUZZ_CHECK(std::isfinite(v), "non-finite feature");

  const auto encoding =
      width == 1 ? datasets::FeatureEncoding::kUint8 : datasets::FeatureEncoding::kFloat32;
  FUZZ_CHECK(datasets::WriteShard(*data, copy.path(), encoding).ok(), "rewrite failed");
  StatusOr<datasets::Dataset> again = datasets::ReadShard(copy.path());
  FUZZ_CHECK(again.ok(), "rewritten shard must read: " + again.status().ToString());
  FUZZ_CHECK(again->num_features == data->num_features && again->num_classes == data->num_classes &&
                 again->labels == data->labels && again->features == data->features,
             "shard changed in the round trip");
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
