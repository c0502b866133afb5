#include "privacy/skellam.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "privacy/rdp_wor.h"

namespace cohort::privacy {
namespace {

SkellamSampler Sampler(uint8_t fill) {
  SecretBytes seed(SkellamSampler::kSeedBytes);
  for (auto& b : seed.bytes()) b = fill;
  return std::move(SkellamSampler::Create(std::move(seed))).value();
}

// The chi-square quantile by Wilson and Hilferty's cube-root normal
// approximation (relative error below 1e-3 from df 30 on): `z` the standard
// normal quantile.
double ChiSquareQuantile(double df, double z) {
  const double h = 2.0 / (9.0 * df);
  return df * std::pow(1 - h + z * std::sqrt(h), 3);
}
// Two-sided significance 0.001: the normal quantiles 0.0005 and 0.9995.
constexpr double kZ = 3.2905;

// Sk(λ, λ)'s pmf at k: e^(-2λ) I_k(2λ).
double SkellamPmf(int k, double lambda) {
  return std::exp(-2 * lambda) * std::cyl_bessel_i(static_cast<double>(std::abs(k)), 2 * lambda);
}

// Mean and variance of 200,000 draws at three variances (the small-mean
// product sampler, PTRS, PTRS at a mean of 10^12), each within the
// two-sided 0.001 bounds of its estimator's law; fixed seeds, so the
// outcome is the same on every run.
TEST(SkellamSamplerTest, MeanAndVarianceAtSmallMediumAndLargeVariances) {
  constexpr int kDraws = 200000;
  uint8_t fill = 1;
  for (double variance : {3.0, 50.0, 2e12}) {
    SkellamSampler sampler = Sampler(fill++);
    double sum = 0, sum2 = 0;
    for (int i = 0; i < kDraws; ++i) {
      const double x = static_cast<double>(sampler.Skellam(variance));
      sum += x;
      sum2 += x * x;
    }
    // Known mean 0: Σx² / V is close to chi-square with kDraws degrees of
    // freedom (Skellam's excess kurtosis is 1/V).
    const double mean = sum / kDraws;
    EXPECT_LT(std::abs(mean), kZ * std::sqrt(variance / kDraws)) << "variance " << variance;
    const double stat = sum2 / variance;
    EXPECT_GT(stat, ChiSquareQuantile(kDraws, -kZ)) << "variance " << variance;
    EXPECT_LT(stat, ChiSquareQuantile(kDraws, kZ)) << "variance " << variance;
    std::printf("Skellam variance %g: mean %.4g, variance ratio %.5f\n", variance, mean,
                sum2 / kDraws / variance);
  }
}

// A chi-square goodness of fit of the draws to Skellam's pmf (bins with at
// least 5 expected draws; the rest pooled into two tails) at significance
// 0.001, for a product-sampler mean (λ 1.5) and a PTRS one (λ 25).
TEST(SkellamSamplerTest, DrawsFitTheSkellamPmf) {
  constexpr int kDraws = 200000;
  for (double lambda : {1.5, 25.0}) {
    SkellamSampler sampler = Sampler(static_cast<uint8_t>(lambda * 2));
    int half = 0;
    while (kDraws * SkellamPmf(half + 1, lambda) >= 5) ++half;
    std::vector<double> counts(2 * half + 3, 0);  // [low tail | -half..half | high tail]
    for (int i = 0; i < kDraws; ++i) {
      const int64_t x = sampler.Skellam(2 * lambda);
      const int64_t bin = x < -half ? 0 : x > half ? 2 * half + 2 : x + half + 1;
      ++counts[static_cast<size_t>(bin)];
    }
    double inner = 0, stat = 0;
    for (int k = -half; k <= half; ++k) {
      const double expected = kDraws * SkellamPmf(k, lambda);
      inner += SkellamPmf(k, lambda);
      const double o = counts[static_cast<size_t>(k + half + 1)];
      stat += (o - expected) * (o - expected) / expected;
    }
    const double tail = kDraws * (1 - inner) / 2;
    for (size_t b : {size_t{0}, counts.size() - 1}) {
      stat += (counts[b] - tail) * (counts[b] - tail) / tail;
    }
    const double df = static_cast<double>(counts.size() - 1);
    std::printf(
        "Skellam lambda %g: chi-square %.2f on %g degrees of freedom (0.999 quantile %.2f)\n",
        lambda, stat, df, ChiSquareQuantile(df, 3.0902));
    EXPECT_LT(stat, ChiSquareQuantile(df, 3.0902)) << "lambda " << lambda;
  }
}

TEST(SkellamSamplerTest, RefusesASeedOfTheWrongSize) {
  auto sampler = SkellamSampler::Create(SecretBytes(16));
  ASSERT_FALSE(sampler.ok());
  EXPECT_EQ(sampler.status().message(), "noise seed has 16 bytes, expected 32");
}

// Every line of tests/data/skellam_golden.txt (make_skellam_golden.py).
TEST(SkellamAccountingTest, MatchesScipy) {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/skellam_golden.txt");
  ASSERT_TRUE(in) << "tests/data/skellam_golden.txt";
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    ++lines;
    if (kind == "rdp") {
      double q, l1, l2, v, order, want;
      ASSERT_TRUE(s >> q >> l1 >> l2 >> v >> order >> want) << line;
      EXPECT_NEAR(SampledSkellamRdp(q, l1, l2, v, order), want, 1e-9 * want) << line;
    } else if (kind == "eps") {
      double q, l1, l2, v, delta, want;
      uint64_t steps;
      ASSERT_TRUE(s >> q >> l1 >> l2 >> v >> steps >> delta >> want) << line;
      SkellamParams p;
      p.l1_bound = l1;
      p.l2_bound = l2;
      p.variance = v;
      RdpAccountant accountant;
      ASSERT_TRUE(ComposeSkellam(accountant, q, p, steps).ok());
      auto spent = accountant.Spent(delta);
      ASSERT_TRUE(spent.ok());
      EXPECT_NEAR(spent->epsilon, want, 1e-9 * want) << line;
    } else if (kind == "exact") {
      // The bound is a bound: never below the true divergence of one
      // coordinate shifted by an integer (L1 = L2 = the shift).
      double v, shift, order, exact;
      ASSERT_TRUE(s >> v >> shift >> order >> exact) << line;
      EXPECT_GE(SkellamRdp(shift, shift, v, order), exact) << line;
      EXPECT_LT(SkellamRdp(shift, shift, v, order), 2 * exact) << line;
    } else if (kind == "l2") {
      double c, d, want;
      ASSERT_TRUE(s >> c >> d >> want) << line;
      EXPECT_NEAR(RoundedL2Bound(c, d, kRoundingBeta), want, 1e-12 * want) << line;
    } else {
      FAIL() << "unknown line: " << line;
    }
  }
  EXPECT_EQ(lines, 96);
}

// Every line of tests/data/skellam_wor_golden.txt
// (make_skellam_wor_golden.py): Theorem 9 over the Skellam curve, and the
// released-model view's ε, summed in 60-digit decimals; within 1e-9.
TEST(SkellamReleasedModelTest, MatchesDecimalComputation) {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/skellam_wor_golden.txt");
  ASSERT_TRUE(in) << "tests/data/skellam_wor_golden.txt";
  std::string line;
  int thm9 = 0, released = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    double q, l1, l2, v;
    ASSERT_TRUE(s >> q >> l1 >> l2 >> v) << line;
    if (kind == "thm9") {
      double order, want;
      ASSERT_TRUE(s >> order >> want) << line;
      const std::vector<double> orders = {order};
      const double got = SampledWithoutReplacementRdp(
          q, [&](int j) { return SkellamRdp(l1, l2, v, j); }, orders)[0];
      EXPECT_NEAR(got, want, 1e-9 * want) << line;
      ++thm9;
    } else if (kind == "released") {
      double delta, want, order;
      uint64_t steps;
      ASSERT_TRUE(s >> steps >> delta >> want >> order) << line;
      SkellamParams p;
      p.l1_bound = l1;
      p.l2_bound = l2;
      p.variance = v;
      RdpAccountant accountant;
      ASSERT_TRUE(ChargeSkellamRoundsForReleasedModel(accountant, p, q, steps).ok());
      auto spent = accountant.Spent(delta);
      ASSERT_TRUE(spent.ok());
      EXPECT_NEAR(spent->epsilon, want, 1e-9 * want) << line;
      EXPECT_EQ(spent->order, order) << line;
      ++released;
    } else {
      FAIL() << "unknown line: " << line;
    }
  }
  EXPECT_EQ(thm9, 180);
  EXPECT_EQ(released, 54);
}

