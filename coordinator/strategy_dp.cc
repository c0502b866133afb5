#include "coordinator/strategy_dp.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <string>
#include <string_view>

#include "common/rng.h"
#include "coordinator/adaptive_clip.h"
#include "crypto/keys.h"
#include "crypto/prg.h"
#include "privacy/rdp_wor.h"

namespace cohort::coordinator {
namespace {

// Values per noise chunk: each chunk has its own derived key, so the random
// words of one chunk (2 per value, in SecretBytes) are all that is held.
constexpr size_t kNoiseChunk = size_t{1} << 16;
constexpr char kNoiseLabel[] = "cohort dp-fedavg noise v2";
constexpr char kSelectLabel[] = "cohort dp-fedavg cohort v1";
constexpr char kCountLabel[] = "cohort adaptive-clip count v1";

// A uniform double in (0, 1) from 64 random bits: the top 53, centred in
// their interval, so log() never sees 0.
double Uniform53(uint32_t hi, uint32_t lo) {
  const uint64_t bits = ((uint64_t{hi} << 32) | lo) >> 11;
  return (static_cast<double>(bits) + 0.5) * 0x1.0p-53;
}

// BLAKE2b keyed by the run key over `label`, the round, `index` and
// `inputs` (empty for the cohort's key).
SecretBytes DeriveKey(const SecretBytes& run_key, std::string_view label, uint32_t round,
                      uint64_t index, std::span<const uint8_t> inputs = {}) {
  uint8_t context[12];
  for (int b = 0; b < 4; ++b) context[b] = static_cast<uint8_t>(round >> (8 * b));
  for (int b = 0; b < 8; ++b) context[4 + b] = static_cast<uint8_t>(index >> (8 * b));
  std::array<uint8_t, 32> digest = crypto::Hash256(
      {std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(label.data()), label.size()),
       std::span<const uint8_t>(context), inputs},
      run_key.bytes());
  SecretBytes key(digest.size());
  std::memcpy(key.bytes().data(), digest.data(), digest.size());
  sodium_memzero(digest.data(), digest.size());
  return key;
}

// BLAKE2b-256 of `values`' bytes (little-endian floats, as the wire and the
// store hold them) into out[0, 32).
void DigestFloats(std::span<const float> values, std::span<uint8_t> out) {
  std::array<uint8_t, 32> digest = crypto::Hash256({std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes())});
  std::memcpy(out.data(), digest.data(), digest.size());
  sodium_memzero(digest.data(), digest.size());
}

}  // namespace

Status ChargeDpFedAvgRounds(privacy::RdpAccountant& accountant, double q, double noise_multiplier,
                            uint64_t rounds) {
  return privacy::ComposeSampledWithoutReplacement(
      accountant, q, noise_multiplier / kReplaceOneSensitivity, rounds);
}

SecretBytes NoiseInputs(std::span<const float> mean, std::span<const float> model) {
  SecretBytes inputs(kNoiseInputsBytes);
  DigestFloats(mean, inputs.bytes().subspan(0, 32));
  DigestFloats(model, inputs.bytes().subspan(32, 32));
  return inputs;
}

namespace {

// AddGaussianNoise's and CountNoise's arguments: a 32-byte key, 64 bytes of
// round inputs.
Status CheckNoiseKeyAndInputs(const SecretBytes& run_key, const SecretBytes& inputs) {
  if (run_key.size() != DpStrategy::kNoiseKeyBytes) {
    return InvalidArgumentError("noise key has " + std::to_string(run_key.size()) +
                                " bytes, expected 32");
  }
  if (inputs.size() != kNoiseInputsBytes) {
    return InvalidArgumentError("noise inputs have " + std::to_string(inputs.size()) +
                                " bytes, expected 64");
  }
  return OkStatus();
}

}  // namespace

