#include "client/control_variate.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "client/state_file.h"
#include "common/bytes.h"

namespace cohort::client {
namespace {

constexpr char kMagic[8] = {'C', 'H', 'T', 'S', 'C', 'A', 'F', '2'};
constexpr char kMagicBeforeRunId[8] = {'C', 'H', 'T', 'S', 'C', 'A', 'F', '1'};
constexpr size_t kRunBytes = 32;

std::span<const uint8_t> Bytes(std::span<const float> values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)};
}

uint32_t Checksum(std::span<const uint8_t> run, std::span<const float> values) {
  return Crc32(Bytes(values), Crc32(run));
}

}  // namespace

std::string ControlVariatePath(const std::string& state_dir) {
  return state_dir + "/scaffold_variate.bin";
}

StatusOr<ClientVariate> LoadControlVariate(const std::string& path, size_t num_params) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) {
    return ClientVariate{0, std::vector<float>(num_params, 0.0f),
                         std::vector<float>(num_params, 0.0f)};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return UnavailableError(path +
                            ": cannot read the SCAFFOLD control variate: " + std::strerror(errno));
  }
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const std::string what = path + ": SCAFFOLD control variate: ";
  const bool with_run = data.size() >= 8 && std::memcmp(p, kMagic, 8) == 0;
  const size_t header = 8 + 8 + 4 + (with_run ? kRunBytes : 0) + 4;
  if (data.size() < header || (!with_run && std::memcmp(p, kMagicBeforeRunId, 8) != 0)) {
    return DataLossError(what + "not a control variate file (bad magic or cut short)");
  }
  const uint64_t count = GetU64(p + 8);
  if (count != num_params) {
    return DataLossError(what + "holds " + std::to_string(count) + " values, the model has " +
                         std::to_string(num_params));
  }
  if (data.size() != header + 2 * count * sizeof(float)) {
    return DataLossError(what + std::to_string(data.size()) + " bytes, expected " +
                         std::to_string(header + 2 * count * sizeof(float)));
  }
  ClientVariate out;
  if (with_run) std::memcpy(out.run.data(), p + 20, kRunBytes);
  std::vector<float> values(2 * count);
  std::memcpy(values.data(), p + header, values.size() * sizeof(float));
  const uint32_t crc = with_run ? Checksum(out.run, values) : Crc32(Bytes(values));
  if (crc != GetU32(p + header - 4)) return DataLossError(what + "CRC-32 mismatch");
  for (float v : values) {
    if (!std::isfinite(v)) return DataLossError(what + "holds NaN or Inf");
  }
  out.round = GetU32(p + 16);
  out.before.assign(values.begin(), values.begin() + static_cast<ptrdiff_t>(count));
  out.after.assign(values.begin() + static_cast<ptrdiff_t>(count), values.end());
  return out;
}

Status SaveControlVariate(const std::string& path, const ClientVariate& variate) {
  std::vector<float> values = variate.before;
  values.insert(values.end(), variate.after.begin(), variate.after.end());
  std::string data(kMagic, 8);
  PutU64(data, variate.after.size());
  PutU32(data, variate.round);
  data.append(reinterpret_cast<const char*>(variate.run.data()), kRunBytes);
  PutU32(data, Checksum(variate.run, values));
  data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return ReplaceFileDurably(path, data);
}

}  // namespace cohort::client
