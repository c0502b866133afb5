#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "aggregation/aggregator.h"
#include "aggregation/fixed_point.h"
#include "common/rng.h"
#include "tests/data/optimizer_golden.h"

namespace cohort::aggregation {
namespace {

std::unique_ptr<Aggregator> Streaming(size_t n, double max_norm = 0) {
  auto agg = NewStreamingFedAvg(n, max_norm);
  EXPECT_TRUE(agg.ok()) << agg.status();
  return std::move(agg).value();
}

TEST(FedAvgTest, WeightedMeanBySampleCount) {
  auto agg = Streaming(3);
  std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
  ASSERT_TRUE(agg->Accept(1, a, 100).ok());
  ASSERT_TRUE(agg->Accept(2, b, 300).ok());
  auto mean = agg->Finalize();
  ASSERT_TRUE(mean.ok());
  EXPECT_FLOAT_EQ(mean->delta[0], 0.25f * 1 + 0.75f * 4);
  EXPECT_FLOAT_EQ(mean->delta[2], 0.25f * 3 + 0.75f * 6);
  EXPECT_FALSE(mean->metrics.has_value());
}

// Exact accumulation: any arrival order, bit for bit, and within float
// rounding of a double-precision weighted mean.
TEST(FedAvgTest, ResultDoesNotDependOnArrivalOrder) {
  const size_t n = 10000;
  Rng rng(1);
  std::vector<std::vector<float>> updates(7, std::vector<float>(n));
  for (auto& u : updates) {
    for (float& v : u) v = static_cast<float>(rng.Normal()) * 1e3f;
  }
  for (float& v : updates[3]) v *= 1e-9f;  // Tiny values keep their precision too.
  auto f = Streaming(n), b = Streaming(n);
  for (size_t i = 0; i < updates.size(); ++i) ASSERT_TRUE(f->Accept(i, updates[i], 10 + i).ok());
  for (size_t i = updates.size(); i-- > 0;) ASSERT_TRUE(b->Accept(i, updates[i], 10 + i).ok());
  auto forward = f->Finalize(), backward = b->Finalize();
  ASSERT_TRUE(forward.ok() && backward.ok());
  EXPECT_EQ(forward->delta, backward->delta);
  double total = 0;
  for (size_t i = 0; i < updates.size(); ++i) total += 10 + i;
  for (size_t j = 0; j < n; ++j) {
    double want = 0;
    for (size_t i = 0; i < updates.size(); ++i) want += (10 + i) / total * updates[i][j];
    ASSERT_NEAR(forward->delta[j], want, 1e-6 * std::fabs(want) + 1e-11) << j;
  }
}

TEST(FedAvgTest, BadUpdatesAreRejectedAndLeaveNoTrace) {
  auto agg = Streaming(4);
  std::vector<float> good = {1, 1, 1, 1};
  std::vector<float> short_update = {1, 1, 1};
  std::vector<float> nan = {1, std::numeric_limits<float>::quiet_NaN(), 1, 1};
  std::vector<float> inf = {1, 1, std::numeric_limits<float>::infinity(), 1};
  std::vector<float> huge = {1, 1, 1, 1e7f};
  Status s = agg->Accept(1, short_update, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3 values, expected 4"), std::string::npos);
  EXPECT_NE(agg->Accept(2, nan, 1).message().find("NaN"), std::string::npos);
  EXPECT_FALSE(agg->Accept(3, inf, 1).ok());
  EXPECT_NE(agg->Accept(4, good, 0).message().find("outside [1, 2^40]"), std::string::npos);
  EXPECT_FALSE(agg->Accept(4, good, (uint64_t{1} << 40) + 1).ok());
  EXPECT_NE(agg->Accept(6, huge, 1).message().find("at index 3 is outside (-2^23, 2^23)"),
            std::string::npos);
  EXPECT_EQ(agg->accepted(), 0u);
  ASSERT_TRUE(agg->Accept(5, good, 1).ok());
  EXPECT_EQ(agg->Accept(5, good, 1).code(), StatusCode::kAlreadyExists);
  auto mean = agg->Finalize();
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ(mean->delta, good);
}

TEST(FedAvgTest, NormBoundRefusesLargeUpdates) {
  auto agg = Streaming(2, /*max_norm=*/5);
  std::vector<float> within = {3, 4}, beyond = {3, 4.1f};
  EXPECT_NE(agg->Accept(1, beyond, 1).message().find("above server.max_update_norm 5"),
            std::string::npos);
  // Beyond the exact range too: the norm bound is what the message names.
  std::vector<float> huge = {1e30f, 0};
  EXPECT_NE(agg->Accept(3, huge, 1).message().find("above server.max_update_norm"),
            std::string::npos);
  EXPECT_TRUE(agg->Accept(2, within, 1).ok());
  EXPECT_EQ(agg->accepted(), 1u);
}

// The largest weights and values the sum takes, many times over: no
// overflow, and the mean is still exact.
TEST(FedAvgTest, ExtremeWeightsAndValuesDoNotOverflow) {
  auto agg = Streaming(2);
  const float big = std::nextafter(static_cast<float>(kStreamingMaxValue), 0.0f);
  std::vector<float> u = {big, -big};
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_TRUE(agg->Accept(i, u, uint64_t{1} << 40).ok());
  auto mean = agg->Finalize();
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ(mean->delta, u);
}

TEST(FedAvgTest, FinalizeWithoutUpdatesFails) {
  auto agg = Streaming(2);
  EXPECT_EQ(agg->Finalize().status().code(), StatusCode::kFailedPrecondition);
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

namespace cohort::aggregation {
namespace {

// The federated evaluation's slots: under the masked mean, which weighs
// each client by its training samples n, they give the means weighted by
// its test samples m.
TEST(SecureEvalSlotsTest, TheMaskedMeanGivesTestSampleWeightedMeans) {
  struct Client {
    uint64_t n, m;
    double loss, accuracy;
  } clients[] = {{100, 20, 0.5, 0.8}, {300, 30, 1.5, 0.6}, {50, 0, 9.0, 0.1}, {10, 40, 0.2, 0.9}};
  const float clip = 10;
  double mean[kSecureEvalSlots] = {}, total_n = 0;
  for (const Client& c : clients) {
    float slots[kSecureEvalSlots];
    EvalToSlots(c.m, c.n, c.loss, c.accuracy, clip, slots);
    for (size_t i = 0; i < kSecureEvalSlots; ++i) mean[i] += double(c.n) * slots[i];
    total_n += double(c.n);
  }
  float decoded[kSecureEvalSlots];
  for (size_t i = 0; i < kSecureEvalSlots; ++i) decoded[i] = float(mean[i] / total_n);
  std::optional<SecureEval> e = SlotsToEval(decoded, clip, total_n);
  ASSERT_TRUE(e.has_value());
  // The third client did not evaluate (m = 0): its loss of 9 is nowhere.
  EXPECT_NEAR(e->loss, (20 * 0.5 + 30 * 1.5 + 40 * 0.2) / 90.0, 1e-5);
  EXPECT_NEAR(e->accuracy, (20 * 0.8 + 30 * 0.6 + 40 * 0.9) / 90.0, 1e-5);
  EXPECT_NEAR(e->samples, 90, 1e-3);
}

TEST(SecureEvalSlotsTest, NobodyEvaluatingIsNoneAndTheRatioIsCapped) {
  float slots[kSecureEvalSlots];
  EvalToSlots(0, 100, 0.5, 0.5, 10, slots);
  EXPECT_EQ(slots[0], 0.0f);
  EXPECT_FALSE(SlotsToEval(slots, 10, 100).has_value());
  // A non-finite loss is sent as no evaluation, never as a NaN slot.
  EvalToSlots(10, 100, std::nan(""), 0.5, 10, slots);
  EXPECT_FALSE(SlotsToEval(slots, 10, 100).has_value());
  // 1,000 test samples beside 10 training ones count as kMaxEvalRatio x 10.
  EvalToSlots(1000, 10, 2.0, 0.25, 10, slots);
  EXPECT_FLOAT_EQ(slots[0], 10.0f);
  std::optional<SecureEval> e = SlotsToEval(slots, 10, 10);
  ASSERT_TRUE(e.has_value());
  EXPECT_NEAR(e->samples, kMaxEvalRatio * 10, 1e-3);
  EXPECT_NEAR(e->loss, 2.0, 1e-5);
  EXPECT_NEAR(e->accuracy, 0.25, 1e-6);
  // A loss above kMaxSecureLoss is carried as kMaxSecureLoss.
  EvalToSlots(10, 10, 1e9, 0.5, 10, slots);
  EXPECT_NEAR(SlotsToEval(slots, 10, 10)->loss, kMaxSecureLoss, 1e-3);
  // The coordinator cannot check a masked slot: a client that sent a
  // negative loss still gives a mean in the range the slots encode.
  const float hostile[kSecureEvalSlots] = {1.0f, -5.0f, 0.5f};
  EXPECT_EQ(SlotsToEval(hostile, 10, 10)->loss, 0.0);
}

}  // namespace
}  // namespace cohort::aggregation
