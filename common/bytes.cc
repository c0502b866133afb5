#include "common/bytes.h"

#include <zlib.h>

#include <cmath>
#include <cstring>

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
  // On the bits, so the compiler may vectorise the reduction (a float sum
  // would be one long chain of dependent adds): NaN and Inf are the values
  // whose exponent bits are all ones.
  uint32_t bad = 0;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace cohort