// A bench-like distributed-DP round: noise multiplier 1 on a 61,706-value
// model, 10 clients a round.
SkellamParams BenchParams() { return ChooseSkellamParams(1.0, 1.0, 10, 10, 61706).value(); }

// Theorem 9 is an upper bound even at q = 1, so there it is at or above
// the unsampled curve at every order; the released-model view takes the
// smaller, so at q = 1 both views charge the same.
TEST(SkellamReleasedModelTest, AtQOneEqualsTheViewAgainstTheCoordinator) {
  const SkellamParams p = BenchParams();
  const double l1 = 2 * p.l1_bound, l2 = 2 * p.l2_bound;
  RdpAccountant against, released;
  const std::vector<double> theorem = SampledWithoutReplacementRdp(
      1.0, [&](int j) { return SkellamRdp(l1, l2, p.variance, j); }, against.orders());
  for (size_t k = 0; k < theorem.size(); ++k) {
    EXPECT_GE(theorem[k], SkellamRdp(l1, l2, p.variance, against.orders()[k]))
        << "order " << against.orders()[k];
  }
  ASSERT_TRUE(ChargeSkellamRounds(against, p, 100).ok());
  ASSERT_TRUE(ChargeSkellamRoundsForReleasedModel(released, p, 1.0, 100).ok());
  EXPECT_DOUBLE_EQ(released.Spent(1e-5)->epsilon, against.Spent(1e-5)->epsilon);
}

