// Central differential privacy, DP-FedAvg (McMahan et al. 2018, "Learning
// Differentially Private Recurrent Language Models", Algorithm 1 with the
// fixed-denominator estimator f~_f and uniform weights w_k = 1): a Strategy
// decorator, as Flower's DifferentialPrivacyServerSideFixedClipping wraps
// another strategy. The round engine aggregates the round's updates with
// aggregation::NewClippedSum (each clipped to privacy.clip_norm, summed
// with equal weights, divided by the cohort size); this decorator adds
// N(0, σ²C²) / cohort to every coordinate of that mean (the noise of the
// sum, divided like it) and hands the noisy mean to the wrapped strategy's
// server step. Selection, tasks, evaluation and the server state are the
// wrapped strategy's.
//
// Accounting: each round that draws noise is one step of the Gaussian
// mechanism on a fixed-size cohort sampled without replacement, q = cohort /
// the clients it was drawn from (privacy/rdp_wor.h, Wang, Balle,
// Kasiviswanathan 2019), which is what SelectCohort draws. That analysis is
// for replace-one adjacency (the population size is public; one client's
// data is swapped for other data). Replacing one client's clipped update u
// (‖u‖ <= C) by u' moves the sum by ‖u - u'‖ <= 2C, so the noise σC is a
// replace-one noise multiplier of σ / 2 (kReplaceOneSensitivity), and that is
// what is composed. The per-round q and ε go into the store's round records,
// from which a resumed run rebuilds the accountant.
//
// The noise is a function of a 32-byte run secret (the run directory's
// privacy_noise.key, coordinator/noise_key.h), the round and digests of
// the round's un-noised mean and starting model: resuming replays a
// round's noise bit for bit, other inputs get independent noise, and
// nobody without the key (the store holds none of it) can take the noise
// out of the models. Each
// round's key and random words live in SecretBytes, wiped after use.
#ifndef COHORT_COORDINATOR_STRATEGY_DP_H_
#define COHORT_COORDINATOR_STRATEGY_DP_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/secret_bytes.h"
#include "coordinator/strategy.h"
#include "privacy/rdp_accountant.h"
#include "privacy/skellam.h"

namespace cohort::coordinator {

// The L2 distance, in clip norms, by which replacing one client's data can
// move the clipped sum: its update u and the replacement's u' each have
// norm <= C, and ‖u - u'‖ <= 2C.
inline constexpr double kReplaceOneSensitivity = 2.0;

// Charges `rounds` DP-FedAvg rounds of noise multiplier `noise_multiplier`
// (noise σC on the sum) with cohorts of q x the population, drawn without
// replacement, to `accountant`: Theorem 27 of Wang et al. at
// z = σ / kReplaceOneSensitivity. kInvalidArgument as
// privacy::ComposeSampledWithoutReplacement.
Status ChargeDpFedAvgRounds(privacy::RdpAccountant& accountant, double q, double noise_multiplier,
                            uint64_t rounds = 1);

// What a round record says about privacy.
struct RoundPrivacy {
  double sampling_rate = 0;  // q of the round's noise; 0: it drew none.
  // ε of the run after the round, at privacy.target_delta: central DP's,
  // or distributed DP's against the coordinator (no amplification).
  double epsilon = 0;
  // Distributed DP's ε for the released model (amplified at q); -1 under
  // central DP.
  double epsilon_released_model = -1;
};

// What a round record says about adaptive clipping (privacy.adaptive_clip).
struct RoundClip {
  double clip_norm = 0;       // The C the round clipped at; 0: a fixed clip.
  double next_clip_norm = 0;  // The C the next round clips at.
};

class DpStrategy final : public StrategyDecorator {
 public:
  // kInvalidArgument when `config` has no privacy section.
  static StatusOr<std::unique_ptr<DpStrategy>> Wrap(std::unique_ptr<Strategy> inner,
                                                    const config::RunConfig& config);

  // The run secret (32 bytes); Aggregate refuses to run without one.
  void SetNoiseKey(SecretBytes key) { noise_key_ = std::move(key); }
  bool has_noise_key() const { return noise_key_.size() == kNoiseKeyBytes; }

  // Rebuilds the accountant from the rounds a store recorded (their
  // sampling rates). kDataLoss, naming the round, for a rate outside [0, 1].
  Status Restore(std::span<const store::RoundRecord> rounds);

  // Before a round of `cohort` clients drawn from `population`: its q and
  // the ε the run would reach with it, in each view (RoundPrivacy's), and
  // in the one privacy.budget_view picks (central DP: its only one).
  struct Plan {
    double sampling_rate = 0;
    double epsilon_after = 0;
    double epsilon_released_model_after = -1;
    double budget_epsilon_after = 0;
    bool within_budget = true;  // Always, without privacy.epsilon_budget.
  };
  StatusOr<Plan> PlanRound(size_t cohort, size_t population) const;
  // The round whose mean Aggregate will noise next: its number (the noise
  // is keyed by it, the mean and the model), its cohort (the denominator) and population (q).
  void BeginRound(uint32_t round, size_t cohort, size_t population);
  // The round is over: when Aggregate drew its noise, the round is charged
  // (a model that then fails to commit was still computed from it).
  RoundPrivacy EndRound();

