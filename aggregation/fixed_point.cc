#include "aggregation/fixed_point.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cohort::aggregation {

StatusOr<FixedPoint> ChooseFixedPoint(float clip, double max_total_weight, uint32_t max_clients) {
  if (!std::isfinite(clip) || clip <= 0)
    return InvalidArgumentError("fixed point: clip must be > 0");
  if (!std::isfinite(max_total_weight) || max_total_weight <= 0) {
    return InvalidArgumentError("fixed point: total weight must be > 0");
  }
  // Each encoding may round up by one unit, hence the `max_clients` slack.
  const double room = 2147483647.0 - max_clients;
  const double scale = std::floor(room / (double{clip} * max_total_weight));
  if (!(scale >= 1)) {
    return InvalidArgumentError("fixed point: " + fmt::format("{}", max_total_weight) +
                                " total weight x clip " + fmt::format("{}", clip) +
                                " overflows 32 bits; lower the clip or the weights");
  }
  return FixedPoint{clip, scale};
}

namespace {

// Stochastic rounding: x rounds up with probability x - floor(x), decided by
// 31 random bits, which biases the expected value by under 2^-31 of a unit.
// Both versions do the same double arithmetic, so they agree bit for bit.
constexpr double kTwo31 = 2147483648.0;

// The rounding bits: word i of the stream of four interleaved xoshiro256**
// generators (word 8s + 2j + h is half h of lane j's output s), seeded from
// the caller's Rng. Filled eight words at a time, by a scalar loop or by
// AVX2 (one 64-bit lane per generator), with the same words.
class RoundingBits {
 public:
  explicit RoundingBits(Rng& rng) {
    for (auto& word : s_) {
      for (uint64_t& lane : word) lane = rng.Next();
    }
  }
  // r[0, n): the next n words of the stream; n is a multiple of 8.
  void Fill(uint32_t* r, size_t n, bool avx2);

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  void FillScalar(uint32_t* r, size_t n);
#if defined(__x86_64__)
  __attribute__((target("avx2"))) void FillAvx2(uint32_t* r, size_t n);
#endif

