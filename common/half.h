// 16-bit floats for the wire: bfloat16 (float32's exponent, 8 bits of
// mantissa) and IEEE binary16. Conversions from float round to nearest,
// ties to even, as hardware does; NaN stays NaN (quiet), infinities stay
// infinite, and float16 overflows to infinity. Plain bit arithmetic, so
// every compiler and CPU gives the same bits.
#ifndef COHORT_COMMON_HALF_H_
#define COHORT_COMMON_HALF_H_

#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace cohort {

struct Bf16 {
  uint16_t bits = 0;
};
struct Fp16 {
  uint16_t bits = 0;
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2);

namespace half_internal {
inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace half_internal

inline float ToFloat(Bf16 h) { return half_internal::FromBits(uint32_t{h.bits} << 16); }

inline Bf16 ToBf16(float f) {
  uint32_t u = half_internal::Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1);  // Ties to even; carries into the exponent.
  return {static_cast<uint16_t>(u >> 16)};
}

inline float ToFloat(Fp16 h) {
  using half_internal::Bits;
  using half_internal::FromBits;
  const uint32_t w = uint32_t{h.bits} << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal numbers (and inf/NaN): move the exponent into float's and
  // rebias by a multiplication; subnormals: a magic-number subtraction.
  const float normalized = FromBits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  const float denormalized = FromBits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? Bits(denormalized) : Bits(normalized));
  return FromBits(r);
}

inline Fp16 ToFp16(float f) {
  using half_internal::Bits;
  using half_internal::FromBits;
  const float abs = FromBits(Bits(f) & 0x7fffffffu);
  // Scaling up then down makes too-large values infinite and lets the FPU
  // round the mantissa (ties to even) at the float16 position.
  float base = (abs * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = Bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = Bits(base);
  const uint32_t nonsign = ((b >> 13) & 0x00007c00u) + (b & 0x00000fffu);
  return {static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign))};
}

// Whole vectors (same lengths).
template <typename H>
void FromFloats(std::span<const float> in, std::span<H> out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if constexpr (std::is_same_v<H, Bf16>) {
      out[i] = ToBf16(in[i]);
    } else {
      out[i] = ToFp16(in[i]);
    }
  }
}
template <typename H>
void ToFloats(std::span<const H> in, std::span<float> out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = ToFloat(in[i]);
}

}  // namespace cohort

#endif  // COHORT_COMMON_HALF_H_
