#include "coordinator/adaptive_clip.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/strategy_dp.h"

namespace cohort::coordinator {
namespace {

// tests/data/adaptive_clip_golden.txt (make_adaptive_clip_golden.py, plain
// Python): the clip after each round of fixed noisy counts, and z_Δ.
TEST(AdaptiveClipTest, MatchesPlainPython) {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/adaptive_clip_golden.txt");
  ASSERT_TRUE(in) << "tests/data/adaptive_clip_golden.txt";
  std::string line;
  config::AdaptiveClipConfig adaptive;
  uint32_t cohort = 0;
  double clip = 0, max_clip = 0;
  int clips = 0, zs = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "run") {
      double gamma, eta;
      ASSERT_TRUE(s >> gamma >> eta >> cohort >> clip >> max_clip) << line;
      adaptive.set_target_quantile(gamma);
      adaptive.set_learning_rate(eta);
    } else if (kind == "clip") {
      int round;
      double count, want;
      ASSERT_TRUE(s >> round >> count >> want) << line;
      clip = NextClipNorm(clip, count, cohort, adaptive, max_clip);
      EXPECT_NEAR(clip, want, 1e-15 * want) << line;
      ++clips;
    } else if (kind == "zdelta") {
      double z, sb, want;
      ASSERT_TRUE(s >> z >> sb >> want) << line;
      auto got = AdaptiveUpdateNoiseMultiplier(z, sb);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(*got, want, 1e-13 * want) << line;
      // The pair spends what z alone did: z_Δ^-2 + (2 σ_b)^-2 = z^-2.
      EXPECT_NEAR(1 / (*got * *got) + 1 / (4 * sb * sb), 1 / (z * z), 1e-13 / (z * z));
      ++zs;
    } else {
      FAIL() << "unknown line: " << line;
    }
  }
  EXPECT_EQ(clips, 22);
  EXPECT_EQ(zs, 4);
}

TEST(AdaptiveClipTest, TheClipMovesTowardsTheTargetQuantile) {
  config::AdaptiveClipConfig a;  // Defaults: γ 0.5, η 0.2.
  EXPECT_EQ(a.target_quantile(), 0.5);
  EXPECT_EQ(a.learning_rate(), 0.2);
  // Everyone unclipped (b̄ = 1 > γ): C shrinks; no one (b̄ = 0): C grows;
  // exactly γ unclipped: C stays.
  EXPECT_LT(NextClipNorm(1.0, 10, 10, a), 1.0);
  EXPECT_GT(NextClipNorm(1.0, 0, 10, a), 1.0);
  EXPECT_EQ(NextClipNorm(1.0, 5, 10, a), 1.0);
  // Clamped to server.max_update_norm and to the 1e-9 floor.
  EXPECT_EQ(NextClipNorm(99.9, 0, 10, a, 100.0), 100.0);
  EXPECT_EQ(NextClipNorm(1e-9, 10, 10, a), kMinAdaptiveClip);
}

TEST(AdaptiveClipTest, TheBitIsTheNormAgainstTheClip) {
  const std::vector<float> update = {3.0f, 4.0f};  // Norm 5.
  EXPECT_TRUE(IsUnclipped(update, 5.0));
  EXPECT_FALSE(IsUnclipped(update, 4.999));
  EXPECT_TRUE(IsUnclipped(std::vector<float>{}, 0.0));
}

