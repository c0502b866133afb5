#include "coordinator/strategy_dp.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "coordinator/noise_key.h"
#include "privacy/rdp_accountant.h"
#include "privacy/rdp_wor.h"

namespace cohort::coordinator {
namespace {

config::RunConfig DpConfig(double sigma = 1.5, double clip = 2.0) {
  config::RunConfig c;
  c.set_seed(3);
  c.mutable_secagg()->set_aggregation(config::PLAIN);
  c.mutable_privacy()->set_noise_multiplier(sigma);
  c.mutable_privacy()->set_clip_norm(clip);
  c.mutable_privacy()->set_target_delta(1e-5);
  return c;
}

SecretBytes Key(uint8_t fill) {
  SecretBytes key(32);
  std::fill(key.bytes().begin(), key.bytes().end(), fill);
  return key;
}

std::unique_ptr<DpStrategy> MakeDp(const config::RunConfig& config, uint8_t key_fill = 7) {
  auto inner = MakeStrategy(config);
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto dp = DpStrategy::Wrap(std::move(inner).value(), config);
  EXPECT_TRUE(dp.ok()) << dp.status();
  (*dp)->SetNoiseKey(Key(key_fill));
  return std::move(dp).value();
}

// The noise is what is claimed: N(0, (σ C / cohort)²) per coordinate. With
// zero updates (a zero mean) and FedAvg's step at learning rate 1 from a
// zero model, the strategy's output is the noise itself. Fixed key and
// round, so the draw (and the verdict) is the same on every run.
TEST(DpStrategyTest, NoiseOnAZeroMeanHasTheClaimedVariance) {
  const config::RunConfig config = DpConfig(1.5, 2.0);
  auto dp = MakeDp(config);
  constexpr size_t kN = 100000;
  dp->BeginRound(7, /*cohort=*/4, /*population=*/10);
  std::vector<float> zeros(kN, 0.0f), model(kN, 0.0f);
  ASSERT_TRUE(dp->Aggregate(zeros, model).ok());
  const double s = 1.5 * 2.0 / 4;  // σ C / cohort.
  double sum = 0, squares = 0;
  for (float v : model) {
    sum += v;
    squares += double{v} * v;
  }
  // Variance: Σ x² / s² ~ χ²(n). Two-sided test at significance 1e-6:
  // scipy.stats.chi2.ppf(5e-7, 100000) = 97827.66, chi2.ppf(1 - 5e-7, ...)
  // = 102202.91.
  const double chi2 = squares / (s * s);
  EXPECT_GT(chi2, 97827.66);
  EXPECT_LT(chi2, 102202.91);
  std::printf(
      "noise: n %zu, sample variance / claimed %.5f, chi-square %.1f in [97827.7, 102202.9]\n", kN,
      squares / kN / (s * s), chi2);
  // Mean 0: |mean| / (s / √n) below norm.ppf(1 - 5e-7) = 4.8916.
  EXPECT_LT(std::abs(sum / kN) / (s / std::sqrt(double{kN})), 4.8916);
  // Shape: ten bins equiprobable under N(0, s²); the goodness-of-fit
  // statistic ~ χ²(9), below chi2.ppf(1 - 1e-6, 9) = 44.81.
  std::vector<double> edges;
  for (int b = 1; b < 10; ++b) {
    // The normal quantile at b/10, by bisection on erfc.
    double lo = -10, hi = 10;
    for (int it = 0; it < 200; ++it) {
      const double mid = (lo + hi) / 2;
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < b / 10.0 ? lo : hi) = mid;
    }
    edges.push_back(lo * s);
  }
  std::vector<double> counts(10, 0);
  for (float v : model) counts[std::upper_bound(edges.begin(), edges.end(), v) - edges.begin()]++;
  double gof = 0;
  for (double c : counts) gof += (c - kN / 10.0) * (c - kN / 10.0) / (kN / 10.0);
  EXPECT_LT(gof, 44.81);
  // A round drew noise: EndRound charges it at q = 4 / 10.
  const RoundPrivacy charged = dp->EndRound();
  EXPECT_DOUBLE_EQ(charged.sampling_rate, 0.4);
  privacy::RdpAccountant accountant;
  ASSERT_TRUE(privacy::ComposeSampledWithoutReplacement(accountant, 0.4, 1.5 / 2).ok());
  EXPECT_DOUBLE_EQ(charged.epsilon, accountant.Spent(1e-5)->epsilon);
}

SecretBytes Inputs(uint8_t fill) {
  SecretBytes inputs(kNoiseInputsBytes);
  std::fill(inputs.bytes().begin(), inputs.bytes().end(), fill);
  return inputs;
}

TEST(DpStrategyTest, NoiseIsAFunctionOfTheKeyTheRoundAndTheInputs) {
  auto noise = [](uint8_t key, uint32_t round, uint8_t inputs = 0) {
    std::vector<float> v(70000, 0.0f);  // More than one chunk.
    EXPECT_TRUE(AddGaussianNoise(Key(key), round, Inputs(inputs), 1.0, v).ok());
    return v;
  };
  EXPECT_EQ(noise(1, 5), noise(1, 5));  // A resumed round replays its noise.
  EXPECT_NE(noise(1, 5), noise(1, 6));
  EXPECT_NE(noise(1, 5), noise(2, 5));
  EXPECT_NE(noise(1, 5, 0), noise(1, 5, 1));
  std::vector<float> v(3);
  Status bad = AddGaussianNoise(SecretBytes(16), 1, Inputs(0), 1.0, v);
  EXPECT_NE(bad.message().find("noise key has 16 bytes, expected 32"), std::string::npos);
  bad = AddGaussianNoise(Key(1), 1, SecretBytes(32), 1.0, v);
  EXPECT_NE(bad.message().find("noise inputs have 32 bytes, expected 64"), std::string::npos);
  // The inputs are the mean's and the model's digests, each its own half.
  std::vector<float> a = {1, 2, 3}, b = {1, 2, 4};
  const SecretBytes ab = NoiseInputs(a, b), ba = NoiseInputs(b, a), aa = NoiseInputs(a, a);
  EXPECT_FALSE(std::equal(ab.bytes().begin(), ab.bytes().end(), ba.bytes().begin()));
  EXPECT_TRUE(std::equal(ab.bytes().begin(), ab.bytes().begin() + 32, aa.bytes().begin()));
}

// The noise a DpStrategy adds to `mean` from `start` (FedAvg at learning
// rate 1: the new model is start + mean + noise), in round 4 of 4 clients.
std::vector<double> NoiseOf(const std::vector<float>& mean, const std::vector<float>& start) {
  auto dp = MakeDp(DpConfig(1.5, 2.0));
  dp->BeginRound(4, /*cohort=*/4, /*population=*/10);
  std::vector<float> model = start;
  EXPECT_TRUE(dp->Aggregate(mean, model).ok());
  std::vector<double> noise(mean.size());
  for (size_t i = 0; i < mean.size(); ++i) noise[i] = double{model[i]} - start[i] - mean[i];
  return noise;
}

double Correlation(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    xx += x[i] * x[i];
    yy += y[i] * y[i];
  }
  return xy / std::sqrt(xx * yy);
}

