#include "privacy/skellam.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "privacy/log_space.h"
#include "privacy/rdp_wor.h"

namespace cohort::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Words of the noise stream held at a time (one ChaCha20 call).
constexpr size_t kBlockWords = 512;
// The integer noise's standard deviation at most 2^kMaxNoiseBits: a share's
// Poisson mean then stays below 2^41, where the sampler's doubles are exact
// integers to ~1e-4 and its log-density is evaluated without cancellation.
constexpr int kMaxNoiseBits = 21;
constexpr int kMaxRoundingDraws = 1000;

// log of the Poisson(lambda) pmf at k, for k, lambda >= 10, without the
// cancellation of -λ + k log λ - log k! (each ~10^13 at λ ~ 10^12):
// with k = λ + x, it is x - k log1p(x / λ) - ½ log(2πk) - the Stirling
// series' correction 1/(12k) - 1/(360k³) + 1/(1260k⁵).
double LogPoissonPmf(int64_t k, double lambda) {
  const double kd = static_cast<double>(k);
  if (k < 10) return -lambda + kd * std::log(lambda) - std::lgamma(kd + 1);
  const double x = kd - lambda;
  const double k2 = kd * kd;
  const double correction = (1.0 / 12 - (1.0 / 360 - 1.0 / (1260 * k2)) / k2) / kd;
  return x - kd * std::log1p(x / lambda) - 0.5 * std::log(2 * std::numbers::pi * kd) - correction;
}

}  // namespace

namespace {

// Theorem 3.5's bound at integer order `a`.
double SkellamRdpInteger(double l1, double l2, double v, double a) {
  const double gaussian = a * l2 * l2 / (2 * v);
  const double correction =
      std::min(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * v * v), 3 * l1 / (2 * v));
  return gaussian + correction;
}

}  // namespace

double SkellamRdp(double l1, double l2, double variance, double order) {
  if (!(variance > 0)) return kInf;
  const double lo = std::floor(order), t = order - lo;
  if (t == 0) return SkellamRdpInteger(l1, l2, variance, lo);
  // Between integers, the chord of (α - 1) ε(α), which is convex in α (a
  // log moment) and 0 at α = 1: as rdp_wor.cc interpolates.
  const double cgf = (1 - t) * (lo - 1) * SkellamRdpInteger(l1, l2, variance, lo) +
                     t * lo * SkellamRdpInteger(l1, l2, variance, lo + 1);
  return cgf / (order - 1);
}

double SampledSkellamRdp(double q, double l1, double l2, double variance, double order) {
  const double unsampled = SkellamRdp(l1, l2, variance, order);
  if (q <= 0) return 0;
  if (q >= 1) return unsampled;
  if (order != std::floor(order) || order < 2) return kInf;
  const int alpha = static_cast<int>(order);
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  // l = 0 and 1 together, then l = 2, then 3..α with the factor 3.
  double log_a = (alpha - 1) * log_1mq + std::log(alpha * q - q + 1);
  log_a = LogAdd(log_a, LogBinomial(alpha, 2) + 2 * log_q + (alpha - 2) * log_1mq +
                            SkellamRdp(l1, l2, variance, 2));
  for (int l = 3; l <= alpha; ++l) {
    log_a = LogAdd(log_a, std::log(3.0) + LogBinomial(alpha, l) + l * log_q +
                              (alpha - l) * log_1mq + (l - 1) * SkellamRdp(l1, l2, variance, l));
  }
  return std::min(unsampled, log_a / (alpha - 1));
}

Status ComposeSkellam(RdpAccountant& accountant, double q, const SkellamParams& params,
                      uint64_t steps) {
  if (!(q >= 0 && q <= 1)) {
    return InvalidArgumentError("privacy accounting: sampling rate " + fmt::format("{}", q) +
                                " is not in [0, 1]");
  }
  std::vector<double> rdp;
  for (double order : accountant.orders()) {
    rdp.push_back(SampledSkellamRdp(q, params.l1_bound, params.l2_bound, params.variance, order));
  }
  return accountant.AddRdp(rdp, steps);
}

Status ChargeSkellamRounds(RdpAccountant& accountant, const SkellamParams& params,
                           uint64_t rounds) {
  SkellamParams replace_one = params;
  replace_one.l1_bound *= 2;
  replace_one.l2_bound *= 2;
  return ComposeSkellam(accountant, 1.0, replace_one, rounds);
}

