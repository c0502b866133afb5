#include "common/bytes.h"

#include <zlib.h>

#include <cmath>

namespace cohort {

uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc) {
  // zlib's crc32 takes a uInt length; feed it in chunks for >4 GiB inputs.
  const uint8_t* p = data.data();
  size_t left = data.size();
  uLong c = crc;
  while (left > 0) {
    const uInt n = static_cast<uInt>(left > (1u << 30) ? (1u << 30) : left);
    c = crc32(c, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(c);
}

bool AllFinite(std::span<const float> values) {
  // Branch-free reduction so the check vectorises; x - x is NaN for Inf/NaN.
  float acc = 0.0f;
  for (float v : values) acc += v - v;
  return acc == 0.0f;
}

}  // namespace cohort