// A copy of the run directory (the same key) resumed beside the original
// aggregates other updates at the same round: its noise must be
// independent of the original's, or the difference of the two published
// models is the difference of the un-noised means. The same mean from the
// same model (a resumed round) replays its noise exactly.
TEST(DpStrategyTest, OtherUpdatesAtTheSameRoundGetIndependentNoise) {
  constexpr size_t kN = 100000;
  std::vector<float> mean_a(kN), mean_b(kN), start(kN, 0.0f), start_b(kN, 0.0f);
  for (size_t i = 0; i < kN; ++i) mean_a[i] = mean_b[i] = 0.01f * static_cast<float>(i % 7);
  mean_b[123] += 0.25f;  // One client's update differs.
  start_b[0] = 1e-3f;
  const std::vector<double> a = NoiseOf(mean_a, start), b = NoiseOf(mean_b, start);
  const std::vector<double> c = NoiseOf(mean_a, start_b);
  // Independent: |r| below 5 / √n (5 standard errors); the same noise
  // would give r = 1.
  EXPECT_LT(std::abs(Correlation(a, b)), 5 / std::sqrt(double{kN})) << Correlation(a, b);
  EXPECT_LT(std::abs(Correlation(a, c)), 5 / std::sqrt(double{kN})) << Correlation(a, c);
  // What the reviewer measured: the two models' difference, less the
  // means' difference, is ~√(2n) s in L2 (s = σ C / cohort), not ~0.
  double diff = 0;
  for (size_t i = 0; i < kN; ++i) diff += (a[i] - b[i]) * (a[i] - b[i]);
  const double s = 1.5 * 2.0 / 4;
  EXPECT_NEAR(std::sqrt(diff) / (std::sqrt(2.0 * kN) * s), 1.0, 0.02) << std::sqrt(diff);
  std::printf(
      "independent noise: r(a, b) %.5f, r(a, other model) %.5f, |a - b| %.1f (√(2n) s %.1f)\n",
      Correlation(a, b), Correlation(a, c), std::sqrt(diff), std::sqrt(2.0 * kN) * s);
  EXPECT_EQ(NoiseOf(mean_a, start), a);
}