Status ChargeSkellamRoundsForReleasedModel(RdpAccountant& accountant, const SkellamParams& params,
                                           double q, uint64_t rounds) {
  if (!(q >= 0 && q <= 1)) {
    return InvalidArgumentError("privacy accounting: sampling fraction " + fmt::format("{}", q) +
                                " is not in [0, 1]");
  }
  const double l1 = 2 * params.l1_bound, l2 = 2 * params.l2_bound, v = params.variance;
  std::vector<double> rdp = SampledWithoutReplacementRdp(
      q, [&](int j) { return SkellamRdp(l1, l2, v, j); }, accountant.orders());
  for (size_t k = 0; k < rdp.size(); ++k) {
    rdp[k] = std::min(rdp[k], SkellamRdp(l1, l2, v, accountant.orders()[k]));
  }
  return accountant.AddRdp(rdp, rounds);
}

namespace {

// ε(α) of one round of adaptive clipping, replace-one: the update's curve
// (2 Δ1, 2 Δ2) plus the count's (S, S).
double AdaptiveRdp(const SkellamParams& p, const SkellamParams& count, double order) {
  return SkellamRdp(2 * p.l1_bound, 2 * p.l2_bound, p.variance, order) +
         SkellamRdp(count.l1_bound, count.l2_bound, count.variance, order);
}

}  // namespace

Status ChargeAdaptiveSkellamRounds(RdpAccountant& accountant, const SkellamParams& params,
                                   const SkellamParams& count, uint64_t rounds) {
  std::vector<double> rdp;
  for (double order : accountant.orders()) rdp.push_back(AdaptiveRdp(params, count, order));
  return accountant.AddRdp(rdp, rounds);
}

Status ChargeAdaptiveSkellamRoundsForReleasedModel(RdpAccountant& accountant,
                                                   const SkellamParams& params,
                                                   const SkellamParams& count, double q,
                                                   uint64_t rounds) {
  if (!(q >= 0 && q <= 1)) {
    return InvalidArgumentError("privacy accounting: sampling fraction " + fmt::format("{}", q) +
                                " is not in [0, 1]");
  }
  std::vector<double> rdp = SampledWithoutReplacementRdp(
      q, [&](int j) { return AdaptiveRdp(params, count, j); }, accountant.orders());
  for (size_t k = 0; k < rdp.size(); ++k) {
    rdp[k] = std::min(rdp[k], AdaptiveRdp(params, count, accountant.orders()[k]));
  }
  return accountant.AddRdp(rdp, rounds);
}

StatusOr<SkellamParams> ChooseClipCountParams(double count_stddev, uint32_t max_clients,
                                              uint32_t min_survivors) {
  auto chosen = ChooseSkellamParams(1.0, count_stddev, max_clients, min_survivors, 1);
  if (!chosen.ok() || chosen->scale < 1) {
    return InvalidArgumentError(fmt::format(
        "privacy.adaptive_clip.clipped_count_stddev {}: no integer grid keeps the 32-bit sum of "
        "{} clipped-count bits (rounds.max_clients_per_round) with their noise from wrapping",
        count_stddev, max_clients));
  }
  // b S is exact on the grid: no rounding, so the sensitivity is S itself.
  chosen->l2_bound = chosen->scale;
  chosen->l1_bound = chosen->scale;
  return chosen;
}

bool WithinL2Norm(std::span<const float> delta, double clip_norm) {
  double norm2 = 0;
  for (float v : delta) norm2 += double{v} * v;
  return std::sqrt(norm2) <= clip_norm;
}

uint32_t EncodeClipBit(bool unclipped, double scale, double share_variance, SkellamSampler& noise) {
  const int64_t bit = unclipped ? static_cast<int64_t>(scale) : 0;
  return static_cast<uint32_t>(static_cast<uint64_t>(bit + noise.Skellam(share_variance)));
}

double DecodeClipCount(uint32_t sum, double scale) {
  return static_cast<double>(static_cast<int32_t>(sum)) / scale;
}

double RoundedL2Bound(double scaled_l2, double dim, double beta) {
  const double c = scaled_l2, root_d = std::sqrt(dim);
  const double plain = c + root_d;
  const double squared =
      c * c + 0.25 * dim + std::sqrt(2 * std::log(1 / beta)) * (c + 0.5 * root_d);
  return std::min(plain, std::sqrt(squared));
}