  alignas(32) uint64_t s_[4][4];  // [state word][generator]
};

void RoundingBits::FillScalar(uint32_t* r, size_t n) {
  for (size_t k = 0; k < n; k += 8) {
    for (int j = 0; j < 4; ++j) {
      const uint64_t result = Rotl(s_[1][j] * 5, 7) * 9;
      const uint64_t t = s_[1][j] << 17;
      s_[2][j] ^= s_[0][j];
      s_[3][j] ^= s_[1][j];
      s_[1][j] ^= s_[2][j];
      s_[0][j] ^= s_[3][j];
      s_[2][j] ^= t;
      s_[3][j] = Rotl(s_[3][j], 45);
      r[k + 2 * j] = static_cast<uint32_t>(result);
      r[k + 2 * j + 1] = static_cast<uint32_t>(result >> 32);
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) inline __m256i Rotl64(__m256i x, int k) {
  return _mm256_or_si256(_mm256_slli_epi64(x, k), _mm256_srli_epi64(x, 64 - k));
}

__attribute__((target("avx2"))) void RoundingBits::FillAvx2(uint32_t* r, size_t n) {
  __m256i* state = reinterpret_cast<__m256i*>(s_);
  __m256i s0 = _mm256_load_si256(state), s1 = _mm256_load_si256(state + 1);
  __m256i s2 = _mm256_load_si256(state + 2), s3 = _mm256_load_si256(state + 3);
  for (size_t k = 0; k < n; k += 8) {
    const __m256i times5 = _mm256_add_epi64(_mm256_slli_epi64(s1, 2), s1);
    const __m256i rotated = Rotl64(times5, 7);
    const __m256i result = _mm256_add_epi64(_mm256_slli_epi64(rotated, 3), rotated);
    const __m256i t = _mm256_slli_epi64(s1, 17);
    s2 = _mm256_xor_si256(s2, s0);
    s3 = _mm256_xor_si256(s3, s1);
    s1 = _mm256_xor_si256(s1, s2);
    s0 = _mm256_xor_si256(s0, s3);
    s2 = _mm256_xor_si256(s2, t);
    s3 = Rotl64(s3, 45);
    // Little-endian: each 64-bit output lands as its low word, then its high.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r + k), result);
  }
  _mm256_store_si256(state, s0);
  _mm256_store_si256(state + 1, s1);
  _mm256_store_si256(state + 2, s2);
  _mm256_store_si256(state + 3, s3);
}
#endif

void RoundingBits::Fill(uint32_t* r, size_t n, bool avx2) {
#if defined(__x86_64__)
  if (avx2) return FillAvx2(r, n);
#endif
  FillScalar(r, n);
}

// Whether a float is Inf or NaN (exponent all ones), branch-free.
inline uint32_t NotFinite(float v) {
  return (std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u;
}

// out[i] = encode(a[i] - b[i]) (kDelta) or encode(a[i]); returns nonzero
// when a difference is not finite.
template <bool kDelta>
uint32_t EncodeScalar(const float* a, const float* b, size_t n, double factor, double clip,
                      const uint32_t* r, uint32_t* out) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    float v = a[i];
    if constexpr (kDelta) {
      v -= b[i];
      bad |= NotFinite(v);
    }
    double x = static_cast<double>(v);
    x = x > -clip ? x : -clip;  // The operand order of maxpd / minpd.
    x = x < clip ? x : clip;
    x *= factor;
    // floor(x) without a libm call (|x| < 2^31: the truncation is exact).
    const auto t = static_cast<int64_t>(x);
    const double lo = static_cast<double>(t - (x < static_cast<double>(t)));
    const double up = static_cast<double>(static_cast<int32_t>(r[i] >> 1)) < (x - lo) * kTwo31;
    // |x| <= clip x weight x scale < 2^31, so the sum fits an int32.
    out[i] = static_cast<uint32_t>(static_cast<int32_t>(lo + up));
  }
  return bad;
}

#if defined(__x86_64__)
struct RoundConsts {
  __m256d lo_clip, hi_clip, factor, two31, one;
};

// Four values and their four rounding bits (already shifted) to words.
__attribute__((target("avx2"))) inline __m128i Round4(__m128 v, __m128i bits,
                                                      const RoundConsts& c) {
  __m256d x = _mm256_cvtps_pd(v);
  x = _mm256_mul_pd(_mm256_min_pd(_mm256_max_pd(x, c.lo_clip), c.hi_clip), c.factor);
  const __m256d lo = _mm256_floor_pd(x);
  const __m256d threshold = _mm256_mul_pd(_mm256_sub_pd(x, lo), c.two31);
  const __m256d up =
      _mm256_and_pd(_mm256_cmp_pd(_mm256_cvtepi32_pd(bits), threshold, _CMP_LT_OQ), c.one);
  return _mm256_cvtpd_epi32(_mm256_add_pd(lo, up));
}

template <bool kDelta>
__attribute__((target("avx2"))) uint32_t EncodeAvx2(const float* a, const float* b, size_t n,
                                                    double factor, double clip, const uint32_t* r,
                                                    uint32_t* out) {
  const RoundConsts c{_mm256_set1_pd(-clip), _mm256_set1_pd(clip), _mm256_set1_pd(factor),
                      _mm256_set1_pd(kTwo31), _mm256_set1_pd(1.0)};
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(a + i);
    if constexpr (kDelta) {
      v = _mm256_sub_ps(v, _mm256_loadu_ps(b + i));
      const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), exponent);
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exponent));
    }
    const __m256i bits =
        _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + i)), 1);
    const __m128i lo = Round4(_mm256_castps256_ps128(v), _mm256_castsi256_si128(bits), c);
    const __m128i hi = Round4(_mm256_extractf128_ps(v, 1), _mm256_extracti128_si256(bits, 1), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_set_m128i(hi, lo));
  }
  const uint32_t rest =
      EncodeScalar<kDelta>(a + i, kDelta ? b + i : nullptr, n - i, factor, clip, r + i, out + i);
  return rest | static_cast<uint32_t>(!_mm256_testz_si256(bad, bad));
}
#endif

template <bool kDelta>
uint32_t EncodeRun(const float* a, const float* b, size_t n, double factor, double clip,
                   const uint32_t* r, uint32_t* out, bool avx2) {
#if defined(__x86_64__)
  if (avx2) return EncodeAvx2<kDelta>(a, b, n, factor, clip, r, out);
#endif
  return EncodeScalar<kDelta>(a, b, n, factor, clip, r, out);
}

bool HasAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

// Encodes the concatenation of (a - b)[0, m) (b null: a) and tail into out,
// a chunk of rounding bits at a time, so that any split of the same values
// gives the same words. Returns false when a difference is not finite.
bool EncodeConcat(const float* a, const float* b, size_t m, std::span<const float> tail,
                  double weight, const FixedPoint& fp, Rng& rng, std::span<uint32_t> out,
                  bool avx2) {
  const double factor = weight * fp.scale;
  const double clip = fp.clip;
  RoundingBits bits(rng);
  constexpr size_t kChunk = 1024;
  alignas(32) uint32_t r[kChunk];
  uint32_t bad = 0;
  const size_t size = m + tail.size();
  for (size_t begin = 0; begin < size; begin += kChunk) {
    const size_t n = std::min(kChunk, size - begin);
    bits.Fill(r, (n + 7) & ~size_t{7}, avx2);
    const size_t head = begin < m ? std::min(n, m - begin) : 0;
    if (head > 0) {
      bad |= b != nullptr ? EncodeRun<true>(a + begin, b + begin, head, factor, clip, r,
                                            out.data() + begin, avx2)
                          : EncodeRun<false>(a + begin, nullptr, head, factor, clip, r,
                                             out.data() + begin, avx2);
    }
    if (head < n) {
      EncodeRun<false>(tail.data() + (begin + head - m), nullptr, n - head, factor, clip, r + head,
                       out.data() + begin + head, avx2);
    }
  }
  return bad == 0;
}

}  // namespace

