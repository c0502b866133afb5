// Seeded, platform-independent randomness. Every random choice in Cohort
// (partitioning, init, shuffling, selection, fault injection) draws from an
// Rng whose seed is derived from the run seed plus stable integers (round,
// client id, purpose), so a run replays bit for bit. std:: distributions are
// avoided on purpose: their output differs between standard libraries.
#ifndef COHORT_COMMON_RNG_H_
#define COHORT_COMMON_RNG_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

namespace cohort {

// Mixes integers into one 64-bit seed (SplitMix64 finaliser chain).
uint64_t DeriveSeed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);

// FNV-1a 64-bit hash; stable across platforms, used for client-name ids.
uint64_t Fnv1a64(std::string_view data);

// xoshiro256** generator. Not thread-safe; cheap to copy.
class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t Next() {  // Inline: the fixed-point encoder draws per value.
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double UniformDouble();
  // Uniform in [0, 1) with 24 random bits.
  float UniformFloat();
  // Uniform integer in [0, n); n > 0. Unbiased (Lemire's method).
  uint64_t UniformInt(uint64_t n);
  // Standard normal (Box-Muller, no cached second value, for simplicity).
  double Normal();
  // Gamma(shape, 1), shape > 0 (Marsaglia-Tsang).
  double Gamma(double shape);

  template <typename T>
  void Shuffle(std::span<T> items) {
    for (size_t i = items.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(UniformInt(i));
      std::swap(items[i - 1], items[j]);
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace cohort

#endif  // COHORT_COMMON_RNG_H_