double RoundedL1Bound(double l2_bound, double dim) {
  return l2_bound * std::min(std::sqrt(dim), l2_bound);
}

double SkellamLogTail(double variance, double t) {
  if (t <= 0) return 0;
  const double r = t / variance;
  return variance * (std::sqrt(1 + r * r) - 1) - t * std::asinh(r);
}

std::string SkellamParams::Describe() const {
  return fmt::format(
      "scale 2^{} per unit, sensitivity on the grid L2 {:.6g} and L1 {:.6g}, noise variance "
      ">= {:.6g} (std {:.6g} = {:.6g} units) from >= {} survivors (each share {:.6g}); the "
      "32-bit sum of <= {} inputs wraps with probability <= {} per round (required: <= {:g})",
      std::ilogb(scale), l2_bound, l1_bound, variance, std::sqrt(variance),
      std::sqrt(variance) / scale, min_survivors, share_variance(), max_clients,
      wrap_probability > 1e-300 ? fmt::format("{:.3g}", wrap_probability) : "1e-300",
      kMaxWrapProbability);
}

StatusOr<SkellamParams> ChooseSkellamParams(double clip_norm, double noise_multiplier,
                                            uint32_t max_clients, uint32_t min_survivors,
                                            size_t dim) {
  if (!(clip_norm > 0) || !(noise_multiplier > 0) || std::isinf(clip_norm * noise_multiplier) ||
      max_clients == 0 || min_survivors == 0 || min_survivors > max_clients || dim == 0) {
    return InvalidArgumentError(fmt::format(
        "privacy: distributed DP needs privacy.clip_norm and privacy.noise_multiplier finite "
        "and > 0 and 0 < survivors <= rounds.max_clients_per_round (got clip_norm {}, "
        "noise_multiplier {}, {} survivors of {}, {} values)",
        clip_norm, noise_multiplier, min_survivors, max_clients, dim));
  }
  const double d = static_cast<double>(dim), n = max_clients;
  const double limit = std::ldexp(1.0, 31) - 1;
  const int top =
      std::min(60, static_cast<int>(std::floor(std::log2(std::ldexp(1.0, kMaxNoiseBits) /
                                                         (noise_multiplier * clip_norm)))));
  SkellamParams p;
  p.max_clients = max_clients;
  p.min_survivors = min_survivors;
  for (int k = top; k >= top - 120; --k) {
    const double s = std::ldexp(1.0, k);
    const double l2 = RoundedL2Bound(s * clip_norm, d, kRoundingBeta);
    // Each coordinate of an input is an integer of magnitude <= ||x||₂.
    const double signal = n * std::floor(l2);
    const double variance = std::pow(s * noise_multiplier * clip_norm, 2);
    // The most noise a sum carries: max_clients shares.
    const double most_noise = variance * n / min_survivors;
    if (signal >= limit) continue;
    const double log_p = std::log(2 * d) + SkellamLogTail(most_noise, limit - signal);
    if (log_p > std::log(kMaxWrapProbability)) continue;
    if (l2 > 2 * s * clip_norm) break;
    p.scale = s;
    p.l2_bound = l2;
    p.l1_bound = RoundedL1Bound(l2, d);
    p.variance = variance;
    p.wrap_probability = std::exp(log_p);
    return p;
  }
  return InvalidArgumentError(fmt::format(
      "privacy: no fixed-point scale keeps the 32-bit sum from wrapping: {} clients "
      "(rounds.max_clients_per_round) of L2 norm privacy.clip_norm {} with noise "
      "privacy.noise_multiplier {} over {} values need more than 31 bits once the grid is fine "
      "enough that rounding at most doubles the sensitivity; lower rounds.max_clients_per_round "
      "or privacy.noise_multiplier",
      max_clients, clip_norm, noise_multiplier, dim));
}

SkellamSampler::SkellamSampler(SecretBytes seed)
    : key_(std::move(seed)), block_(kBlockWords * sizeof(uint64_t)), next_(kBlockWords) {}

StatusOr<SkellamSampler> SkellamSampler::Create(SecretBytes seed) {
  if (seed.size() != kSeedBytes) {
    return InvalidArgumentError("noise seed has " + std::to_string(seed.size()) +
                                " bytes, expected 32");
  }
  return SkellamSampler(std::move(seed));
}

