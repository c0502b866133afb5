#include "datasets/dataset.h"

#include <algorithm>
#include <filesystem>

namespace cohort::datasets {

Dataset Subset(const Dataset& data, std::span<const uint32_t> indices) {
  Dataset out;
  out.num_features = data.num_features;
  out.num_classes = data.num_classes;
  out.labels.reserve(indices.size());
  out.features.resize(indices.size() * size_t{data.num_features});
  float* dst = out.features.data();
  for (uint32_t i : indices) {
    out.labels.push_back(data.labels[i]);
    auto row = data.row(i);
    dst = std::copy(row.begin(), row.end(), dst);
  }
  return out;
}

std::vector<uint64_t> LabelCounts(const Dataset& data) {
  std::vector<uint64_t> counts(data.num_classes, 0);
  for (int32_t y : data.labels) {
    if (y >= 0 && static_cast<uint32_t>(y) < data.num_classes) ++counts[y];
  }
  return counts;
}

Status Validate(const Dataset& data, const std::string& source) {
  if (data.num_features == 0) {
    return InvalidArgumentError(source + ": zero features per sample");
  }
  if (data.features.size() != data.labels.size() * size_t{data.num_features}) {
    return InvalidArgumentError(source + ": " + std::to_string(data.features.size()) +
                                " feature values for " + std::to_string(data.labels.size()) +
                                " samples of " + std::to_string(data.num_features));
  }
  for (size_t i = 0; i < data.labels.size(); ++i) {
    if (data.labels[i] < 0 || static_cast<uint32_t>(data.labels[i]) >= data.num_classes) {
      return InvalidArgumentError(source + ": sample " + std::to_string(i) + " has label " +
                                  std::to_string(data.labels[i]) + ", outside [0, " +
                                  std::to_string(data.num_classes) + ")");
    }
  }
  return OkStatus();
}

Status CheckRegularFile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return NotFoundError(path + ": no such file");
  if (ec) return UnavailableError(path + ": " + ec.message());
  const char* what = nullptr;
  switch (st.type()) {
    case fs::file_type::regular:
      return OkStatus();
    case fs::file_type::directory:
      what = "a directory";
      break;
    case fs::file_type::fifo:
      what = "a FIFO (named pipe)";
      break;
    case fs::file_type::character:
    case fs::file_type::block:
      what = "a device";
      break;
    case fs::file_type::socket:
      what = "a socket";
      break;
    default:
      what = "a special file";
      break;
  }
  return InvalidArgumentError(path + ": is " + std::string(what) +
                              ", not a regular file; refused without reading it");
}

}  // namespace cohort::datasets
