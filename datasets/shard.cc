#include "datasets/shard.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <vector>

#include "common/bytes.h"

namespace cohort::datasets {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'S', 'H', 'A', 'R', 'D'};
constexpr uint32_t kVersion = 1;

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

Status WriteShard(const Dataset& data, const std::string& path, FeatureEncoding encoding) {
  COHORT_RETURN_IF_ERROR(Validate(data, path));
  if (data.labels.empty()) {
    // ReadShard refuses such a file: a client with no samples cannot train.
    return InvalidArgumentError(path + ": no samples (a shard holds at least one)");
  }
  std::string labels;
  labels.reserve(data.labels.size() * 4);
  for (int32_t y : data.labels) PutU32(labels, static_cast<uint32_t>(y));
  std::string features;
  if (encoding == FeatureEncoding::kUint8) {
    features.resize(data.features.size());
    for (size_t i = 0; i < data.features.size(); ++i) {
      const float scaled = data.features[i] * 255.0f;
      const float rounded = std::nearbyint(scaled);
      if (!(rounded >= 0 && rounded <= 255) || rounded / 255.0f != data.features[i]) {
        return InvalidArgumentError(path + ": feature " + std::to_string(i) +
                                    " is not k/255; use float32 encoding");
      }
      features[i] = static_cast<char>(static_cast<uint8_t>(rounded));
    }
  } else {
    features.assign(reinterpret_cast<const char*>(data.features.data()),
                    data.features.size() * sizeof(float));
  }
  std::string header(kMagic, 8);
  PutU32(header, kVersion);
  PutU32(header, static_cast<uint32_t>(encoding));
  PutU64(header, data.labels.size());
  PutU32(header, data.num_features);
  PutU32(header, data.num_classes);
  PutU32(header, Crc32(AsBytes(labels)));
  PutU32(header, Crc32(AsBytes(features)));
  PutU32(header, Crc32(AsBytes(header)));
  PutU32(header, 0);

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return UnavailableError(tmp + ": cannot create");
    out.write(header.data(), header.size());
    out.write(labels.data(), labels.size());
    out.write(features.data(), features.size());
    out.flush();
    if (!out) return UnavailableError(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return UnavailableError(path + ": rename failed: " + std::strerror(errno));
  }
  return OkStatus();
}

namespace {

// What a shard's 48-byte header says, checked against the file's size.
struct ShardHeader {
  uint32_t encoding = 0;  // 0: float32, 1: uint8.
  uint64_t n = 0;         // Samples.
  uint32_t nf = 0, nc = 0;
  uint32_t labels_crc = 0, features_crc = 0;
  uint64_t width() const { return encoding == 1 ? 1 : 4; }
};

StatusOr<ShardHeader> ParseHeader(const std::string& path, const uint8_t* h, uint64_t file_size) {
  if (std::memcmp(h, kMagic, 8) != 0) {
    return InvalidArgumentError(path + ": not a Cohort shard file (bad magic)");
  }
  if (Crc32({h, 40}) != GetU32(h + 40)) {
    return DataLossError(path + ": header checksum mismatch (corrupt header)");
  }
  const uint32_t version = GetU32(h + 8);
  if (version != kVersion) {
    return InvalidArgumentError(path + ": shard version " + std::to_string(version) +
                                ", this build reads version 1");
  }
  ShardHeader hd;
  hd.encoding = GetU32(h + 12);
  if (hd.encoding > 1) {
    return InvalidArgumentError(path + ": unknown feature encoding " + std::to_string(hd.encoding));
  }
  hd.n = GetU64(h + 16);
  hd.nf = GetU32(h + 24);
  hd.nc = GetU32(h + 28);
  if (hd.n == 0 || hd.nf == 0 || hd.nc < 2 || hd.n > (uint64_t{1} << 34) || hd.nf > (1u << 24)) {
    return InvalidArgumentError(path + ": implausible header (samples " + std::to_string(hd.n) +
                                ", features " + std::to_string(hd.nf) + ", classes " +
                                std::to_string(hd.nc) + ")");
  }
  const uint64_t expected = kShardHeaderBytes + hd.n * 4 + hd.n * hd.nf * hd.width();
  if (file_size != expected) {
    return DataLossError(path + ": file has " + std::to_string(file_size) +
                         " bytes, header promises " + std::to_string(expected) +
                         " (truncated or padded)");
  }
  hd.labels_crc = GetU32(h + 32);
  hd.features_crc = GetU32(h + 36);
  return hd;
}

StatusOr<Dataset> ReadShardOrThrow(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFoundError(path + ": cannot open shard file");
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < kShardHeaderBytes) {
    return DataLossError(path + ": " + std::to_string(file_size) +
                         " bytes, too short for a shard header (48 bytes)");
  }
  uint8_t h[kShardHeaderBytes];
  in.read(reinterpret_cast<char*>(h), kShardHeaderBytes);
  COHORT_ASSIGN_OR_RETURN(const ShardHeader hd, ParseHeader(path, h, file_size));
  const uint64_t n = hd.n, nf = hd.nf;
  Dataset data;
  data.num_features = hd.nf;
  data.num_classes = hd.nc;
  data.labels.resize(n);
  in.read(reinterpret_cast<char*>(data.labels.data()), n * 4);
  if (Crc32({reinterpret_cast<const uint8_t*>(data.labels.data()), n * 4}) != hd.labels_crc) {
    return DataLossError(path + ": label section checksum mismatch");
  }
  std::vector<uint8_t> raw(n * nf * hd.width());
  in.read(reinterpret_cast<char*>(raw.data()), raw.size());
  if (!in) return DataLossError(path + ": read failed");
  if (Crc32(raw) != hd.features_crc) {
    return DataLossError(path + ": feature section checksum mismatch");
  }
  data.features.resize(n * nf);
  if (hd.encoding == 1) {
    for (size_t i = 0; i < raw.size(); ++i) data.features[i] = raw[i] / 255.0f;
  } else {
    std::memcpy(data.features.data(), raw.data(), raw.size());
    if (!AllFinite(data.features)) {
      return InvalidArgumentError(path + ": features contain NaN or Inf");
    }
  }
  COHORT_RETURN_IF_ERROR(Validate(data, path));
  return data;
}

}  // namespace

StatusOr<Dataset> ReadShard(const std::string& path) {
  // Before the open: opening a FIFO (say one named client-000.shard) blocks.
  COHORT_RETURN_IF_ERROR(CheckRegularFile(path));
  // The sizes are the file's own (checked against it), yet a large file
  // may still not fit in this process: an error, not an abort.
  try {
    return ReadShardOrThrow(path);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(path + ": out of memory reading the shard");
  }
}

}  // namespace cohort::datasets