TEST(DpStrategyTest, NothingIsReleasedWithoutAKeyOrARound) {
  const config::RunConfig config = DpConfig();
  auto inner = MakeStrategy(config);
  ASSERT_TRUE(inner.ok());
  auto dp = DpStrategy::Wrap(std::move(inner).value(), config);
  ASSERT_TRUE(dp.ok());
  std::vector<float> mean(4, 1.0f), model(4, 0.0f);
  (*dp)->BeginRound(1, 2, 4);
  Status s = (*dp)->Aggregate(mean, model);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no noise key"), std::string::npos) << s.message();
  EXPECT_EQ(model, std::vector<float>(4, 0.0f));
  CohortRequest request;
  request.round = 1;
  request.needed = 1;
  request.active = {"a", "b", "c"};
  EXPECT_TRUE((*dp)->SelectCohort(request).empty());
  config::RunConfig plain = DpConfig();
  plain.clear_privacy();
  EXPECT_EQ(DpStrategy::Wrap(std::move(MakeStrategy(plain)).value(), plain).status().code(),
            StatusCode::kInvalidArgument);
}

// The wrapped strategy's public shuffle (config.seed) is applied to a
// secretly permuted order: the cohort depends on the key, and only on it.
TEST(DpStrategyTest, CohortIsDrawnUnderTheKey) {
  config::RunConfig config = DpConfig();
  config.mutable_rounds()->set_fraction(0.3f);
  auto a = MakeDp(config, 1), a_again = MakeDp(config, 1), b = MakeDp(config, 2);
  auto plain = MakeStrategy(config);
  ASSERT_TRUE(plain.ok());
  CohortRequest request;
  request.needed = 2;
  request.min_clients = 2;
  for (int i = 0; i < 20; ++i) request.active.push_back("c" + std::to_string(100 + i));
  int differs_from_key_2 = 0, differs_from_public = 0;
  for (uint32_t round = 1; round <= 10; ++round) {
    request.round = round;
    const auto cohort = a->SelectCohort(request);
    ASSERT_EQ(cohort.size(), 6u);
    EXPECT_TRUE(std::is_sorted(cohort.begin(), cohort.end()));
    EXPECT_EQ(cohort, a_again->SelectCohort(request));
    differs_from_key_2 += cohort != b->SelectCohort(request);
    differs_from_public += cohort != (*plain)->SelectCohort(request);
  }
  EXPECT_GE(differs_from_key_2, 9);
  EXPECT_GE(differs_from_public, 9);
}

TEST(DpStrategyTest, RestoreRebuildsTheAccountantFromTheRecords) {
  auto dp = MakeDp(DpConfig(1.1));
  std::vector<store::RoundRecord> rounds(5);
  for (uint32_t r = 0; r < 5; ++r) {
    rounds[r].round = r + 1;
    rounds[r].dp_sampling_rate = r == 2 ? 0 : (r < 3 ? 0.1 : 0.2);  // Round 3 drew none.
  }
  ASSERT_TRUE(dp->Restore(rounds).ok());
  privacy::RdpAccountant accountant;
  ASSERT_TRUE(privacy::ComposeSampledWithoutReplacement(accountant, 0.1, 1.1 / 2, 2).ok());
  ASSERT_TRUE(privacy::ComposeSampledWithoutReplacement(accountant, 0.2, 1.1 / 2, 2).ok());
  EXPECT_NEAR(dp->epsilon(), accountant.Spent(1e-5)->epsilon, 1e-12);
  rounds[4].dp_sampling_rate = 1.5;
  Status s = dp->Restore(rounds);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("round 5: privacy sampling rate 1.5"), std::string::npos);
}