Status AddGaussianNoise(const SecretBytes& run_key, uint32_t round, const SecretBytes& inputs,
                        double stddev, std::span<float> values) {
  COHORT_RETURN_IF_ERROR(CheckNoiseKeyAndInputs(run_key, inputs));
  for (size_t start = 0, chunk = 0; start < values.size(); start += kNoiseChunk, ++chunk) {
    std::span<float> part = values.subspan(start, std::min(kNoiseChunk, values.size() - start));
    // Two words per value, an even count of values, 16 words at a time
    // (so the buffer's size keeps sodium_malloc's pointer aligned).
    const size_t words = ((part.size() + 1) / 2 * 4 + 15) / 16 * 16;
    SecretBytes random(words * sizeof(uint32_t));
    std::span<uint32_t> w(reinterpret_cast<uint32_t*>(random.bytes().data()), words);
    const SecretBytes key = DeriveKey(run_key, kNoiseLabel, round, chunk, inputs.bytes());
    COHORT_RETURN_IF_ERROR(crypto::AddMask(key, w, /*subtract=*/false, crypto::PrgImpl::kAuto,
                                           crypto::MaskPrg::kChaCha20));
    for (size_t i = 0; i < part.size(); i += 2) {
      // Box-Muller: two independent N(0, 1) from two uniforms.
      const double r = std::sqrt(-2.0 * std::log(Uniform53(w[2 * i], w[2 * i + 1])));
      const double theta = 2.0 * std::numbers::pi * Uniform53(w[2 * i + 2], w[2 * i + 3]);
      part[i] = static_cast<float>(part[i] + stddev * r * std::cos(theta));
      if (i + 1 < part.size()) {
        part[i + 1] = static_cast<float>(part[i + 1] + stddev * r * std::sin(theta));
      }
    }
  }
  return OkStatus();
}

StatusOr<double> CountNoise(const SecretBytes& run_key, uint32_t round, const SecretBytes& inputs,
                            double stddev) {
  COHORT_RETURN_IF_ERROR(CheckNoiseKeyAndInputs(run_key, inputs));
  // 16 words (sodium_malloc's alignment, as AddGaussianNoise); 4 are used.
  SecretBytes random(16 * sizeof(uint32_t));
  std::span<uint32_t> w(reinterpret_cast<uint32_t*>(random.bytes().data()), 16);
  const SecretBytes key = DeriveKey(run_key, kCountLabel, round, 0, inputs.bytes());
  COHORT_RETURN_IF_ERROR(crypto::AddMask(key, w, /*subtract=*/false, crypto::PrgImpl::kAuto,
                                         crypto::MaskPrg::kChaCha20));
  const double r = std::sqrt(-2.0 * std::log(Uniform53(w[0], w[1])));
  const double theta = 2.0 * std::numbers::pi * Uniform53(w[2], w[3]);
  return stddev * r * std::cos(theta);
}

DpStrategy::DpStrategy(std::unique_ptr<Strategy> inner, const config::RunConfig& config)
    : StrategyDecorator(std::move(inner)), privacy_(config.privacy()) {
  clip_ = privacy_.clip_norm();
  update_noise_multiplier_ = privacy_.noise_multiplier();
}

StatusOr<std::unique_ptr<DpStrategy>> DpStrategy::Wrap(std::unique_ptr<Strategy> inner,
                                                       const config::RunConfig& config) {
  if (!config.has_privacy()) return InvalidArgumentError("privacy: the config has no privacy");
  std::unique_ptr<DpStrategy> dp(new DpStrategy(std::move(inner), config));
  if (config.privacy().has_adaptive_clip()) COHORT_RETURN_IF_ERROR(dp->SetUpAdaptiveClip(config));
  return dp;
}

Status DpStrategy::SetUpAdaptiveClip(const config::RunConfig& config) {
  COHORT_ASSIGN_OR_RETURN(
      update_noise_multiplier_,
      AdaptiveUpdateNoiseMultiplier(privacy_.noise_multiplier(),
                                    privacy_.adaptive_clip().clipped_count_stddev()));
  max_clip_ = config.server().max_update_norm();
  return OkStatus();
}

StatusOr<privacy::SkellamParams> DpStrategy::SkellamAt(double clip) const {
  StatusOr<privacy::SkellamParams> p = privacy::ChooseSkellamParams(
      clip, update_noise_multiplier_, grid_max_clients_, grid_min_survivors_, grid_dim_);
  if (p.ok() || !adaptive()) return p;
  // The grid's error names the fixed-clip settings; under adaptive clipping
  // its numbers are this round's C and the update's share of the noise.
  return Status(p.status().code(),
                p.status().message() +
                    fmt::format(" (under adaptive clipping the clip norm is this round's C, {:g}, "
                                "and the noise multiplier is the update's share z_update {:.6g}, "
                                "what privacy.noise_multiplier {:g} leaves beside "
                                "privacy.adaptive_clip.clipped_count_stddev {:g})",
                                clip, update_noise_multiplier_, privacy_.noise_multiplier(),
                                privacy_.adaptive_clip().clipped_count_stddev()));
}

