#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "aggregation/aggregator.h"
#include "common/rng.h"
#include "tests/data/optimizer_golden.h"

namespace cohort::aggregation {
namespace {

TEST(FedAvgTest, WeightedMeanBySampleCount) {
  auto agg = std::move(NewFedAvgAggregator(3, 1)).value();
  std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
  ASSERT_TRUE(agg->Accept(1, a, 100).ok());
  ASSERT_TRUE(agg->Accept(2, b, 300).ok());
  std::vector<float> out(3);
  ASSERT_TRUE(agg->Finalize(out).ok());
  EXPECT_FLOAT_EQ(out[0], 0.25f * 1 + 0.75f * 4);
  EXPECT_FLOAT_EQ(out[2], 0.25f * 3 + 0.75f * 6);
}

TEST(FedAvgTest, ResultDoesNotDependOnArrivalOrder) {
  const size_t n = 10000;
  Rng rng(1);
  std::vector<std::vector<float>> updates(7, std::vector<float>(n));
  for (auto& u : updates) {
    for (float& v : u) v = static_cast<float>(rng.Normal()) * 1e3f;
  }
  std::vector<float> forward(n), backward(n);
  auto f = std::move(NewFedAvgAggregator(n, 1)).value();
  auto b = std::move(NewFedAvgAggregator(n, 1)).value();
  for (size_t i = 0; i < updates.size(); ++i) ASSERT_TRUE(f->Accept(i, updates[i], 10 + i).ok());
  for (size_t i = updates.size(); i-- > 0;) ASSERT_TRUE(b->Accept(i, updates[i], 10 + i).ok());
  ASSERT_TRUE(f->Finalize(forward).ok());
  ASSERT_TRUE(b->Finalize(backward).ok());
  EXPECT_EQ(forward, backward);
}

TEST(FedAvgTest, BadUpdatesAreRejectedAndLeaveNoTrace) {
  auto agg = std::move(NewFedAvgAggregator(4, 1)).value();
  std::vector<float> good = {1, 1, 1, 1};
  std::vector<float> short_update = {1, 1, 1};
  std::vector<float> nan = {1, std::numeric_limits<float>::quiet_NaN(), 1, 1};
  std::vector<float> inf = {1, 1, std::numeric_limits<float>::infinity(), 1};
  Status s = agg->Accept(1, short_update, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3 values, expected 4"), std::string::npos);
  EXPECT_NE(agg->Accept(2, nan, 1).message().find("NaN"), std::string::npos);
  EXPECT_FALSE(agg->Accept(3, inf, 1).ok());
  EXPECT_FALSE(agg->Accept(4, good, -1).ok());
  EXPECT_FALSE(agg->Accept(4, good, std::nan("")).ok());
  EXPECT_EQ(agg->accepted(), 0u);
  ASSERT_TRUE(agg->Accept(5, good, 1).ok());
  EXPECT_EQ(agg->Accept(5, good, 1).code(), StatusCode::kAlreadyExists);
  std::vector<float> out(4);
  ASSERT_TRUE(agg->Finalize(out).ok());
  EXPECT_EQ(out, good);
}

TEST(FedAvgTest, TooFewUpdatesFailFinalize) {
  auto agg = std::move(NewFedAvgAggregator(2, 2)).value();
  std::vector<float> u = {1, 2}, out(2);
  ASSERT_TRUE(agg->Accept(1, u, 1).ok());
  EXPECT_EQ(agg->Finalize(out).code(), StatusCode::kFailedPrecondition);
  agg->Remove(1);
  EXPECT_EQ(agg->accepted(), 0u);
}

TEST(FedAvgTest, ServerMomentumAccumulates) {
  std::vector<float> global = {0, 0}, velocity, delta = {1, -1};
  ApplyServerUpdate({1.0f, 0.0f}, delta, global, velocity);
  EXPECT_EQ(global, (std::vector<float>{1, -1}));
  EXPECT_TRUE(velocity.empty());
  global = {0, 0};
  ApplyServerUpdate({0.5f, 0.9f}, delta, global, velocity);
  ApplyServerUpdate({0.5f, 0.9f}, delta, global, velocity);
  // v1 = 1, v2 = 1.9; global = 0.5 * (1 + 1.9).
  EXPECT_FLOAT_EQ(global[0], 1.45f);
  EXPECT_FLOAT_EQ(velocity[1], -1.9f);
}

// FedAvgM is torch.optim.SGD with momentum on the pseudo-gradient -delta:
// three rounds against values recorded with PyTorch.
TEST(FedAvgTest, ServerOptimizerMatchesPyTorchGoldenVectors) {
  int checked = 0;
  for (const testing::OptimizerGolden& c : testing::ReadOptimizerGolden()) {
    if (c.kind != "server") continue;
    std::vector<float> global = testing::kGoldenStart, velocity;
    for (const auto& delta : testing::kGoldenGrads) {
      ApplyServerUpdate({c.lr, c.momentum}, delta, global, velocity);
    }
    ASSERT_EQ(c.expected.size(), global.size());
    for (size_t i = 0; i < global.size(); ++i) {
      EXPECT_NEAR(global[i], c.expected[i], 1e-6 * std::max(1.0, std::fabs(c.expected[i])))
          << c.name << ", parameter " << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2) << "tests/data/optimizer_golden.txt is missing the server cases";
}

}  // namespace
}  // namespace cohort::aggregation