// The accounting is the replace-one one: a client's clipped update (norm
// <= C) replaced by another moves the sum by up to 2C, and the noise is σC,
// so a round whose cohort is the whole population is the Gaussian mechanism
// at noise multiplier σ / 2, RDP α / (2 (σ/2)²) = 2α / σ², with no
// amplification. ε in closed form over the default orders (Balle et al.'s
// conversion), independent of privacy/rdp_wor.cc.
TEST(DpStrategyTest, AWholePopulationCohortIsTheGaussianAtHalfTheNoiseMultiplier) {
  const double sigma = 4.0;
  auto dp = MakeDp(DpConfig(sigma));
  auto plan = dp->PlanRound(10, 10);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->sampling_rate, 1.0);
  double want = INFINITY;
  for (double a : privacy::DefaultOrders()) {
    const double rdp = 2 * a / (sigma * sigma);
    want = std::min(want, rdp + std::log((a - 1) / a) - (std::log(1e-5) + std::log(a)) / (a - 1));
  }
  EXPECT_NEAR(plan->epsilon_after, want, 1e-12);
  // The add/remove figure at σ (what the coordinator printed before) is
  // smaller: the old accounting understated ε.
  privacy::RdpAccountant add_remove;
  ASSERT_TRUE(add_remove.Compose(1.0, sigma).ok());
  EXPECT_LT(add_remove.Spent(1e-5)->epsilon, plan->epsilon_after);
}

TEST(DpStrategyTest, PlanSaysWhetherTheNextRoundFitsTheBudget) {
  config::RunConfig config = DpConfig(1.0);
  privacy::RdpAccountant accountant;
  ASSERT_TRUE(privacy::ComposeSampledWithoutReplacement(accountant, 0.5, 1.0 / 2).ok());
  const double one_round = accountant.Spent(1e-5)->epsilon;
  config.mutable_privacy()->set_epsilon_budget(one_round * 1.0001);
  auto dp = MakeDp(config);
  auto plan = dp->PlanRound(2, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->within_budget);
  EXPECT_DOUBLE_EQ(plan->epsilon_after, one_round);
  config.mutable_privacy()->set_epsilon_budget(one_round * 0.9999);
  EXPECT_FALSE(MakeDp(config)->PlanRound(2, 4)->within_budget);
  EXPECT_EQ(dp->PlanRound(3, 2).status().code(), StatusCode::kInvalidArgument);
}

