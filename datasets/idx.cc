#include "datasets/idx.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <new>
#include <vector>

#include "common/bytes.h"

namespace cohort::datasets {
namespace {

// The most data one IDX file may state: 4 GiB of bytes, 16 GiB as floats.
constexpr uint64_t kMaxIdxDataBytes = uint64_t{1} << 32;

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // Exactly the product of `dims` bytes.
};

// Reads up to `n` bytes; gzread reads gzip and plain files alike. Returns
// how many it read (fewer at the end of the data).
StatusOr<size_t> ReadUpTo(gzFile file, const std::string& path, uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const auto chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(file, out + done, chunk);
    if (got < 0) {
      int err = 0;
      return DataLossError(path + ": read failed: " + gzerror(file, &err));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

// The header is read first, and then exactly the bytes it states: a file
// (a gzip bomb, say) with more is refused at the first byte beyond them,
// never decompressed whole.
StatusOr<IdxArray> ReadIdxFile(const std::string& path, uint32_t expect_magic) {
  COHORT_RETURN_IF_ERROR(CheckRegularFile(path));
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return NotFoundError(path + ": cannot open");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(file, gzclose);
  uint8_t word[4];
  COHORT_ASSIGN_OR_RETURN(size_t got, ReadUpTo(file, path, word, 4));
  if (got < 4) return DataLossError(path + ": too short for an IDX header");
  const uint32_t magic = GetBigEndianU32(word);
  if (magic != expect_magic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x, expected 0x%08x", magic, expect_magic);
    return InvalidArgumentError(path + ": " + buf);
  }
  const uint32_t ndims = magic & 0xff;
  IdxArray out;
  uint64_t total = 1;
  for (uint32_t d = 0; d < ndims; ++d) {
    COHORT_ASSIGN_OR_RETURN(got, ReadUpTo(file, path, word, 4));
    if (got < 4) return DataLossError(path + ": truncated IDX header");
    out.dims.push_back(GetBigEndianU32(word));
    total *= out.dims.back();
    if (total > kMaxIdxDataBytes) {
      return InvalidArgumentError(path + ": header states more than " +
                                  std::to_string(kMaxIdxDataBytes >> 30) +
                                  " GiB of data (dimensions too large)");
    }
  }
  // The buffer grows with the data that arrives, so a header that states
  // more than the file holds costs no more than what it does hold.
  got = 0;
  while (got < total) {
    const size_t want = std::min<uint64_t>(total - got, size_t{1} << 24);
    try {
      out.data.resize(got + want);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError(path + ": out of memory for the " + std::to_string(total) +
                                    " bytes of data its header states");
    }
    COHORT_ASSIGN_OR_RETURN(const size_t n, ReadUpTo(file, path, out.data.data() + got, want));
    got += n;
    if (n < want) break;
  }
  if (got != total) {
    return DataLossError(path + ": header promises " + std::to_string(total) +
                         " bytes of data, file has " + std::to_string(got));
  }
  uint8_t extra;
  COHORT_ASSIGN_OR_RETURN(got, ReadUpTo(file, path, &extra, 1));
  if (got != 0) {
    return DataLossError(path + ": more data than the " + std::to_string(total) +
                         " bytes its header states (refused without reading the rest)");
  }
  return out;
}

}  // namespace

StatusOr<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path,
                          uint32_t num_classes) {
  COHORT_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path, 0x00000803));
  COHORT_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path, 0x00000801));
  if (images.dims.size() < 2) {
    return InvalidArgumentError(images_path + ": images need at least 2 dimensions");
  }
  const uint32_t n = images.dims[0];
  if (n == 0) return InvalidArgumentError(images_path + ": holds no images");
  if (labels.dims[0] != n) {
    return InvalidArgumentError(images_path + " has " + std::to_string(n) + " images but " +
                                labels_path + " has " + std::to_string(labels.dims[0]) + " labels");
  }
  // At most the data's size (n >= 1), so no overflow; a model takes at
  // most 2^24 inputs.
  const uint64_t features = images.data.size() / n;
  if (features == 0 || features > (1u << 24)) {
    return InvalidArgumentError(images_path + ": " + std::to_string(features) +
                                " values per image, outside [1, 2^24]");
  }
  Dataset data;
  data.num_features = static_cast<uint32_t>(features);
  data.num_classes = num_classes;
  try {
    data.labels.resize(n);
    data.features.resize(size_t{n} * features);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(images_path + ": out of memory for " + std::to_string(n) +
                                  " images of " + std::to_string(features) + " values as floats");
  }
  for (uint32_t i = 0; i < n; ++i) data.labels[i] = labels.data[i];
  const uint8_t* src = images.data.data();
  for (size_t i = 0; i < data.features.size(); ++i) data.features[i] = src[i] / 255.0f;
  COHORT_RETURN_IF_ERROR(Validate(data, labels_path));
  return data;
}

}  // namespace cohort::datasets