// At q = 0.05 (10 of 200 clients) the released model's ε after 100 rounds
// is a small fraction of the ε against the coordinator.
TEST(SkellamReleasedModelTest, AmplifiesAtASmallSamplingFraction) {
  const SkellamParams p = BenchParams();
  RdpAccountant against, released;
  ASSERT_TRUE(ChargeSkellamRounds(against, p, 100).ok());
  ASSERT_TRUE(ChargeSkellamRoundsForReleasedModel(released, p, 0.05, 100).ok());
  const double a = against.Spent(1e-5)->epsilon, r = released.Spent(1e-5)->epsilon;
  EXPECT_LT(r, a / 5) << "against the coordinator " << a << ", released " << r;
  EXPECT_GT(r, 0);
  RdpAccountant none;
  ASSERT_TRUE(ChargeSkellamRoundsForReleasedModel(none, p, 0.0, 100).ok());
  for (double r : none.rdp()) EXPECT_EQ(r, 0);
}

TEST(SkellamReleasedModelTest, RefusesASamplingFractionOutsideZeroToOne) {
  RdpAccountant accountant;
  const Status s = ChargeSkellamRoundsForReleasedModel(accountant, BenchParams(), 1.5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "privacy accounting: sampling fraction 1.5 is not in [0, 1]");
  EXPECT_EQ(ChargeSkellamRoundsForReleasedModel(accountant, BenchParams(), std::nan("")).code(),
            StatusCode::kInvalidArgument);
  for (double r : accountant.rdp()) EXPECT_EQ(r, 0);  // Unchanged.
}

// The scale keeps the worst-case sum below 2^31 with the stated
// probability, and the bound is in the describing line.
TEST(SkellamParamsTest, ScaleMeetsTheWrapAroundBound) {
  auto p = ChooseSkellamParams(1.0, 1.0, 10, 8, 61706);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->scale, std::ldexp(1.0, 21));  // The noise cap: s σ C <= 2^21.
  EXPECT_LE(p->wrap_probability, kMaxWrapProbability);
  EXPECT_DOUBLE_EQ(p->variance, std::ldexp(1.0, 42));
  EXPECT_DOUBLE_EQ(p->share_variance(), std::ldexp(1.0, 42) / 8);
  EXPECT_LT(p->l2_bound, 1.001 * p->scale);
  EXPECT_NE(p->Describe().find("wraps with probability <= "), std::string::npos);
  // Many clients and little noise: the signal bound sets the scale.
  auto crowded = ChooseSkellamParams(1.0, 0.01, 1000, 100, 61706);
  ASSERT_TRUE(crowded.ok()) << crowded.status();
  EXPECT_LT(crowded->scale * 1000 * 1.01, std::ldexp(1.0, 31));
  EXPECT_LE(crowded->wrap_probability, kMaxWrapProbability);
}

TEST(SkellamParamsTest, RefusesWhenNoScaleFitsNamingTheFields) {
  auto p = ChooseSkellamParams(1.0, 1.0, 100000000, 3, 1000000);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "privacy: no fixed-point scale keeps the 32-bit sum from wrapping: 100000000 clients "
            "(rounds.max_clients_per_round) of L2 norm privacy.clip_norm 1 with noise "
            "privacy.noise_multiplier 1 over 1000000 values need more than 31 bits once the grid "
            "is fine enough that rounding at most doubles the sensitivity; lower "
            "rounds.max_clients_per_round or privacy.noise_multiplier");
  auto bad = ChooseSkellamParams(1.0, 1.0, 10, 11, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("0 < survivors <= rounds.max_clients_per_round"),
            std::string::npos);
}