TEST(AdaptiveClipTest, RefusesCountNoiseThatLeavesNoBudgetForTheUpdate) {
  auto z = AdaptiveUpdateNoiseMultiplier(1.0, 0.5);
  EXPECT_EQ(z.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(z.status().message(),
            "privacy.adaptive_clip.clipped_count_stddev 0.5 must be finite and above "
            "privacy.noise_multiplier 1 / 2");
  EXPECT_FALSE(AdaptiveUpdateNoiseMultiplier(0.0, 1.0).ok());
  EXPECT_FALSE(AdaptiveUpdateNoiseMultiplier(1.0, INFINITY).ok());
  EXPECT_FALSE(AdaptiveUpdateNoiseMultiplier(1.0, std::nan("")).ok());
}

// The round engine's use of the rule (coordinator/strategy_dp.h): C moves
// each round from the noisy count of the updates it left unclipped.

config::RunConfig AdaptiveConfig(double z, double clip, double count_stddev, double gamma = 0.5,
                                 double eta = 0.2) {
  config::RunConfig c;
  c.set_seed(3);
  c.mutable_secagg()->set_aggregation(config::PLAIN);
  c.mutable_server()->set_max_update_norm(0);
  config::PrivacyConfig* p = c.mutable_privacy();
  p->set_noise_multiplier(z);
  p->set_clip_norm(clip);
  p->set_target_delta(1e-5);
  p->mutable_adaptive_clip()->set_target_quantile(gamma);
  p->mutable_adaptive_clip()->set_learning_rate(eta);
  p->mutable_adaptive_clip()->set_clipped_count_stddev(count_stddev);
  return c;
}

SecretBytes FilledKey(uint8_t fill) {
  SecretBytes key(32);
  std::fill(key.bytes().begin(), key.bytes().end(), fill);
  return key;
}

std::unique_ptr<DpStrategy> MakeAdaptiveDp(const config::RunConfig& config) {
  auto inner = MakeStrategy(config);
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto dp = DpStrategy::Wrap(std::move(inner).value(), config);
  EXPECT_TRUE(dp.ok()) << dp.status();
  (*dp)->SetNoiseKey(FilledKey(7));
  return std::move(dp).value();
}

// The round's record as the engine commits it: what EndRound and
// EndRoundClip report.
store::RoundRecord EndRoundRecord(DpStrategy& dp, uint32_t round) {
  store::RoundRecord r;
  r.round = round;
  const RoundPrivacy p = dp.EndRound();
  r.dp_sampling_rate = p.sampling_rate;
  r.dp_epsilon = p.epsilon;
  r.dp_epsilon_released_model = p.epsilon_released_model;
  const RoundClip clip = dp.EndRoundClip();
  r.dp_clip_norm = clip.clip_norm;
  r.dp_next_clip_norm = clip.next_clip_norm;
  return r;
}

// One round as the engine drives it: the cohort's updates counted, the
// mean noised and stepped, the round ended. The record the store would keep.
store::RoundRecord RunRound(DpStrategy& dp, uint32_t round,
                            const std::vector<std::vector<float>>& updates,
                            std::span<const float> mean, std::vector<float>& model) {
  dp.BeginRound(round, updates.size(), 10 * updates.size());
  for (const auto& u : updates) dp.CountUpdate(u);
  EXPECT_TRUE(dp.Aggregate(mean, model).ok());
  return EndRoundRecord(dp, round);
}

// 101 updates of norms 10^(-1 + i/50), 0.1 to 10 (the median is 1, the
// 90th percentile 10^0.8): from C = 0.1, C settles between the norms
// around the target quantile. σ_b is small (0.1 on a count of 101).
TEST(AdaptiveDpTest, TheClipConvergesToTheTargetQuantileOfTheNorms) {
  std::vector<std::vector<float>> updates;
  std::vector<double> norms;
  for (int i = 0; i <= 100; ++i) {
    norms.push_back(std::pow(10.0, -1 + i / 50.0));
    updates.push_back(
        {static_cast<float>(norms.back() * 0.6), static_cast<float>(norms.back() * 0.8)});
  }
  const std::vector<float> mean(4, 0.0f);
  for (double gamma : {0.5, 0.9}) {
    auto dp = MakeAdaptiveDp(AdaptiveConfig(0.05, 0.1, 0.1, gamma));
    std::vector<float> model(4, 0.0f);
    for (uint32_t round = 1; round <= 400; ++round) RunRound(*dp, round, updates, mean, model);
    const int k = static_cast<int>(gamma * 100);
    std::printf("gamma %.1f: C %.4f after 400 rounds; norms %.4f .. %.4f around the quantile\n",
                gamma, dp->clip_norm(), norms[k - 2], norms[k + 2]);
    EXPECT_GT(dp->clip_norm(), norms[k - 2]) << "gamma " << gamma;
    EXPECT_LT(dp->clip_norm(), norms[k + 2]) << "gamma " << gamma;
  }
}

// The count's noise is N(0, σ_b²): 100,000 draws (rounds 1..100000, fixed
// key and inputs), the same two-sided tests as the update noise's
// (strategy_dp_test.cc) at significance 1e-6.
TEST(AdaptiveDpTest, TheCountNoiseHasTheClaimedVariance) {
  const double sb = 2.5;
  const SecretBytes key = FilledKey(7);
  SecretBytes inputs(kNoiseInputsBytes);
  std::fill(inputs.bytes().begin(), inputs.bytes().end(), 3);
  constexpr uint32_t kN = 100000;
  double sum = 0, squares = 0;
  for (uint32_t round = 1; round <= kN; ++round) {
    auto x = CountNoise(key, round, inputs, sb);
    ASSERT_TRUE(x.ok()) << x.status();
    sum += *x;
    squares += *x * *x;
  }
  // Σ x² / σ_b² ~ χ²(n): scipy.stats.chi2.ppf(5e-7, 100000) = 97827.66,
  // chi2.ppf(1 - 5e-7, 100000) = 102202.91.
  const double chi2 = squares / (sb * sb);
  std::printf("count noise: n %u, sample variance / claimed %.5f, chi-square %.1f\n", kN,
              squares / kN / (sb * sb), chi2);
  EXPECT_GT(chi2, 97827.66);
  EXPECT_LT(chi2, 102202.91);
  // Mean 0: |mean| / (σ_b / √n) below norm.ppf(1 - 5e-7) = 4.8916.
  EXPECT_LT(std::abs(sum / kN) / (sb / std::sqrt(double{kN})), 4.8916);
  // Another label than the update noise's: not the same stream.
  std::vector<float> update_noise(2, 0.0f);
  ASSERT_TRUE(AddGaussianNoise(key, 1, inputs, sb, update_noise).ok());
  EXPECT_NE(static_cast<float>(*CountNoise(key, 1, inputs, sb)), update_noise[0]);
  EXPECT_FALSE(CountNoise(FilledKey(7), 1, SecretBytes(3), sb).ok());
  EXPECT_FALSE(CountNoise(SecretBytes(5), 1, inputs, sb).ok());
}

// The strategy moves C by the rule from Σ b + exactly that noise, keyed by
// the round and the round's inputs (the mean and the starting model).
TEST(AdaptiveDpTest, TheNextClipIsTheRuleOnTheNoisyCount) {
  const config::RunConfig config = AdaptiveConfig(1.0, 1.0, 2.5, 0.5, 0.3);
  auto dp = MakeAdaptiveDp(config);
  // Norms 0.5, 0.9, 1.0 (unclipped at C = 1) and 1.5, 4 (clipped).
  const std::vector<std::vector<float>> updates = {{0.5f}, {0.9f}, {1.0f}, {1.5f}, {-4.0f}};
  const std::vector<float> mean = {0.25f, -0.5f};
  std::vector<float> model = {1.0f, 2.0f};
  const SecretBytes inputs = NoiseInputs(mean, model);
  const store::RoundRecord r = RunRound(*dp, 3, updates, mean, model);
  const double noise = *CountNoise(FilledKey(7), 3, inputs, 2.5);
  EXPECT_NE(noise, 0.0);
  const double want = NextClipNorm(1.0, 3 + noise, 5, config.privacy().adaptive_clip());
  EXPECT_EQ(r.dp_clip_norm, 1.0);
  EXPECT_EQ(r.dp_next_clip_norm, want);
  EXPECT_EQ(dp->clip_norm(), want);
  std::printf("3 of 5 unclipped, noise %.4f: C 1 -> %.6f\n", noise, want);
  // Without adaptive clipping: no C is recorded and the clip stays.
  config::RunConfig fixed = config;
  fixed.mutable_privacy()->clear_adaptive_clip();
  auto plain = MakeAdaptiveDp(fixed);
  const store::RoundRecord f = RunRound(*plain, 3, updates, mean, model);
  EXPECT_EQ(f.dp_clip_norm, 0.0);
  EXPECT_EQ(f.dp_next_clip_norm, 0.0);
  EXPECT_EQ(plain->clip_norm(), 1.0);
}

// The update's noise is z_Δ C at the round's C, not z C nor the initial
// clip: z = 1, σ_b = 0.6 gives z_Δ = (1 - 1/1.44)^-1/2 = 1.809. Round 1
// moves C (all four updates unclipped: b̄ near 1 > γ, C shrinks); round 2
// noises a zero mean of 100,000 values, tested as strategy_dp_test does.
TEST(AdaptiveDpTest, TheUpdateNoiseIsZDeltaTimesTheCurrentClip) {
  const config::RunConfig config = AdaptiveConfig(1.0, 2.0, 0.6, 0.5, 1.0);
  auto dp = MakeAdaptiveDp(config);
  const double z_delta = 1 / std::sqrt(1 - 1 / 1.44);
  EXPECT_NEAR(dp->update_noise_multiplier(), z_delta, 1e-12);
  const std::vector<std::vector<float>> small(4, std::vector<float>{0.1f});
  std::vector<float> model(4, 0.0f);
  RunRound(*dp, 1, small, std::vector<float>(4, 0.0f), model);
  const double clip = dp->clip_norm();
  ASSERT_LT(clip, 0.8 * 2.0);  // Moved well away from the initial 2.
  constexpr size_t kN = 100000;
  std::vector<float> zeros(kN, 0.0f), noised(kN, 0.0f);
  dp->BeginRound(2, /*cohort=*/4, /*population=*/40);
  ASSERT_TRUE(dp->Aggregate(zeros, noised).ok());
  const double s = z_delta * clip / 4;
  double squares = 0;
  for (float v : noised) squares += double{v} * v;
  const double chi2 = squares / (s * s);
  std::printf("update noise at C %.4f: sample variance / (z_Delta C / m)^2 %.5f, chi-square %.1f\n",
              clip, squares / kN / (s * s), chi2);
  EXPECT_GT(chi2, 97827.66);
  EXPECT_LT(chi2, 102202.91);
}

// The pair (count, update) is charged as the update alone at z (the
// identity in adaptive_clip.h), not at z_Δ: the same ε as a fixed clip.
TEST(AdaptiveDpTest, TheAccountantChargesTheConfiguredNoiseMultiplier) {
  const config::RunConfig config = AdaptiveConfig(1.0, 1.0, 0.6);
  config::RunConfig fixed = config;
  fixed.mutable_privacy()->clear_adaptive_clip();
  auto adaptive = MakeAdaptiveDp(config), plain = MakeAdaptiveDp(fixed);
  ASSERT_GT(adaptive->update_noise_multiplier(), 1.5);
  EXPECT_EQ(adaptive->PlanRound(5, 50)->epsilon_after, plain->PlanRound(5, 50)->epsilon_after);
  const std::vector<std::vector<float>> updates(5, std::vector<float>{0.5f});
  std::vector<float> model(2, 0.0f);
  const std::vector<float> mean(2, 0.0f);
  const store::RoundRecord a = RunRound(*adaptive, 1, updates, mean, model);
  const store::RoundRecord b = RunRound(*plain, 1, updates, mean, model);
  EXPECT_GT(a.dp_epsilon, 0);
  EXPECT_EQ(a.dp_epsilon, b.dp_epsilon);
}

// Unit-level resume: a strategy rebuilt from the first k round records
// continues to the same model and C, bit for bit, as one that never stopped.
// (RoundEngine's PrivacyTest.AnAdaptiveClipResumesToTheSameModelAndClip
// does it through the SQLite store and a restarted engine.)
TEST(AdaptiveDpTest, ARestoredStrategyContinuesBitIdentically) {
  const config::RunConfig config = AdaptiveConfig(1.0, 1.0, 2.5, 0.5, 0.5);
  const std::vector<std::vector<float>> updates = {{0.3f, 0.4f}, {1.2f, 0.1f}, {2.0f, 2.0f}};
  auto mean_of = [](uint32_t round) { return std::vector<float>{0.01f * round, -0.02f, 0.005f}; };
  auto straight = MakeAdaptiveDp(config);
  std::vector<float> model_a(3, 0.0f);
  std::vector<store::RoundRecord> records;
  for (uint32_t r = 1; r <= 6; ++r)
    records.push_back(RunRound(*straight, r, updates, mean_of(r), model_a));

  auto first = MakeAdaptiveDp(config);
  std::vector<float> model_b(3, 0.0f);
  for (uint32_t r = 1; r <= 3; ++r) RunRound(*first, r, updates, mean_of(r), model_b);
  auto resumed = MakeAdaptiveDp(config);
  const std::span<const store::RoundRecord> kept(records.data(), 3);
  ASSERT_TRUE(resumed->Restore(kept).ok());
  ASSERT_TRUE(resumed->RestoreClip(kept).ok());
  EXPECT_EQ(resumed->clip_norm(), first->clip_norm());
  for (uint32_t r = 4; r <= 6; ++r) {
    const store::RoundRecord rec = RunRound(*resumed, r, updates, mean_of(r), model_b);
    EXPECT_EQ(rec.dp_clip_norm, records[r - 1].dp_clip_norm) << "round " << r;
  }
  EXPECT_EQ(model_b, model_a);
  EXPECT_EQ(resumed->clip_norm(), straight->clip_norm());
  EXPECT_EQ(resumed->epsilon(), straight->epsilon());
  EXPECT_NE(straight->clip_norm(), 1.0);
  // A recorded C that is not finite and positive is refused.
  records[1].dp_next_clip_norm = -0.5;
  Status s = resumed->RestoreClip(records);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "round 2: adaptive clip norm -0.5 is outside [1e-09, inf] (the range the rule keeps it "
            "in)");
  records[1].dp_next_clip_norm = 1e-12;
  EXPECT_EQ(resumed->RestoreClip(records).code(), StatusCode::kDataLoss);
  // With server.max_update_norm, above it too (a huge C would make every
  // round's noise infinite).
  config::RunConfig capped = config;
  capped.mutable_server()->set_max_update_norm(10);
  auto bounded = MakeAdaptiveDp(capped);
  records[1].dp_next_clip_norm = 1e300;
  s = bounded->RestoreClip(records);
  EXPECT_EQ(s.message(),
            "round 2: adaptive clip norm 1e+300 is outside [1e-09, 10] (the range the rule keeps "
            "it in)");
  records[1].dp_next_clip_norm = 10;
  EXPECT_TRUE(bounded->RestoreClip(records).ok());
}