// Distributed DP: the clients' noise is in the mean already, so Aggregate
// adds none (and needs no key); every round is charged as the Skellam
// mechanism's, in the plan, at the end of a round and on a restore, and
// the budget stops it as it stops central DP.
TEST(DpStrategyTest, DistributedDpAddsNoNoiseAndChargesTheSkellamMechanism) {
  config::RunConfig config = DpConfig(1.0, 1.0);
  config.mutable_secagg()->set_aggregation(config::SECAGG_PLUS);
  config.mutable_privacy()->set_mechanism(config::DISTRIBUTED_SKELLAM);
  auto inner = MakeStrategy(config);
  ASSERT_TRUE(inner.ok());
  auto dp = std::move(DpStrategy::Wrap(std::move(inner).value(), config)).value();
  auto params = privacy::ChooseSkellamParams(1.0, 1.0, 10, 3, 1000);
  ASSERT_TRUE(params.ok());
  dp->SetSkellam(*params);
  privacy::RdpAccountant accountant;
  ASSERT_TRUE(privacy::ChargeSkellamRounds(accountant, *params).ok());
  const double one_round = accountant.Spent(1e-5)->epsilon;
  // Replace-one and unsampled: more than the Poisson add/remove figure at q.
  privacy::RdpAccountant poisson;
  ASSERT_TRUE(privacy::ComposeSkellam(poisson, 0.5, *params).ok());
  EXPECT_GT(one_round, 2 * poisson.Spent(1e-5)->epsilon);
  auto plan = dp->PlanRound(5, 10);
  ASSERT_TRUE(plan.ok());
  EXPECT_DOUBLE_EQ(plan->epsilon_after, one_round);
  dp->BeginRound(1, 5, 10);
  std::vector<float> mean(1000, 0.25f), model(1000, 0.0f);
  ASSERT_TRUE(dp->Aggregate(mean, model).ok());  // No noise key set.
  EXPECT_EQ(model, mean);                        // FedAvg at learning rate 1: no noise added.
  const RoundPrivacy charged = dp->EndRound();
  EXPECT_DOUBLE_EQ(charged.sampling_rate, 0.5);
  EXPECT_DOUBLE_EQ(charged.epsilon, one_round);
  // Charged as the Gaussian of the same σ would be without amplification
  // and replace-one (noise multiplier σ / 2, q = 1), and just above it: the
  // rounding's inflation and the Skellam term are tiny at this grid.
  privacy::RdpAccountant gaussian;
  ASSERT_TRUE(gaussian.Compose(1.0, 0.5).ok());
  std::printf("one round, sigma 1: Skellam epsilon %.4f, unsampled replace-one Gaussian %.4f\n",
              one_round, gaussian.Spent(1e-5)->epsilon);
  EXPECT_GE(one_round, gaussian.Spent(1e-5)->epsilon);
  EXPECT_LT(one_round, 1.05 * gaussian.Spent(1e-5)->epsilon);
  std::vector<store::RoundRecord> rounds(1);
  rounds[0].round = 1;
  rounds[0].dp_sampling_rate = 0.5;
  ASSERT_TRUE(dp->Restore(rounds).ok());
  EXPECT_DOUBLE_EQ(dp->epsilon(), one_round);
  config.mutable_privacy()->set_epsilon_budget(one_round * 1.01);
  auto budgeted =
      std::move(DpStrategy::Wrap(std::move(MakeStrategy(config)).value(), config)).value();
  budgeted->SetSkellam(*params);
  ASSERT_TRUE(budgeted->Restore(rounds).ok());
  EXPECT_FALSE(budgeted->PlanRound(5, 10)->within_budget);
}