// The encoding clips, rounds within the L2 bound and decodes back.
TEST(SkellamEncodingTest, ClipsRoundsAndDecodes) {
  std::vector<float> delta(100, 1.0f);  // L2 norm 10, clipped to 2.
  Rng rounding(7);
  SkellamSampler noise = Sampler(9);
  std::vector<uint32_t> words(delta.size());
  const double scale = 1024, l2 = RoundedL2Bound(2 * scale, 100, kRoundingBeta);
  ASSERT_TRUE(EncodeSkellam(delta, 2.0, scale, l2, 0, rounding, noise, words).ok());
  std::vector<float> back(delta.size());
  DecodeSkellam(words, scale, back);
  double norm2 = 0;
  for (float v : back) {
    EXPECT_NEAR(v, 0.2, 1.0 / scale);
    norm2 += double{v} * v;
  }
  EXPECT_LE(std::sqrt(norm2) * scale, l2);
  delta[3] = std::nanf("");
  auto bad = EncodeSkellam(delta, 2.0, scale, l2, 0, rounding, noise, words);
  EXPECT_EQ(bad.message(), "local update has NaN or Inf");
}

// Adaptive clipping's count word: a whole power-of-two grid, the bit exact
// on it (sensitivity S, no rounding), the count's noise (S σ_b)² from the
// fewest survivors, and the sum of N words far from wrapping.
TEST(ClipCountTest, GridIsAWholePowerOfTwoWithinTheWrapAroundBound) {
  auto p = ChooseClipCountParams(0.6, 10, 8);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->scale, std::ldexp(1.0, 21));  // S σ_b <= 2^21.
  EXPECT_EQ(p->l2_bound, p->scale);
  EXPECT_EQ(p->l1_bound, p->scale);
  EXPECT_DOUBLE_EQ(p->variance, std::pow(p->scale * 0.6, 2));
  EXPECT_DOUBLE_EQ(p->share_variance(), p->variance / 8);
  EXPECT_LE(p->wrap_probability, kMaxWrapProbability);
  // Many clients: N S must stay below 2^31, so S shrinks.
  auto crowded = ChooseClipCountParams(0.6, 5000, 4000);
  ASSERT_TRUE(crowded.ok()) << crowded.status();
  EXPECT_EQ(crowded->scale, std::ldexp(1.0, 18));
  EXPECT_LT(crowded->scale * 5000, std::ldexp(1.0, 31));
  EXPECT_LE(crowded->wrap_probability, kMaxWrapProbability);
  // Noise so large that no whole grid keeps S σ_b <= 2^21.
  auto none = ChooseClipCountParams(1e7, 10, 8);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(),
            "privacy.adaptive_clip.clipped_count_stddev 10000000: no integer grid keeps the "
            "32-bit sum of 10 clipped-count bits (rounds.max_clients_per_round) with their noise "
            "from wrapping");
}

// The bit's word decodes to the bit, and the bit is the norm against C as
// EncodeSkellam decides clipping.
TEST(ClipCountTest, TheBitIsExactOnTheGrid) {
  SkellamSampler noise = Sampler(11);
  EXPECT_EQ(DecodeClipCount(EncodeClipBit(true, 1 << 21, 0, noise), 1 << 21), 1.0);
  EXPECT_EQ(DecodeClipCount(EncodeClipBit(false, 1 << 21, 0, noise), 1 << 21), 0.0);
  const std::vector<float> delta = {3.0f, 4.0f};  // Norm 5.
  EXPECT_TRUE(WithinL2Norm(delta, 5.0));
  EXPECT_FALSE(WithinL2Norm(delta, 4.999));
  // Words wrap like any input: 10 negative noises decode below zero.
  uint32_t sum = 0;
  for (int i = 0; i < 10; ++i) sum += static_cast<uint32_t>(-(int64_t{1} << 20));
  EXPECT_EQ(DecodeClipCount(sum, 1 << 21), -5.0);
}