// Adaptive clipping under distributed DP: the clients' noised bits arrive
// as the unmasked count (SetClipCount); the strategy adds no noise.

config::RunConfig DistributedAdaptiveConfig(double z, double clip, double count_stddev) {
  config::RunConfig c = AdaptiveConfig(z, clip, count_stddev, 0.5, 0.5);
  c.mutable_secagg()->set_aggregation(config::SECAGG_PLUS);
  c.mutable_privacy()->set_mechanism(config::DISTRIBUTED_SKELLAM);
  return c;
}

std::unique_ptr<DpStrategy> MakeDistributedDp(const config::RunConfig& config) {
  auto dp = MakeAdaptiveDp(config);
  EXPECT_TRUE(dp->SetUpSkellam(10, 8, 1000).ok());
  return dp;
}

// One distributed round: the unmasked count handed over, the mean stepped.
store::RoundRecord RunDistributedRound(DpStrategy& dp, uint32_t round, double noisy_count,
                                       std::vector<float>& model) {
  dp.BeginRound(round, 10, 100);
  dp.SetClipCount(noisy_count);
  const std::vector<float> mean(model.size(), 0.001f * round);
  EXPECT_TRUE(dp.Aggregate(mean, model).ok());
  return EndRoundRecord(dp, round);
}