void SkellamSampler::Refill() {
  // Block i is ChaCha20's keystream under the seed with nonce i.
  uint8_t nonce[crypto_stream_chacha20_NONCEBYTES] = {};
  for (int b = 0; b < 8; ++b) nonce[b] = static_cast<uint8_t>(counter_ >> (8 * b));
  ++counter_;
  crypto_stream_chacha20(block_.bytes().data(), block_.size(), nonce, key_.bytes().data());
  next_ = 0;
}

double SkellamSampler::Uniform() {
  if (next_ == kBlockWords) Refill();
  uint64_t word;
  std::memcpy(&word, block_.bytes().data() + next_ * sizeof(uint64_t), sizeof(word));
  std::memset(block_.bytes().data() + next_ * sizeof(uint64_t), 0, sizeof(word));
  ++next_;
  const double u = (static_cast<double>(word >> 11) + 0.5) * 0x1.0p-53;
  word = 0;
  return u;
}

int64_t SkellamSampler::Poisson(double lambda) {
  if (!(lambda > 0)) return 0;
  if (lambda < 10) {
    // The product of uniforms falls below e^-λ after Poisson(λ) + 1 factors.
    const double limit = std::exp(-lambda);
    int64_t k = 0;
    for (double product = Uniform(); product > limit; product *= Uniform()) ++k;
    return k;
  }
  const double slam = std::sqrt(lambda);
  const double b = 0.931 + 2.53 * slam, a = -0.059 + 0.02483 * b;
  const double inv_alpha = 1.1239 + 1.1328 / (b - 3.4), vr = 0.9277 - 3.6224 / (b - 2);
  while (true) {
    const double u = Uniform() - 0.5, v = Uniform();
    const double us = 0.5 - std::abs(u);
    const int64_t k = static_cast<int64_t>(std::floor((2 * a / us + b) * u + lambda + 0.43));
    if (us >= 0.07 && v <= vr) return k;
    if (k < 0 || (us < 0.013 && v > us)) continue;
    if (std::log(v) + std::log(inv_alpha) - std::log(a / (us * us) + b) <=
        LogPoissonPmf(k, lambda)) {
      return k;
    }
  }
}

int64_t SkellamSampler::Skellam(double variance) {
  return Poisson(variance / 2) - Poisson(variance / 2);
}

Status EncodeSkellam(std::span<const float> delta, double clip_norm, double scale, double l2_bound,
                     double share_variance, Rng& rounding, SkellamSampler& noise,
                     std::span<uint32_t> out) {
  double norm2 = 0;
  for (float v : delta) norm2 += double{v} * v;
  if (!std::isfinite(norm2)) return InvalidArgumentError("local update has NaN or Inf");
  const double norm = std::sqrt(norm2);
  const double factor = scale * (norm > clip_norm ? clip_norm / norm : 1.0);
  // Conditional stochastic rounding: redraw until the L2 bound the
  // accountant assumes holds (each draw misses it with probability <= β).
  std::vector<int64_t> x(delta.size());
  bool within = false;
  for (int draw = 0; draw < kMaxRoundingDraws && !within; ++draw) {
    double rounded2 = 0;
    for (size_t i = 0; i < delta.size(); ++i) {
      const double y = factor * delta[i];
      const double lo = std::floor(y);
      x[i] = static_cast<int64_t>(lo) + (rounding.UniformDouble() < y - lo ? 1 : 0);
      rounded2 += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    }
    within = std::sqrt(rounded2) <= l2_bound;
  }
  // The rounded update before its noise is wiped, not just freed (a fill
  // before the free is a dead store the compiler may drop).
  const auto wipe = [&x] { sodium_memzero(x.data(), x.size() * sizeof(int64_t)); };
  if (!within) {
    wipe();
    return InternalError("distributed DP: no stochastic rounding met the L2 bound in " +
                         std::to_string(kMaxRoundingDraws) + " draws");
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    const int64_t noisy = x[i] + noise.Skellam(share_variance);
    out[i] = static_cast<uint32_t>(static_cast<uint64_t>(noisy));
  }
  wipe();
  return OkStatus();
}

void DecodeSkellam(std::span<const uint32_t> sum, double scale, std::span<float> out) {
  for (size_t i = 0; i < sum.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(static_cast<int32_t>(sum[i])) / scale);
  }
}

}  // namespace cohort::privacy
