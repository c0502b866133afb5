#include "coordinator/adaptive_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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
            "privacy.adaptive_clip.clipped_count_stddev 0.500000 must be finite and above "
            "privacy.noise_multiplier 1.000000 / 2");
  EXPECT_FALSE(AdaptiveUpdateNoiseMultiplier(0.0, 1.0).ok());
  EXPECT_FALSE(AdaptiveUpdateNoiseMultiplier(1.0, INFINITY).ok());
  EXPECT_FALSE(AdaptiveUpdateNoiseMultiplier(1.0, std::nan("")).ok());
}

}  // namespace
}  // namespace cohort::coordinator