// The survivors' noise on the decoded count has variance σ_b² (count
// units) when m of n report, n/m σ_b² when all do: 20,000 rounds of ten
// clients (six bits set), shares sized for m = 8, each round's words summed
// mod 2^32 as the unmasked sum is; Σ noise² / claimed variance is tested as
// chi-square on 20,000 degrees of freedom, two-sided at significance 0.001
// (Wilson-Hilferty), fixed seeds. The dropout case also rejects "shares
// sized for the whole cohort" (0.8 σ_b²), so the test can fail.
TEST(ClipCountTest, TheSurvivorsNoiseOnTheCountHasTheTargetVarianceEvenWithDropouts) {
  constexpr int kRounds = 20000, kClients = 10, kSurvivors = 8;
  constexpr double kStddev = 0.6;
  auto p = ChooseClipCountParams(kStddev, kClients, kSurvivors);
  ASSERT_TRUE(p.ok()) << p.status();
  SkellamSampler noise = Sampler(21);
  for (int reporting : {kClients, kSurvivors}) {
    double squares = 0;
    for (int r = 0; r < kRounds; ++r) {
      uint32_t sum = 0;
      int count = 0;
      for (int i = 0; i < reporting; ++i) {
        const bool bit = i < 6;
        count += bit ? 1 : 0;
        sum += EncodeClipBit(bit, p->scale, p->share_variance(), noise);
      }
      const double e = DecodeClipCount(sum, p->scale) - count;
      squares += e * e;
    }
    const double claimed = kStddev * kStddev * reporting / kSurvivors;
    const double stat = squares / claimed;
    std::printf("count noise with %d of %d reporting: variance %.6g (claimed %.6g), chi2 %.1f\n",
                reporting, kClients, squares / kRounds, claimed, stat);
    EXPECT_GT(stat, ChiSquareQuantile(kRounds, -kZ)) << reporting;
    EXPECT_LT(stat, ChiSquareQuantile(kRounds, kZ)) << reporting;
    if (reporting == kSurvivors) {
      EXPECT_GT(squares / (0.8 * kStddev * kStddev), ChiSquareQuantile(kRounds, kZ));
    }
  }
}

// The pair is charged as two composed Skellam mechanisms; with the update
// at z_Δ = (z^-2 - (2σ_b)^-2)^-1/2 the Gaussian terms are the update's
// alone at z (Andrew et al.), so the ε is close to a fixed clip's at z, and
// far above the update's alone at z_Δ (what forgetting the count charges).
TEST(ClipCountTest, ThePairIsChargedAsTheUpdateAloneAtZ) {
  constexpr double kZ1 = 1.0, kSb = 0.6;
  const double z_delta = 1 / std::sqrt(1 / (kZ1 * kZ1) - 1 / (4 * kSb * kSb));
  auto fixed = ChooseSkellamParams(0.5, kZ1, 10, 8, 10000);
  auto update = ChooseSkellamParams(0.5, z_delta, 10, 8, 10000);
  auto count = ChooseClipCountParams(kSb, 10, 8);
  ASSERT_TRUE(fixed.ok() && update.ok() && count.ok());
  RdpAccountant at_z, pair, alone, released_pair, released_alone;
  ASSERT_TRUE(ChargeSkellamRounds(at_z, *fixed, 100).ok());
  ASSERT_TRUE(ChargeAdaptiveSkellamRounds(pair, *update, *count, 100).ok());
  ASSERT_TRUE(ChargeSkellamRounds(alone, *update, 100).ok());
  const double e_z = at_z.Spent(1e-5)->epsilon, e_pair = pair.Spent(1e-5)->epsilon,
               e_alone = alone.Spent(1e-5)->epsilon;
  std::printf(
      "100 rounds at delta 1e-5: fixed clip at z %.6g, adaptive pair %.6g, update alone "
      "at z_delta %.6g\n",
      e_z, e_pair, e_alone);
  EXPECT_NEAR(e_pair / e_z, 1.0, 0.01);
  EXPECT_GT(e_pair, 1.05 * e_alone);
  // Each order: the sum of the two curves.
  for (size_t k = 0; k < pair.orders().size(); ++k) {
    const double a = pair.orders()[k];
    const double want =
        100 * (SkellamRdp(2 * update->l1_bound, 2 * update->l2_bound, update->variance, a) +
               SkellamRdp(count->scale, count->scale, count->variance, a));
    EXPECT_NEAR(pair.rdp()[k], want, 1e-12 * want) << a;
  }
  // The released model's view amplifies the summed curve; at q = 1 it is
  // the view against the coordinator.
  ASSERT_TRUE(
      ChargeAdaptiveSkellamRoundsForReleasedModel(released_pair, *update, *count, 1.0, 100).ok());
  EXPECT_NEAR(released_pair.Spent(1e-5)->epsilon, e_pair, 1e-9 * e_pair);
  RdpAccountant sampled;
  ASSERT_TRUE(
      ChargeAdaptiveSkellamRoundsForReleasedModel(sampled, *update, *count, 0.01, 100).ok());
  EXPECT_LT(sampled.Spent(1e-5)->epsilon, e_pair / 2);
  RdpAccountant bad;
  EXPECT_EQ(ChargeAdaptiveSkellamRoundsForReleasedModel(bad, *update, *count, 1.5).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::privacy