Status DpStrategy::SetUpSkellam(uint32_t max_clients, uint32_t min_survivors, size_t dim) {
  grid_max_clients_ = max_clients;
  grid_min_survivors_ = min_survivors;
  grid_dim_ = dim;
  // Without adaptive clipping: privacy.clip_norm and z, the grid fixed for
  // the run (as before adaptive clipping existed).
  COHORT_ASSIGN_OR_RETURN(skellam_, SkellamAt(clip_));
  if (adaptive()) {
    COHORT_ASSIGN_OR_RETURN(count_skellam_, privacy::ChooseClipCountParams(
                                                privacy_.adaptive_clip().clipped_count_stddev(),
                                                max_clients, min_survivors));
  }
  return OkStatus();
}

Status DpStrategy::TakeTheCount() {
  if (!count_skellam_) return OkStatus();
  if (!noisy_count_) {
    return FailedPreconditionError(
        "privacy: adaptive clipping under distributed DP, but the round's sum carried no "
        "clipped-count word");
  }
  // The count is the sum of the clients' words, and one client's word can
  // hold anything up to 2^31: clamped to what a cohort can count (post-
  // processing, free of privacy cost), a hostile word moves C at most as
  // far as a whole honest cohort on one side would, exp(±learning rate).
  if (!std::isfinite(*noisy_count_)) {
    return InvalidArgumentError("privacy: the round's clipped count is not finite");
  }
  const double count = std::clamp(*noisy_count_, 0.0, static_cast<double>(cohort_));
  next_clip_ = NextClipNorm(clip_, count, static_cast<uint32_t>(cohort_), privacy_.adaptive_clip(),
                            max_clip_);
  // The next round's grid follows its C; a C no grid fits leaves the model
  // unchanged (the round aborts) and C where it was.
  auto next = SkellamAt(next_clip_);
  if (!next.ok()) {
    return InvalidArgumentError("privacy: adaptive clip norm " + fmt::format("{}", next_clip_) +
                                ": " + next.status().message());
  }
  next_skellam_ = *next;
  count_noised_ = true;
  return OkStatus();
}

void DpStrategy::CountUpdate(std::span<const float> update) {
  if (adaptive() && IsUnclipped(update, clip_)) ++unclipped_;
}

Status DpStrategy::NoiseTheCount(const SecretBytes& inputs) {
  if (!adaptive()) return OkStatus();
  const config::AdaptiveClipConfig& a = privacy_.adaptive_clip();
  COHORT_ASSIGN_OR_RETURN(double noise,
                          CountNoise(noise_key_, round_, inputs, a.clipped_count_stddev()));
  next_clip_ =
      NextClipNorm(clip_, unclipped_ + noise, static_cast<uint32_t>(cohort_), a, max_clip_);
  count_noised_ = true;
  return OkStatus();
}

RoundClip DpStrategy::EndRoundClip() {
  if (!adaptive()) return {};
  RoundClip out{clip_, clip_};
  if (count_noised_) clip_ = out.next_clip_norm = next_clip_;
  if (count_noised_ && next_skellam_) skellam_ = *next_skellam_;
  count_noised_ = false;
  unclipped_ = 0;
  noisy_count_.reset();
  next_skellam_.reset();
  return out;
}

Status DpStrategy::RestoreClip(std::span<const store::RoundRecord> rounds) {
  clip_ = privacy_.clip_norm();
  if (!adaptive()) return OkStatus();
  for (const store::RoundRecord& r : rounds) {
    if (r.dp_next_clip_norm == 0) continue;  // A record from before adaptive clipping.
    // The rule keeps C in [kMinAdaptiveClip, max_update_norm] (no upper
    // bound when that is 0); a stored C outside came from elsewhere, and a
    // huge one would make every round's noise infinite.
    const double c = r.dp_next_clip_norm;
    if (!(c >= kMinAdaptiveClip) || std::isinf(c) || (max_clip_ > 0 && c > max_clip_)) {
      return DataLossError(fmt::format(
          "round {}: adaptive clip norm {:g} is outside [{:g}, {}] (the range the rule keeps it "
          "in)",
          r.round, c, kMinAdaptiveClip, max_clip_ > 0 ? fmt::format("{:g}", max_clip_) : "inf"));
    }
    clip_ = r.dp_next_clip_norm;
  }
  // Distributed DP: the grid of the C the next round clips at.
  if (count_skellam_) {
    COHORT_ASSIGN_OR_RETURN(skellam_, SkellamAt(clip_));
  }
  return OkStatus();
}