// The update is noised at z_Δ on a grid that follows C; the count word has
// its own grid; the next C is the rule on the unmasked count over the
// cohort, and the next round's grid is chosen at it.
TEST(AdaptiveDistributedDpTest, TheUnmaskedCountMovesTheClipAndTheGridFollows) {
  const config::RunConfig config = DistributedAdaptiveConfig(1.0, 1.0, 0.6);
  auto dp = MakeDistributedDp(config);
  const double z_delta = *AdaptiveUpdateNoiseMultiplier(1.0, 0.6);
  auto at_one = privacy::ChooseSkellamParams(1.0, z_delta, 10, 8, 1000);
  ASSERT_TRUE(dp->skellam().has_value());
  EXPECT_EQ(dp->skellam()->variance, at_one->variance);
  EXPECT_EQ(dp->skellam()->l2_bound, at_one->l2_bound);
  ASSERT_TRUE(dp->clip_count_skellam().has_value());
  EXPECT_EQ(dp->clip_count_skellam()->scale, std::ldexp(1.0, 21));
  std::vector<float> model(4, 0.0f);
  const store::RoundRecord r = RunDistributedRound(*dp, 1, 8.3, model);
  const double want = NextClipNorm(1.0, 8.3, 10, config.privacy().adaptive_clip());
  EXPECT_EQ(r.dp_clip_norm, 1.0);
  EXPECT_EQ(r.dp_next_clip_norm, want);
  EXPECT_LT(want, 1.0);  // b̄ 0.83 > γ 0.5: C shrinks.
  EXPECT_EQ(dp->clip_norm(), want);
  auto at_next = privacy::ChooseSkellamParams(want, z_delta, 10, 8, 1000);
  EXPECT_EQ(dp->skellam()->scale, at_next->scale);
  EXPECT_EQ(dp->skellam()->variance, at_next->variance);
  // A round whose sum carries no count word does not move C.
  dp->BeginRound(2, 10, 100);
  const std::vector<float> mean(4, 0.0f);
  const Status s = dp->Aggregate(mean, model);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "privacy: adaptive clipping under distributed DP, but the round's sum carried no "
            "clipped-count word");
  (void)dp->EndRound();
  EXPECT_EQ(dp->EndRoundClip().next_clip_norm, want);
  // Without adaptive clipping nothing changes: no count grid, the fixed grid.
  config::RunConfig fixed = config;
  fixed.mutable_privacy()->clear_adaptive_clip();
  auto plain = MakeDistributedDp(fixed);
  EXPECT_FALSE(plain->clip_count_skellam().has_value());
  auto at_z = privacy::ChooseSkellamParams(1.0, 1.0, 10, 8, 1000);
  EXPECT_EQ(plain->skellam()->variance, at_z->variance);
  EXPECT_EQ(plain->skellam()->l2_bound, at_z->l2_bound);
}