  // Distributed DP (privacy.mechanism DISTRIBUTED_SKELLAM): the clients
  // noise their own updates with `params`, so Aggregate adds nothing and
  // needs no noise key, and each round is charged as the Skellam
  // mechanism's (privacy/skellam.h) instead of the Gaussian's, twice:
  // against the coordinator, who knows the cohort (unsampled,
  // ChargeSkellamRounds), and for the released model, to whoever does not
  // (amplified at q, ChargeSkellamRoundsForReleasedModel). Set before
  // Restore.
  void SetSkellam(const privacy::SkellamParams& params) { skellam_ = params; }
  const std::optional<privacy::SkellamParams>& skellam() const { return skellam_; }
  // Distributed DP's grid chosen here (privacy::ChooseSkellamParams) for
  // sums of at most `max_clients` inputs, shares sized for `min_survivors`,
  // `dim` values, at the current C and the update's noise multiplier: what
  // SetSkellam would be given without adaptive clipping. With adaptive
  // clipping the grid follows C (each round's at that round's C, the update
  // noised at z_Δ), and the count word's grid is chosen too
  // (privacy::ChooseClipCountParams). Set before Restore and RestoreClip.
  // kInvalidArgument as those two.
  Status SetUpSkellam(uint32_t max_clients, uint32_t min_survivors, size_t dim);
  // Adaptive clipping under distributed DP: the count word's grid and share
  // (nullopt otherwise).
  const std::optional<privacy::SkellamParams>& clip_count_skellam() const { return count_skellam_; }
  // Adaptive clipping under distributed DP: the round's unmasked count of
  // unclipped updates (the survivors' bits plus their noise, in count
  // units), between BeginRound and Aggregate; Aggregate moves C from it.
  void SetClipCount(double noisy_count) { noisy_count_ = noisy_count; }

  // The run's ε (central DP's, or distributed DP's against the
  // coordinator), distributed DP's for the released model (-1 under central
  // DP), and the one the budget stop uses.
  double epsilon() const { return epsilon_; }
  double epsilon_released_model() const { return skellam_ ? epsilon_released_ : -1; }
  double budget_epsilon() const { return BudgetOnReleasedModel() ? epsilon_released_ : epsilon_; }
  // How the stop and status lines name the budget's view: "" under
  // central DP (one view), else "against the coordinator" or "for the
  // released model".
  std::string BudgetViewName() const;
  const config::PrivacyConfig& privacy() const { return privacy_; }

  // Adaptive clipping (privacy.adaptive_clip, coordinator/adaptive_clip.h):
  // under central DP the coordinator takes each bit (CountUpdate) and noises
  // the count; under distributed DP the clients do, and the count arrives
  // unmasked (SetClipCount). The C the round in progress clips at:
  // privacy.clip_norm, or with adaptive clipping the rule's current C.
  double clip_norm() const { return clip_; }
  bool adaptive() const { return privacy_.has_adaptive_clip(); }
  // The update's noise multiplier: z_Δ with adaptive clipping, else z.
  double update_noise_multiplier() const { return update_noise_multiplier_; }
  // b_i of a cohort member's plain update (its norm before clipping against
  // clip_norm()): call once for each update the round's sum holds, between
  // BeginRound and Aggregate. Nothing without adaptive clipping.
  void CountUpdate(std::span<const float> update);
  // The round is over (beside EndRound): the C it clipped at and the C the
  // next round clips at, which the rule moved from the noisy count when
  // Aggregate drew it. {0, 0} without adaptive clipping.
  RoundClip EndRoundClip();
  // C from the rounds a store recorded: the last record's next_clip_norm
  // (> 0 where the round had adaptive clipping), else privacy.clip_norm.
  // kDataLoss, naming the round, for a recorded C that is not finite or
  // not positive.
  Status RestoreClip(std::span<const store::RoundRecord> rounds);

  // Strategy. SelectCohort: the wrapped strategy's selection from the
  // available clients in an order secretly permuted under the noise key
  // (empty without a key): its seeded shuffle is public (config.seed), and
  // amplification by sampling holds only for a cohort an observer of the
  // models cannot predict. Aggregate: `mean_delta` is NewClippedSum's mean;
  // noise with standard deviation noise_multiplier x clip_norm / cohort is
  // added to it before the wrapped strategy steps (with adaptive clipping
  // z_Δ x the current C / cohort, and the count of unclipped updates gets
  // its own noise, CountNoise). kFailedPrecondition without a noise key or
  // BeginRound.
  std::vector<std::string> SelectCohort(const CohortRequest& request) const override;
  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override;