void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out) {
  internal::EncodeFixedPoint(values, weight, fp, rng, out, HasAvx2());
}

namespace internal {

void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out, bool avx2) {
  (void)EncodeConcat(values.data(), nullptr, values.size(), {}, weight, fp, rng, out, avx2);
}

}  // namespace internal

bool EncodeDelta(std::span<const float> after, std::span<const float> before,
                 std::span<const float> tail, double weight, const FixedPoint& fp, Rng& rng,
                 std::span<uint32_t> out) {
  return EncodeConcat(after.data(), before.data(), after.size(), tail, weight, fp, rng, out,
                      HasAvx2());
}

double BoundL2Norm(std::span<const float> after, std::span<const float> before, float bound,
                   std::span<float> out) {
  double squares = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    out[i] = after[i] - before[i];
    squares += double{out[i]} * out[i];
  }
  const double norm = std::sqrt(squares);
  if (!std::isfinite(norm) || norm <= bound) return norm;
  // Scaled in double, rounded once: a client's delta becomes the float
  // nearest to the exactly clipped one.
  const double factor = double{bound} / norm;
  for (float& v : out) v = static_cast<float>(v * factor);
  return norm;
}

void DecodeFixedPoint(std::span<const uint32_t> sum, double total_weight, const FixedPoint& fp,
                      std::span<float> out) {
  const double inv = 1.0 / (fp.scale * total_weight);
  for (size_t i = 0; i < sum.size(); ++i) {
    out[i] = static_cast<float>(static_cast<int32_t>(sum[i]) * inv);
  }
}

namespace {
constexpr double kMetricRange[kSecureMetricSlots] = {kMaxSecureLoss, 1.0, kMaxSecureSeconds};
}  // namespace

void MetricsToSlots(const SecureMetrics& m, float clip, std::span<float> slots) {
  const double values[kSecureMetricSlots] = {m.loss, m.accuracy, m.seconds};
  for (size_t i = 0; i < kSecureMetricSlots; ++i) {
    const double v = std::isfinite(values[i]) ? values[i] : 0.0;
    slots[i] = static_cast<float>(std::clamp(v, 0.0, kMetricRange[i]) / kMetricRange[i] * clip);
  }
}

SecureMetrics SlotsToMetrics(std::span<const float> slots, float clip) {
  double v[kSecureMetricSlots];
  for (size_t i = 0; i < kSecureMetricSlots; ++i) v[i] = slots[i] / clip * kMetricRange[i];
  return {v[0], v[1], v[2]};
}

void EvalToSlots(uint64_t test_samples, uint64_t train_samples, double loss, double accuracy,
                 float clip, std::span<float> slots) {
  if (test_samples == 0 || train_samples == 0 || !std::isfinite(loss) || !std::isfinite(accuracy)) {
    std::fill(slots.begin(), slots.end(), 0.0f);
    return;
  }
  const double r =
      std::min(double(test_samples) / double(train_samples), kMaxEvalRatio) / kMaxEvalRatio;
  slots[0] = static_cast<float>(r * clip);
  slots[1] = static_cast<float>(r * std::clamp(loss, 0.0, kMaxSecureLoss) / kMaxSecureLoss * clip);
  slots[2] = static_cast<float>(r * std::clamp(accuracy, 0.0, 1.0) * clip);
}

std::optional<SecureEval> SlotsToEval(std::span<const float> slots, float clip, double weight) {
  const double r = slots[0] / clip;
  // Below half a fixed-point step of one client's smallest r: nobody evaluated.
  if (!(r > 1e-6)) return std::nullopt;
  SecureEval e;
  // A client's slots are unchecked under the mask: keep the ranges they encode.
  e.loss = std::clamp(slots[1] / clip / r * kMaxSecureLoss, 0.0, kMaxSecureLoss);
  e.accuracy = std::clamp(slots[2] / clip / r, 0.0, 1.0);
  e.samples = r * kMaxEvalRatio * weight;
  return e;
}

}  // namespace cohort::aggregation