// One client's count word can hold anything up to 2^31 (about ±1024
// counts at the grid of 2^21): the count is clamped to [0, cohort], so a
// round moves C at most exp(±learning rate), as a whole honest cohort on
// one side would. Central DP's rule is unchanged.
TEST(AdaptiveDistributedDpTest, AHostileCountWordMovesTheClipNoFurtherThanAWholeCohort) {
  const config::RunConfig config = DistributedAdaptiveConfig(1.0, 1.0, 0.6);
  const config::AdaptiveClipConfig& rule = config.privacy().adaptive_clip();
  for (const auto& [hostile, clamped] : {std::pair{1024.0, 10.0}, std::pair{-1024.0, 0.0},
                                         std::pair{1e300, 10.0}, std::pair{-11.5, 0.0}}) {
    auto dp = MakeDistributedDp(config);
    std::vector<float> model(4, 0.0f);
    const store::RoundRecord r = RunDistributedRound(*dp, 1, hostile, model);
    EXPECT_EQ(r.dp_next_clip_norm, NextClipNorm(1.0, clamped, 10, rule)) << hostile;
    EXPECT_GE(r.dp_next_clip_norm, std::exp(-0.5 * 0.5)) << hostile;
    EXPECT_LE(r.dp_next_clip_norm, std::exp(0.5 * 0.5)) << hostile;
  }
  auto dp = MakeDistributedDp(config);
  std::vector<float> model(4, 0.0f);
  dp->BeginRound(1, 10, 100);
  dp->SetClipCount(std::nan(""));
  const Status s = dp->Aggregate(std::vector<float>(4, 0.0f), model);
  EXPECT_EQ(s.message(), "privacy: the round's clipped count is not finite");
  (void)dp->EndRound();
  EXPECT_EQ(dp->EndRoundClip().next_clip_norm, 1.0);
}

