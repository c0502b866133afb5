// Little-endian byte helpers and checksums for wire frames and files.
#ifndef COHORT_COMMON_BYTES_H_
#define COHORT_COMMON_BYTES_H_

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace cohort {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "Cohort's wire and file formats assume a little-endian host");

inline void PutU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}
inline void PutU64(std::string& out, uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}
inline uint32_t GetU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t GetU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t GetBigEndianU32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// CRC-32 (zlib polynomial), continuing from `crc` (0 to start).
uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc = 0);

// True when every value is finite (no NaN, no Inf).
bool AllFinite(std::span<const float> values);

}  // namespace cohort

#endif  // COHORT_COMMON_BYTES_H_
