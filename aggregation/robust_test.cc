#include "aggregation/robust.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace cohort::aggregation {
namespace {

// The rows as the rules take them.
std::vector<std::span<const float>> Spans(const std::vector<std::vector<float>>& rows) {
  return {rows.begin(), rows.end()};
}

std::vector<float> Apply(const RobustOptions& o, const std::vector<std::vector<float>>& rows) {
  std::vector<float> out(rows[0].size());
  const Status status = ApplyRobustRule(o, Spans(rows), out);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(RobustTest, MedianIsTheMiddleValueOrTheMeanOfTheMiddleTwo) {
  std::vector<std::vector<float>> rows = {{1, 5, -2}, {3, 1, 0}, {2, 9, 4}};
  EXPECT_EQ(Apply({RobustRule::kMedian}, rows), (std::vector<float>{2, 5, 0}));
  rows.push_back({10, 0, 1});
  // Sorted columns: 1 2 3 10 | 0 1 5 9 | -2 0 1 4.
  EXPECT_EQ(Apply({RobustRule::kMedian}, rows), (std::vector<float>{2.5f, 3, 0.5f}));
}

TEST(RobustTest, TrimmedMeanCutsFloorOfTheFractionFromEachEnd) {
  const std::vector<std::vector<float>> five = {{1, -50}, {100, 0}, {3, 1}, {2, 3}, {4, 2}};
  RobustOptions o{RobustRule::kTrimmedMean, 0.2};
  // k = 1: (2 + 3 + 4) / 3 and (0 + 1 + 2) / 3.
  EXPECT_EQ(Apply(o, five), (std::vector<float>{3, 1}));
  o.trim_fraction = 0;  // The plain mean.
  EXPECT_EQ(Apply(o, five), (std::vector<float>{22, -8.8f}));

  // j² for j = 1..20 with the config's 0.35f (0.3499999940...): k = 7, the
  // mean of 8²..13² = 679 / 6 (k = 6 would give 924 / 8).
  std::vector<std::vector<float>> squares;
  for (int j = 20; j >= 1; --j) squares.push_back({static_cast<float>(j * j)});
  o.trim_fraction = 0.35f;
  EXPECT_FLOAT_EQ(Apply(o, squares)[0], 679.0f / 6);
  // j² for j = 1..100 with 0.45f: k = 45 (the float's own 44.99999... x
  // would cut 44), the mean of 46²..55².
  squares.clear();
  for (int j = 100; j >= 1; --j) squares.push_back({static_cast<float>(j * j)});
  o.trim_fraction = 0.45f;
  EXPECT_FLOAT_EQ(Apply(o, squares)[0], 2558.5f);
  // However close to 0.5, one value is left.
  o.trim_fraction = 0.49999997f;
  EXPECT_EQ(Apply(o, {{1}, {7}})[0], 4);
}

// Four honest updates near the origin and one far away; f = 1, so each
// score sums the n - f - 2 = 2 smallest squared distances:
//   u0 (0,0):   to u1 1, u2 4, u3 4, u4 800   -> 1 + 4 = 5
//   u1 (1,0):   to u0 1, u2 1, u3 5, u4 761   -> 2
//   u2 (2,0):   to u0 4, u1 1, u3 8, u4 724   -> 5
//   u3 (0,2):   to u0 4, u1 5, u2 8, u4 724   -> 9
//   u4 (20,20): 800, 761, 724, 724           -> 1448
const std::vector<std::vector<float>> kKrumRows = {{0, 0}, {1, 0}, {2, 0}, {0, 2}, {20, 20}};

TEST(RobustTest, KrumScoresAndPicksTheUpdateClosestToItsNeighbours) {
  EXPECT_EQ(KrumScores(Spans(kKrumRows), 1), (std::vector<double>{5, 2, 5, 9, 1448}));
  EXPECT_EQ(KrumSelect(Spans(kKrumRows), 1, 1), (std::vector<size_t>{1}));
  EXPECT_EQ(Apply({RobustRule::kKrum, 0, 1}, kKrumRows), (std::vector<float>{1, 0}));
}

TEST(RobustTest, MultiKrumAveragesTheBestByScoreUnweighted) {
  // Equal scores (u0, u2) keep the lower index first.
  EXPECT_EQ(KrumSelect(Spans(kKrumRows), 1, 3), (std::vector<size_t>{1, 0, 2}));
  // m = 3: (u0 + u1 + u2) / 3.
  EXPECT_EQ(Apply({RobustRule::kMultiKrum, 0, 1, 3}, kKrumRows), (std::vector<float>{1, 0}));
  // m = 0: n - f = 4, (u0 + u1 + u2 + u3) / 4; the far update never counts.
  EXPECT_EQ(Apply({RobustRule::kMultiKrum, 0, 1, 0}, kKrumRows), (std::vector<float>{0.75f, 0.5f}));
}

// Six honest values 0..5 and 100, f = 1 (n = 7 = 4f + 3): theta = 5 picks,
// each scored within the pool left (n' - f - 2 neighbours, at least 1):
//   pool of 7, 4 neighbours: 2 and 3 score 10, the lowest -> 2
//   0 1 3 4 5 100, 3 neighbours: 3 scores 1 + 4 + 4 = 9    -> 3
//   0 1 4 5 100, 2 neighbours: 1 and 4 score 10            -> 1
//   0 4 5 100, 1 neighbour: 4 and 5 score 1                -> 4
//   0 5 100, 1 neighbour: 0 and 5 score 25                 -> 0
TEST(RobustTest, BulyanSelectsByIteratedKrumThenAveragesTheValuesNearestTheMedian) {
  const std::vector<std::vector<float>> rows = {{0}, {1}, {2}, {3}, {4}, {5}, {100}};
  EXPECT_EQ(BulyanSelect(Spans(rows), 1), (std::vector<size_t>{2, 3, 1, 4, 0}));
  // Selected 2 3 1 4 0: median 2, the beta = 3 nearest 2, 3, 1: mean 2.
  EXPECT_EQ(Apply({RobustRule::kBulyan, 0, 1}, rows), (std::vector<float>{2}));

  // The trim alone, theta = 5, f = 1, beta = 3. Column 0: median 1, nearest
  // 1, 0, 2 -> 1. Column 1: median 5, nearest 5, 5, 6 -> 16 / 3.
  const std::vector<std::vector<float>> selected = {{0, 5}, {10, 5}, {1, 6}, {2, 100}, {-7, -100}};
  std::vector<float> out(2);
  BulyanTrimmedMean(Spans(selected), 1, out);
  EXPECT_EQ(out[0], 1);
  EXPECT_FLOAT_EQ(out[1], 16.0f / 3);
  // Called with theta <= 2f it would wrap beta and read past the column:
  // a programmer's error, stopped (independent review).
  const std::vector<std::vector<float>> two(selected.begin(), selected.begin() + 2);
  EXPECT_DEATH(BulyanTrimmedMean(Spans(two), 1, out), "check failed: theta > 2");
}

TEST(RobustTest, TooFewUpdatesForTheRuleSayWhy) {
  const std::vector<std::vector<float>> four(kKrumRows.begin(), kKrumRows.begin() + 4);
  std::vector<float> out(2);
  Status s = ApplyRobustRule({RobustRule::kKrum, 0, 1}, Spans(four), out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "KRUM tolerating f = 1 needs n >= 2f + 3 = 5 updates, the round has 4");
  s = ApplyRobustRule({RobustRule::kBulyan, 0, 1}, Spans(kKrumRows), out);
  EXPECT_EQ(s.message(), "BULYAN tolerating f = 1 needs n >= 4f + 3 = 7 updates, the round has 5");
  s = ApplyRobustRule({RobustRule::kMultiKrum, 0, 1, 5}, Spans(kKrumRows), out);
  EXPECT_EQ(s.message(), "MULTI_KRUM averages multi_krum_m = 5 updates, more than n - f = 4");
  EXPECT_EQ(RobustMinUpdates({RobustRule::kMedian, 0, 3}), 1u);
  EXPECT_EQ(RobustMinUpdates({RobustRule::kMultiKrum, 0, 3}), 9u);
  EXPECT_EQ(RobustMinUpdates({RobustRule::kBulyan, 0, 3}), 15u);
}

std::unique_ptr<Aggregator> Robust(const RobustOptions& o, size_t n, double max_norm = 0) {
  auto agg = NewRobustAggregator(o, n, max_norm);
  EXPECT_TRUE(agg.ok()) << agg.status();
  return std::move(agg).value();
}

TEST(RobustTest, TheAggregatorRefusesWhatTheStreamingSumRefuses) {
  auto agg = Robust({RobustRule::kMedian}, 2, 10);
  EXPECT_EQ(agg->frame_floats(), 2u);
  EXPECT_FALSE(agg->masked());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(agg->Accept(0, std::vector<float>{1}, 1).message(), "update has 1 values, expected 2");
  EXPECT_EQ(agg->Accept(0, std::vector<float>{1, 1}, 0).message(),
            "update weight 0 is outside [1, 2^40]");
  EXPECT_EQ(agg->Accept(0, std::vector<float>{nan, 1}, 1).message(),
            "update contains NaN or Inf values");
  EXPECT_EQ(agg->Accept(0, std::vector<float>{6, 8.5f}, 1).message(),
            "update has L2 norm 10.4, above server.max_update_norm 10");
  EXPECT_TRUE(agg->Accept(0, std::vector<float>{6, 8}, 1).ok());
  const Status again = agg->Accept(0, std::vector<float>{1, 1}, 1);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(agg->accepted(), 1u);
  EXPECT_EQ(Robust({RobustRule::kMedian}, 2)->Finalize().status().message(),
            "no update was accepted");
}

TEST(RobustTest, TheAggregatorsResultDoesNotDependOnArrivalOrder) {
  for (RobustRule rule : {RobustRule::kMedian, RobustRule::kTrimmedMean, RobustRule::kKrum,
                          RobustRule::kMultiKrum, RobustRule::kBulyan}) {
    const RobustOptions o{rule, 0.2, 1, 0};
    auto forward = Robust(o, 2), backward = Robust(o, 2);
    const std::vector<std::vector<float>> rows = {{0.1f, 3}, {1.7f, 0.2f}, {2, 0.3f},   {0.4f, 2},
                                                  {20, -20}, {1.1f, 1.3f}, {0.9f, 1.5f}};
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_TRUE(forward->Accept(static_cast<uint32_t>(i), rows[i], 10 + i).ok());
      const size_t j = rows.size() - 1 - i;
      ASSERT_TRUE(backward->Accept(static_cast<uint32_t>(j), rows[j], 10 + j).ok());
    }
    auto a = forward->Finalize(), b = backward->Finalize();
    ASSERT_TRUE(a.ok() && b.ok()) << RobustRuleName(rule);
    EXPECT_EQ(std::memcmp(a->delta.data(), b->delta.data(), 2 * sizeof(float)), 0)
        << RobustRuleName(rule);
    EXPECT_LT(std::fabs(a->delta[0]), 3) << RobustRuleName(rule) << ": the outlier counted";
  }
  // A round the rule cannot run on fails at Finalize, saying why.
  auto krum = Robust({RobustRule::kKrum, 0, 2}, 1);
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(krum->Accept(i, std::vector<float>{1}, 1).ok());
  EXPECT_EQ(krum->Finalize().status().message(),
            "KRUM tolerating f = 2 needs n >= 2f + 3 = 7 updates, the round has 6");
}

TEST(RobustTest, AClaimedSampleCountMovesNoRobustAggregate) {
  // kKrumRows, u1 claiming 2^40 samples (the most Accept takes) and the
  // rest 1: every rule gives what it gives unweighted. Multi-Krum selects u1
  // among its m = 4; weighed by the claims, its mean would be u1 = (1, 0)
  // where the four's mean is (0.75, 0.5).
  for (RobustRule rule :
       {RobustRule::kMedian, RobustRule::kTrimmedMean, RobustRule::kKrum, RobustRule::kMultiKrum}) {
    const RobustOptions o{rule, 0.2, 1, 0};
    auto agg = Robust(o, 2);
    for (uint32_t i = 0; i < kKrumRows.size(); ++i) {
      ASSERT_TRUE(agg->Accept(i, kKrumRows[i], i == 1 ? uint64_t{1} << 40 : 1).ok());
    }
    auto mean = agg->Finalize();
    ASSERT_TRUE(mean.ok()) << mean.status();
    EXPECT_EQ(mean->delta, Apply(o, kKrumRows)) << RobustRuleName(rule);
  }
}

}  // namespace
}  // namespace cohort::aggregation