// A start-up no grid fits names what its numbers are under adaptive
// clipping: this round's C and the update's share z_update, not the
// fixed-clip settings the grid's own message speaks of.
TEST(AdaptiveDistributedDpTest, ANoGridErrorSaysItsNumbersAreTheAdaptiveOnes) {
  auto dp = MakeAdaptiveDp(DistributedAdaptiveConfig(1.0, 0.25, 0.6));
  const Status s = dp->SetUpSkellam(1u << 30, 1, 1000000);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("privacy: no fixed-point scale keeps the 32-bit sum from wrapping"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find(" (under adaptive clipping the clip norm is this round's C, 0.25, "
                             "and the noise multiplier is the update's share z_update 1.80907, "
                             "what privacy.noise_multiplier 1 leaves beside "
                             "privacy.adaptive_clip.clipped_count_stddev 0.6)"),
            std::string::npos)
      << s;
}

// The accountant charges the update at z_Δ composed with the count
// (privacy::ChargeAdaptiveSkellamRounds): about what a fixed clip at z
// charges, and more than the update alone at z_Δ (a test that fails if the
// count is forgotten).
TEST(AdaptiveDistributedDpTest, TheAccountantChargesTheConfiguredNoiseMultiplier) {
  const config::RunConfig config = DistributedAdaptiveConfig(1.0, 1.0, 0.6);
  config::RunConfig fixed = config;
  fixed.mutable_privacy()->clear_adaptive_clip();
  auto adaptive = MakeDistributedDp(config), plain = MakeDistributedDp(fixed);
  const double a = adaptive->PlanRound(10, 100)->epsilon_after;
  const double b = plain->PlanRound(10, 100)->epsilon_after;
  privacy::RdpAccountant alone;
  ASSERT_TRUE(privacy::ChargeSkellamRounds(alone, *adaptive->skellam()).ok());
  const double c = alone.Spent(1e-5)->epsilon;
  std::printf("one round: adaptive %.6g, fixed clip at z %.6g, update alone at z_delta %.6g\n", a,
              b, c);
  EXPECT_NEAR(a / b, 1.0, 0.01);
  EXPECT_GT(a, 1.2 * c);
  std::vector<float> model(4, 0.0f);
  const store::RoundRecord r = RunDistributedRound(*adaptive, 1, 5, model);
  EXPECT_EQ(r.dp_epsilon, a);
  EXPECT_GT(r.dp_epsilon_released_model, 0);
}