std::vector<std::string> DpStrategy::SelectCohort(const CohortRequest& request) const {
  if (!has_noise_key()) return {};
  CohortRequest secret = request;
  const SecretBytes key = DeriveKey(noise_key_, kSelectLabel, request.round, 0);
  uint64_t seed = 0;
  std::memcpy(&seed, key.bytes().data(), sizeof(seed));
  Rng rng(seed);
  rng.Shuffle(std::span<std::string>(secret.active));
  sodium_memzero(&seed, sizeof(seed));
  return inner_->SelectCohort(secret);
}

Status DpStrategy::RestoreAdaptiveSkellam(std::span<const store::RoundRecord> rounds) {
  // Each round at the grid of the C it clipped at, in round order (the
  // order the live run charged them in, so the sums are the same bits).
  for (const store::RoundRecord& r : rounds) {
    if (r.dp_sampling_rate <= 0) continue;
    const double clip = r.dp_clip_norm > 0 ? r.dp_clip_norm : privacy_.clip_norm();
    auto params = SkellamAt(clip);
    if (!params.ok()) {
      return DataLossError("round " + std::to_string(r.round) + ": adaptive clip norm " +
                           fmt::format("{}", clip) +
                           " has no distributed-DP grid: " + params.status().message());
    }
    COHORT_RETURN_IF_ERROR(Charge(accountant_, released_, r.dp_sampling_rate, 1, &*params));
  }
  return OkStatus();
}

Status DpStrategy::Restore(std::span<const store::RoundRecord> rounds) {
  // Equal rates compose at once: one evaluation of the series per rate.
  std::map<double, uint64_t> steps;
  for (const store::RoundRecord& r : rounds) {
    if (!(r.dp_sampling_rate >= 0 && r.dp_sampling_rate <= 1)) {
      return DataLossError("round " + std::to_string(r.round) + ": privacy sampling rate " +
                           fmt::format("{}", r.dp_sampling_rate) + " is not in [0, 1]");
    }
    if (r.dp_sampling_rate > 0) ++steps[r.dp_sampling_rate];
  }
  accountant_ = privacy::RdpAccountant();
  released_ = privacy::RdpAccountant();
  const bool charged = !steps.empty();
  if (count_skellam_) {
    COHORT_RETURN_IF_ERROR(RestoreAdaptiveSkellam(rounds));
  } else {
    for (const auto& [q, n] : steps) {
      COHORT_RETURN_IF_ERROR(Charge(accountant_, released_, q, n));
    }
  }
  epsilon_ = 0;
  epsilon_released_ = 0;
  if (charged) {
    COHORT_RETURN_IF_ERROR(Spend(accountant_, released_, epsilon_, epsilon_released_));
  }
  return OkStatus();
}

StatusOr<DpStrategy::Plan> DpStrategy::PlanRound(size_t cohort, size_t population) const {
  if (cohort == 0 || population < cohort) {
    return InvalidArgumentError("privacy: a cohort of " + std::to_string(cohort) + " from " +
                                std::to_string(population) + " clients");
  }
  Plan plan;
  plan.sampling_rate = static_cast<double>(cohort) / static_cast<double>(population);
  privacy::RdpAccountant next = accountant_, next_released = released_;
  COHORT_RETURN_IF_ERROR(Charge(next, next_released, plan.sampling_rate, 1));
  double released = 0;
  COHORT_RETURN_IF_ERROR(Spend(next, next_released, plan.epsilon_after, released));
  if (skellam_) plan.epsilon_released_model_after = released;
  plan.budget_epsilon_after = BudgetOnReleasedModel() ? released : plan.epsilon_after;
  plan.within_budget =
      privacy_.epsilon_budget() <= 0 || plan.budget_epsilon_after <= privacy_.epsilon_budget();
  return plan;
}

