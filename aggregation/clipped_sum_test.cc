#include "aggregation/clipped_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace cohort::aggregation {
namespace {

double Norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += double{x} * x;
  return std::sqrt(s);
}

TEST(ClippedSumTest, LongUpdatesAreScaledToTheClipShortOnesKept) {
  auto agg = NewClippedSum(3, /*clip_norm=*/1.0, /*denominator=*/2);
  ASSERT_TRUE(agg.ok()) << agg.status();
  // Norm 5, clipped to 1 in its direction (0.6, 0.8, 0); norm 0.5 as it is.
  ASSERT_TRUE((*agg)->Accept(0, std::vector<float>{3, 4, 0}, 100).ok());
  ASSERT_TRUE((*agg)->Accept(1, std::vector<float>{0, 0, 0.5f}, 1).ok());
  auto mean = (*agg)->Finalize();
  ASSERT_TRUE(mean.ok());
  // Equal weights whatever the sample counts, over the fixed denominator 2.
  EXPECT_NEAR(mean->delta[0], 0.3, 1e-6);
  EXPECT_NEAR(mean->delta[1], 0.4, 1e-6);
  EXPECT_NEAR(mean->delta[2], 0.25, 1e-7);
}

// The margin is the same on both paths: an update exactly at the clip (or
// within 2^-20 of it) is scaled to C(1 - 2^-20) like a longer one, not
// summed as it is; one just inside the margin is kept.
TEST(ClippedSumTest, UpdatesAtTheClipAreScaledIntoTheMargin) {
  const float inside = 1.0f - 1.0f / (1 << 20);  // Exact in float.
  for (float length : {1.0f, 1.0f - 1.0f / (1 << 22), inside, 0.75f}) {
    auto agg = NewClippedSum(3, /*clip_norm=*/1.0, /*denominator=*/1);
    ASSERT_TRUE((*agg)->Accept(0, std::vector<float>{0, length, 0}, 1).ok());
    auto mean = (*agg)->Finalize();
    ASSERT_TRUE(mean.ok());
    EXPECT_EQ(mean->delta[1], std::min(length, inside)) << length;
    EXPECT_LT(Norm(mean->delta), 1.0) << length;
  }
}

TEST(ClippedSumTest, OneClientMovesTheResultByAtMostTheClipOverTheCohort) {
  // Whatever it sends, one client's share stays within clip / denominator:
  // a dropout (nothing) and a huge update differ by at most that.
  std::vector<float> huge(1000);
  for (size_t i = 0; i < huge.size(); ++i) huge[i] = (i % 2 ? 1e6f : -3e5f);
  std::vector<float> other(1000, 0.01f);
  auto with = NewClippedSum(1000, 2.0, 5);
  auto without = NewClippedSum(1000, 2.0, 5);
  ASSERT_TRUE((*with)->Accept(0, other, 1).ok());
  ASSERT_TRUE((*with)->Accept(1, huge, 1).ok());
  ASSERT_TRUE((*without)->Accept(0, other, 1).ok());
  auto a = (*with)->Finalize(), b = (*without)->Finalize();
  std::vector<float> diff(1000);
  for (size_t i = 0; i < diff.size(); ++i) diff[i] = a->delta[i] - b->delta[i];
  EXPECT_LE(Norm(diff), 2.0 / 5 * (1 + 1e-6));
  EXPECT_GT(Norm(diff), 2.0 / 5 * (1 - 1e-5));
}

TEST(ClippedSumTest, RefusesWhatTheStreamingSumRefusesAndBadSettings) {
  auto agg = NewClippedSum(2, 1.0, 3);
  Status s = (*agg)->Accept(0, std::vector<float>{NAN, 0}, 1);
  EXPECT_NE(s.message().find("NaN or Inf"), std::string::npos) << s.message();
  s = (*agg)->Accept(0, std::vector<float>{1, 2, 3}, 1);
  EXPECT_NE(s.message().find("update has 3 values, expected 2"), std::string::npos);
  ASSERT_TRUE((*agg)->Accept(0, std::vector<float>{300, 400}, 1).ok());  // Clipped.
  EXPECT_EQ((*agg)->Accept(0, std::vector<float>{3, 4}, 1).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ((*agg)->accepted(), 1u);
  EXPECT_EQ(NewClippedSum(2, 0.0, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewClippedSum(2, 1.0, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::aggregation