  static constexpr size_t kNoiseKeyBytes = 32;

 private:
  DpStrategy(std::unique_ptr<Strategy> inner, const config::RunConfig& config);

  // One round's charge: the Gaussian's, or the Skellam mechanism's against
  // the coordinator; and, with skellam_, the released model's into
  // `released`.
  // `round_params`: the round's grid (adaptive clipping), else skellam_.
  Status Charge(privacy::RdpAccountant& accountant, privacy::RdpAccountant& released, double q,
                uint64_t steps, const privacy::SkellamParams* round_params = nullptr) const;
  // ε of `accountant` and (with skellam_) of `released`, at target_delta.
  Status Spend(const privacy::RdpAccountant& accountant, const privacy::RdpAccountant& released,
               double& epsilon, double& epsilon_released) const;
  bool BudgetOnReleasedModel() const {
    return skellam_ && privacy_.budget_view() == config::RELEASED_MODEL;
  }
  // Adaptive clipping: z_Δ from the config (kInvalidArgument for count
  // noise that leaves none for the update).
  Status SetUpAdaptiveClip(const config::RunConfig& config);
  // Restore's charges under adaptive clipping with distributed DP.
  Status RestoreAdaptiveSkellam(std::span<const store::RoundRecord> rounds);
  // Distributed DP's grid at clip norm `clip` (SetUpSkellam's sizes).
  StatusOr<privacy::SkellamParams> SkellamAt(double clip) const;
  // Under distributed DP: moves next_clip_ from the unmasked count.
  Status TakeTheCount();
  // Draws the count's noise under the round's `inputs` and moves next_clip_.
  Status NoiseTheCount(const SecretBytes& inputs);

  config::PrivacyConfig privacy_;
  std::optional<privacy::SkellamParams> skellam_;
  SecretBytes noise_key_;
  privacy::RdpAccountant accountant_;
  privacy::RdpAccountant released_;  // Distributed DP's released-model view.
  double epsilon_ = 0;
  double epsilon_released_ = 0;
  // The round in progress (BeginRound).
  uint32_t round_ = 0;
  size_t cohort_ = 0;
  double sampling_rate_ = 0;
  bool noised_ = false;
  // Adaptive clipping: the current C, z_Δ (z without it), the bound C stays
  // under (server.max_update_norm, 0: none), the round's count of
  // unclipped updates, and the C the rule gave once the count was noised.
  double clip_ = 0;
  double update_noise_multiplier_ = 0;
  double max_clip_ = 0;
  uint32_t unclipped_ = 0;
  double next_clip_ = 0;
  bool count_noised_ = false;
  // Adaptive clipping under distributed DP: SetUpSkellam's sizes, the count
  // word's grid, the round's unmasked count and the next round's grid.
  uint32_t grid_max_clients_ = 0;
  uint32_t grid_min_survivors_ = 0;
  size_t grid_dim_ = 0;
  std::optional<privacy::SkellamParams> count_skellam_;
  std::optional<double> noisy_count_;
  std::optional<privacy::SkellamParams> next_skellam_;
};

// What a round's noise is keyed by besides the run secret and the round
// (kNoiseInputsBytes, in SecretBytes): BLAKE2b-256 of the un-noised mean's
// bytes, then BLAKE2b-256 of the model the step starts from.
inline constexpr size_t kNoiseInputsBytes = 64;
SecretBytes NoiseInputs(std::span<const float> mean, std::span<const float> model);

// Adds N(0, stddev²) to every value of `values`, drawn from a ChaCha20
// stream keyed by BLAKE2b(key = `run_key`, "cohort dp-fedavg noise v2",
// round, chunk, `inputs`): the same (run_key, round, inputs) gives the same
// noise, bit for bit (a resumed round replays it); another aggregate or
// another starting model at the same round gives independent noise (a copy
// of the run directory run beside the original cannot publish the same
// noise over other updates). Box-Muller on 53-bit uniforms.
// kInvalidArgument for a key that is not 32 bytes or inputs that are not
// kNoiseInputsBytes.
Status AddGaussianNoise(const SecretBytes& run_key, uint32_t round, const SecretBytes& inputs,
                        double stddev, std::span<float> values);

// Adaptive clipping's noise on the count of unclipped updates: one
// N(0, stddev²) draw from a ChaCha20 stream keyed by BLAKE2b(key = `run_key`,
// "cohort adaptive-clip count v1", round, `inputs`), a sub-stream apart
// from AddGaussianNoise's (another label), replayed bit for bit like it.
// Box-Muller on 53-bit uniforms. kInvalidArgument as AddGaussianNoise.
StatusOr<double> CountNoise(const SecretBytes& run_key, uint32_t round, const SecretBytes& inputs,
                            double stddev);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_STRATEGY_DP_H_