void DpStrategy::BeginRound(uint32_t round, size_t cohort, size_t population) {
  round_ = round;
  cohort_ = cohort;
  sampling_rate_ =
      population > 0 ? static_cast<double>(cohort) / static_cast<double>(population) : 1.0;
  noised_ = false;
  unclipped_ = 0;
  count_noised_ = false;
  noisy_count_.reset();
  next_skellam_.reset();
}

RoundPrivacy DpStrategy::EndRound() {
  if (!noised_) return {0, epsilon_, epsilon_released_model()};
  noised_ = false;
  // The config validator bounds σ and δ, so neither call can fail here.
  if (Charge(accountant_, released_, sampling_rate_, 1).ok()) {
    (void)Spend(accountant_, released_, epsilon_, epsilon_released_);
  }
  return {sampling_rate_, epsilon_, epsilon_released_model()};
}

std::string DpStrategy::BudgetViewName() const {
  if (!skellam_) return "";
  return BudgetOnReleasedModel() ? "for the released model" : "against the coordinator";
}

Status DpStrategy::Charge(privacy::RdpAccountant& accountant, privacy::RdpAccountant& released,
                          double q, uint64_t steps,
                          const privacy::SkellamParams* round_params) const {
  if (!skellam_) return ChargeDpFedAvgRounds(accountant, q, privacy_.noise_multiplier(), steps);
  const privacy::SkellamParams& params = round_params != nullptr ? *round_params : *skellam_;
  if (count_skellam_) {
    // Adaptive clipping: the update at z_Δ and the count, composed (the
    // pair spends what the update alone at z would; privacy/skellam.h).
    COHORT_RETURN_IF_ERROR(
        privacy::ChargeAdaptiveSkellamRounds(accountant, params, *count_skellam_, steps));
    return privacy::ChargeAdaptiveSkellamRoundsForReleasedModel(released, params, *count_skellam_,
                                                                q, steps);
  }
  COHORT_RETURN_IF_ERROR(privacy::ChargeSkellamRounds(accountant, params, steps));
  return privacy::ChargeSkellamRoundsForReleasedModel(released, params, q, steps);
}

Status DpStrategy::Spend(const privacy::RdpAccountant& accountant,
                         const privacy::RdpAccountant& released, double& epsilon,
                         double& epsilon_released) const {
  COHORT_ASSIGN_OR_RETURN(privacy::PrivacySpent spent, accountant.Spent(privacy_.target_delta()));
  epsilon = spent.epsilon;
  if (!skellam_) return OkStatus();
  COHORT_ASSIGN_OR_RETURN(spent, released.Spent(privacy_.target_delta()));
  epsilon_released = spent.epsilon;
  return OkStatus();
}

Status DpStrategy::Aggregate(std::span<const float> mean_delta, std::span<float> model) {
  if (skellam_) {
    // The clients' noise is in the unmasked sum already (distributed DP).
    if (cohort_ == 0) return FailedPreconditionError("privacy: Aggregate before BeginRound");
    // The unmasked sum is charged even when C cannot move (TakeTheCount
    // fails and the round aborts): the coordinator has seen it.
    noised_ = true;
    COHORT_RETURN_IF_ERROR(TakeTheCount());
    return inner_->Aggregate(mean_delta, model);
  }
  if (!has_noise_key()) {
    return FailedPreconditionError(
        "privacy: no noise key (the run directory's privacy_noise.key); nothing is released "
        "without noise");
  }
  if (cohort_ == 0) return FailedPreconditionError("privacy: Aggregate before BeginRound");
  std::vector<float> noisy(mean_delta.begin(), mean_delta.end());
  // z C, or with adaptive clipping z_Δ C at the round's C.
  const double stddev = update_noise_multiplier_ * clip_ / static_cast<double>(cohort_);
  // Keyed by the round's inputs too: a copy of the run directory resumed
  // beside the original, given other updates, draws independent noise
  // instead of the same noise over another sum (whose difference from
  // the original's model would be noise-free).
  const SecretBytes inputs = NoiseInputs(mean_delta, model);
  COHORT_RETURN_IF_ERROR(AddGaussianNoise(noise_key_, round_, inputs, stddev, noisy));
  COHORT_RETURN_IF_ERROR(NoiseTheCount(inputs));
  noised_ = true;
  return inner_->Aggregate(noisy, model);
}

}  // namespace cohort::coordinator