// A strategy rebuilt from the first three records (C and the accountant,
// each round charged at the grid of its recorded C) continues to the same
// C, grid and ε, bit for bit, as one that never stopped.
TEST(AdaptiveDistributedDpTest, ARestoredStrategyContinuesBitIdentically) {
  const config::RunConfig config = DistributedAdaptiveConfig(1.0, 0.5, 0.6);
  const double counts[] = {9.1, 8.7, 2.2, 6.4, 7.9, 1.5};
  auto straight = MakeDistributedDp(config);
  std::vector<float> model_a(4, 0.0f);
  std::vector<store::RoundRecord> records;
  for (uint32_t r = 1; r <= 6; ++r) {
    records.push_back(RunDistributedRound(*straight, r, counts[r - 1], model_a));
  }
  auto resumed = MakeDistributedDp(config);
  const std::span<const store::RoundRecord> kept(records.data(), 3);
  ASSERT_TRUE(resumed->Restore(kept).ok());
  ASSERT_TRUE(resumed->RestoreClip(kept).ok());
  EXPECT_EQ(resumed->clip_norm(), records[2].dp_next_clip_norm);
  EXPECT_EQ(resumed->epsilon(), records[2].dp_epsilon);
  EXPECT_EQ(resumed->epsilon_released_model(), records[2].dp_epsilon_released_model);
  std::vector<float> model_b(4, 0.0f);
  for (uint32_t r = 4; r <= 6; ++r) {
    const store::RoundRecord rec = RunDistributedRound(*resumed, r, counts[r - 1], model_b);
    EXPECT_EQ(rec.dp_clip_norm, records[r - 1].dp_clip_norm) << "round " << r;
    EXPECT_EQ(rec.dp_next_clip_norm, records[r - 1].dp_next_clip_norm) << "round " << r;
    EXPECT_EQ(rec.dp_epsilon, records[r - 1].dp_epsilon) << "round " << r;
    EXPECT_EQ(rec.dp_epsilon_released_model, records[r - 1].dp_epsilon_released_model);
  }
  EXPECT_EQ(resumed->skellam()->variance, straight->skellam()->variance);
  EXPECT_NE(straight->clip_norm(), 0.5);
}

}  // namespace
}  // namespace cohort::coordinator
