#include "aggregation/fixed_point.h"

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
    return InvalidArgumentError("fixed point: " + std::to_string(max_total_weight) +
                                " total weight x clip " + std::to_string(clip) +
                                " overflows 32 bits; lower the clip or the weights");
  }
  return FixedPoint{clip, scale};
}

namespace {

// Stochastic rounding: x rounds up with probability x - floor(x), decided by
// 31 random bits, which biases the expected value by under 2^-31 of a unit.
// Both versions do the same double arithmetic, so they agree bit for bit.
constexpr double kTwo31 = 2147483648.0;

void EncodeChunkScalar(const float* v, size_t n, double factor, double clip, const uint32_t* r,
                       uint32_t* out) {
  for (size_t i = 0; i < n; ++i) {
    double x = static_cast<double>(v[i]);
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
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void EncodeChunkAvx2(const float* v, size_t n, double factor,
                                                     double clip, const uint32_t* r,
                                                     uint32_t* out) {
  const __m256d lo_clip = _mm256_set1_pd(-clip), hi_clip = _mm256_set1_pd(clip);
  const __m256d f = _mm256_set1_pd(factor), two31 = _mm256_set1_pd(kTwo31);
  const __m256d one = _mm256_set1_pd(1.0);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(v + i));
    x = _mm256_mul_pd(_mm256_min_pd(_mm256_max_pd(x, lo_clip), hi_clip), f);
    const __m256d lo = _mm256_floor_pd(x);
    const __m256d threshold = _mm256_mul_pd(_mm256_sub_pd(x, lo), two31);
    const __m256d bits = _mm256_cvtepi32_pd(
        _mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + i)), 1));
    const __m256d up = _mm256_and_pd(_mm256_cmp_pd(bits, threshold, _CMP_LT_OQ), one);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtpd_epi32(_mm256_add_pd(lo, up)));
  }
  EncodeChunkScalar(v + i, n - i, factor, clip, r + i, out + i);
}
#endif

bool HasAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

}  // namespace

void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out) {
  internal::EncodeFixedPoint(values, weight, fp, rng, out, HasAvx2());
}

namespace internal {

// The encoding loop of EncodeFixedPoint and EncodeDelta: `chunk(begin, n,
// scratch)` returns n values starting at `begin` (its own storage or
// `scratch`); the rounding bits are drawn per chunk of kChunk, so both give
// the same words for the same values.
template <typename Chunk>
void EncodeChunks(size_t size, Chunk&& chunk, double weight, const FixedPoint& fp, Rng& rng,
                  std::span<uint32_t> out, bool avx2) {
  const double factor = weight * fp.scale;
  const double clip = fp.clip;
  constexpr size_t kChunk = 1024;
  uint32_t r[kChunk];
  float scratch[kChunk];
  for (size_t begin = 0; begin < size; begin += kChunk) {
    const size_t n = std::min(kChunk, size - begin);
    for (size_t i = 0; i < n; i += 2) {
      const uint64_t bits = rng.Next();
      r[i] = static_cast<uint32_t>(bits);
      r[i + 1] = static_cast<uint32_t>(bits >> 32);
    }
    const float* values = chunk(begin, n, scratch);
#if defined(__x86_64__)
    if (avx2) {
      EncodeChunkAvx2(values, n, factor, clip, r, out.data() + begin);
      continue;
    }
#endif
    EncodeChunkScalar(values, n, factor, clip, r, out.data() + begin);
  }
}

void EncodeFixedPoint(std::span<const float> values, double weight, const FixedPoint& fp, Rng& rng,
                      std::span<uint32_t> out, bool avx2) {
  EncodeChunks(
      values.size(), [&](size_t begin, size_t, float*) { return values.data() + begin; }, weight,
      fp, rng, out, avx2);
}

}  // namespace internal

bool EncodeDelta(std::span<const float> after, std::span<const float> before,
                 std::span<const float> tail, double weight, const FixedPoint& fp, Rng& rng,
                 std::span<uint32_t> out) {
  const size_t m = after.size();
  bool finite = true;
  auto chunk = [&](size_t begin, size_t n, float* scratch) {
    const size_t in_delta = begin < m ? std::min(n, m - begin) : 0;
    uint32_t bad = 0;
    for (size_t i = 0; i < in_delta; ++i) {
      scratch[i] = after[begin + i] - before[begin + i];
      // Exponent all ones: Inf or NaN (a branch-free test the loop can vectorize).
      bad |= (std::bit_cast<uint32_t>(scratch[i]) & 0x7f800000u) == 0x7f800000u;
    }
    for (size_t i = in_delta; i < n; ++i) scratch[i] = tail[begin + i - m];
    finite = finite && bad == 0;
    return static_cast<const float*>(scratch);
  };
  internal::EncodeChunks(m + tail.size(), chunk, weight, fp, rng, out, HasAvx2());
  return finite;
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

}  // namespace cohort::aggregation
