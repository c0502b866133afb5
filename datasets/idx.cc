#include "datasets/idx.h"

#include <zlib.h>

#include <memory>
#include <vector>

#include "common/bytes.h"

namespace cohort::datasets {
namespace {

// gzread reads gzip and plain files alike.
StatusOr<std::vector<uint8_t>> ReadMaybeGzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return NotFoundError(path + ": cannot open");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(file, gzclose);
  std::vector<uint8_t> out;
  uint8_t buffer[1 << 16];
  for (;;) {
    const int n = gzread(file, buffer, sizeof(buffer));
    if (n < 0) {
      int err = 0;
      return DataLossError(path + ": read failed: " + gzerror(file, &err));
    }
    if (n == 0) break;
    out.insert(out.end(), buffer, buffer + n);
  }
  return out;
}

struct IdxArray {
  std::vector<uint32_t> dims;
  size_t offset = 0;
};

StatusOr<IdxArray> ParseIdxHeader(const std::vector<uint8_t>& bytes, const std::string& path,
                                  uint32_t expect_magic) {
  if (bytes.size() < 8) return DataLossError(path + ": too short for an IDX header");
  const uint32_t magic = GetBigEndianU32(bytes.data());
  if (magic != expect_magic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x, expected 0x%08x", magic, expect_magic);
    return InvalidArgumentError(path + ": " + buf);
  }
  const uint32_t ndims = magic & 0xff;
  IdxArray out;
  out.offset = 4 + 4 * size_t{ndims};
  if (bytes.size() < out.offset) return DataLossError(path + ": truncated IDX header");
  uint64_t total = 1;
  for (uint32_t d = 0; d < ndims; ++d) {
    out.dims.push_back(GetBigEndianU32(bytes.data() + 4 + 4 * d));
    total *= out.dims.back();
    if (total > (uint64_t{1} << 40)) return InvalidArgumentError(path + ": dimensions too large");
  }
  if (bytes.size() - out.offset != total) {
    return DataLossError(path + ": header promises " + std::to_string(total) +
                         " bytes of data, file has " + std::to_string(bytes.size() - out.offset));
  }
  return out;
}

}  // namespace

StatusOr<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path,
                          uint32_t num_classes) {
  COHORT_ASSIGN_OR_RETURN(std::vector<uint8_t> images, ReadMaybeGzip(images_path));
  COHORT_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadMaybeGzip(labels_path));
  COHORT_ASSIGN_OR_RETURN(IdxArray image_header, ParseIdxHeader(images, images_path, 0x00000803));
  COHORT_ASSIGN_OR_RETURN(IdxArray label_header, ParseIdxHeader(labels, labels_path, 0x00000801));
  if (image_header.dims.size() < 2) {
    return InvalidArgumentError(images_path + ": images need at least 2 dimensions");
  }
  const uint32_t n = image_header.dims[0];
  if (label_header.dims[0] != n) {
    return InvalidArgumentError(images_path + " has " + std::to_string(n) + " images but " +
                                labels_path + " has " + std::to_string(label_header.dims[0]) +
                                " labels");
  }
  uint64_t features = 1;
  for (size_t d = 1; d < image_header.dims.size(); ++d) features *= image_header.dims[d];
  Dataset data;
  data.num_features = static_cast<uint32_t>(features);
  data.num_classes = num_classes;
  data.labels.resize(n);
  for (uint32_t i = 0; i < n; ++i) data.labels[i] = labels[label_header.offset + i];
  data.features.resize(size_t{n} * features);
  const uint8_t* src = images.data() + image_header.offset;
  for (size_t i = 0; i < data.features.size(); ++i) data.features[i] = src[i] / 255.0f;
  COHORT_RETURN_IF_ERROR(Validate(data, labels_path));
  return data;
}

}  // namespace cohort::datasets