// Distributed DP keeps two views: against the coordinator (unsampled, as
// above) and for the released model (amplified at q by Theorem 9). With
// privacy.budget_view RELEASED_MODEL the budget stops on the second: here
// after 3 rounds of 5 of 50 clients, where the first view would have
// refused the first round already.
TEST(DpStrategyTest, DistributedDpBudgetOnTheReleasedModelViewStopsAtItsRound) {
  auto params = privacy::ChooseSkellamParams(1.0, 2.0, 10, 3, 1000);
  ASSERT_TRUE(params.ok());
  std::vector<double> against, released;
  privacy::RdpAccountant a, r;
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(privacy::ChargeSkellamRounds(a, *params).ok());
    ASSERT_TRUE(privacy::ChargeSkellamRoundsForReleasedModel(r, *params, 0.1).ok());
    against.push_back(a.Spent(1e-5)->epsilon);
    released.push_back(r.Spent(1e-5)->epsilon);
  }
  const double budget = (released[2] + released[3]) / 2;  // Room for 3 rounds, not 4.
  std::printf(
      "sigma 2, q 0.1: against the coordinator %.4g %.4g %.4g %.4g, released model "
      "%.4g %.4g %.4g %.4g; budget %.4g\n",
      against[0], against[1], against[2], against[3], released[0], released[1], released[2],
      released[3], budget);
  ASSERT_GT(against[0], budget);
  config::RunConfig config = DpConfig(2.0, 1.0);
  config.mutable_secagg()->set_aggregation(config::SECAGG_PLUS);
  config.mutable_privacy()->set_mechanism(config::DISTRIBUTED_SKELLAM);
  config.mutable_privacy()->set_epsilon_budget(budget);
  config.mutable_privacy()->set_budget_view(config::RELEASED_MODEL);
  auto make = [&](const config::RunConfig& c) {
    auto dp = std::move(DpStrategy::Wrap(std::move(MakeStrategy(c)).value(), c)).value();
    dp->SetSkellam(*params);
    return dp;
  };
  auto dp = make(config);
  EXPECT_EQ(dp->BudgetViewName(), "for the released model");
  std::vector<store::RoundRecord> records;
  std::vector<float> mean(1000, 0.25f), model(1000, 0.0f);
  for (uint32_t round = 1; round <= 3; ++round) {
    auto plan = dp->PlanRound(5, 50);
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->within_budget) << "round " << round;
    EXPECT_DOUBLE_EQ(plan->epsilon_after, against[round - 1]);
    EXPECT_DOUBLE_EQ(plan->epsilon_released_model_after, released[round - 1]);
    EXPECT_DOUBLE_EQ(plan->budget_epsilon_after, released[round - 1]);
    dp->BeginRound(round, 5, 50);
    ASSERT_TRUE(dp->Aggregate(mean, model).ok());
    const RoundPrivacy charged = dp->EndRound();
    EXPECT_DOUBLE_EQ(charged.sampling_rate, 0.1);
    EXPECT_DOUBLE_EQ(charged.epsilon, against[round - 1]);
    EXPECT_DOUBLE_EQ(charged.epsilon_released_model, released[round - 1]);
    records.push_back({});
    records.back().round = round;
    records.back().dp_sampling_rate = charged.sampling_rate;
  }
  auto fourth = dp->PlanRound(5, 50);
  ASSERT_TRUE(fourth.ok());
  EXPECT_FALSE(fourth->within_budget);
  EXPECT_DOUBLE_EQ(fourth->budget_epsilon_after, released[3]);
  EXPECT_DOUBLE_EQ(dp->budget_epsilon(), released[2]);
  // A resumed run rebuilds both views from the recorded rates.
  auto resumed = make(config);
  ASSERT_TRUE(resumed->Restore(records).ok());
  EXPECT_DOUBLE_EQ(resumed->epsilon(), against[2]);
  EXPECT_DOUBLE_EQ(resumed->epsilon_released_model(), released[2]);
  EXPECT_FALSE(resumed->PlanRound(5, 50)->within_budget);
  // On the default view the same budget refuses the first round.
  config.mutable_privacy()->set_budget_view(config::AGAINST_COORDINATOR);
  auto strict = make(config);
  EXPECT_EQ(strict->BudgetViewName(), "against the coordinator");
  EXPECT_FALSE(strict->PlanRound(5, 50)->within_budget);
  EXPECT_DOUBLE_EQ(strict->PlanRound(5, 50)->budget_epsilon_after, against[0]);
  // Central DP has one view: no name, and no released-model ε.
  auto central = MakeDp(DpConfig(2.0, 1.0));
  EXPECT_EQ(central->BudgetViewName(), "");
  EXPECT_EQ(central->PlanRound(5, 50)->epsilon_released_model_after, -1);
  EXPECT_EQ(central->epsilon_released_model(), -1);
}

// The run secret's file: made once with mode 0600, read back the same, and
// refused when others may read it or it is not one.
TEST(NoiseKeyTest, IsCreatedOnceReadBackAndGuarded) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("cohort_noise_key_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + kNoiseKeyFile;
  auto missing = LoadOrCreateNoiseKey(path, false);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("restore the file"), std::string::npos);
  auto made = LoadOrCreateNoiseKey(path, true);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto again = LoadOrCreateNoiseKey(path, true);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 32u);
  EXPECT_EQ(std::memcmp(made->bytes().data(), again->bytes().data(), 32), 0);
  std::filesystem::permissions(path, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  auto open = LoadOrCreateNoiseKey(path, false);
  EXPECT_EQ(open.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos);
  std::filesystem::permissions(path, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::remove);
  // A link in the key's place is refused, even to a good key.
  const std::string elsewhere = dir + "/other.key";
  std::filesystem::rename(path, elsewhere);
  std::filesystem::create_symlink(elsewhere, path);
  auto link = LoadOrCreateNoiseKey(path, false);
  EXPECT_EQ(link.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(link.status().message().find("is a symbolic link"), std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::rename(elsewhere, path);
  ASSERT_TRUE(LoadOrCreateNoiseKey(path, false).ok());
  // Another user's file is refused (only root can make one to test with).
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    auto foreign = LoadOrCreateNoiseKey(path, false);
    EXPECT_EQ(foreign.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(foreign.status().message().find("owned by uid 65534, not by this user"),
              std::string::npos)
        << foreign.status();
  }
  std::filesystem::remove(path);
  std::ofstream(path) << "cohort-dp-noise-key 12\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_read);
  auto bad = LoadOrCreateNoiseKey(path, false);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not a privacy noise key"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort::coordinator
