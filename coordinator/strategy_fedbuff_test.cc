#include "coordinator/strategy_fedbuff.h"

#include <gtest/gtest.h>

#include <vector>

namespace cohort::coordinator {
namespace {

config::RunConfig FedBuffConfig(float server_lr, float server_momentum) {
  config::RunConfig c;
  c.mutable_fedbuff()->set_buffer_size(3);
  c.mutable_server()->set_learning_rate(server_lr);
  c.mutable_server()->set_momentum(server_momentum);
  return c;
}

std::unique_ptr<FedBuffStrategy> Wrapped(const config::RunConfig& config) {
  auto inner = MakeStrategy(config);
  EXPECT_TRUE(inner.ok()) << inner.status().message();
  auto wrapped = FedBuffStrategy::Wrap(std::move(*inner), config);
  EXPECT_TRUE(wrapped.ok()) << wrapped.status().message();
  return std::move(*wrapped);
}

const std::vector<float> kDelta = {0.5f, -1.25f, 3.0f, 1e-3f};
const std::vector<float> kModel = {1.0f, 2.0f, -0.5f, 0.25f};

// The paper's s(tau) = 1 / sqrt(1 + tau).
TEST(FedBuffTest, StalenessWeightIsOneOverTheRootOfOnePlusTau) {
  EXPECT_EQ(FedBuffStalenessWeight(0), 1.0);
  EXPECT_EQ(FedBuffStalenessWeight(1), 0.7071067811865475);
  EXPECT_EQ(FedBuffStalenessWeight(3), 0.5);
  EXPECT_EQ(FedBuffStalenessWeight(8), 1.0 / 3.0);
  EXPECT_EQ(FedBuffStalenessWeight(99), 0.1);
}

// Golden numbers from NumPy in float32 (tests/data/make_fedbuff_golden.py):
// FedAvg at server.learning_rate 0.5 from s(tau) x the group's mean, bit
// for bit.
TEST(FedBuffTest, FedAvgStepsFromTheStalenessWeightedMean) {
  const std::vector<std::pair<uint32_t, std::vector<float>>> golden = {
      {0, {1.25f, 1.375f, 1.0f, 0.25049999356269836f}},
      {1, {1.176776647567749f, 1.558058261871338f, 0.5606601238250732f, 0.25035354495048523f}},
      {3, {1.125f, 1.6875f, 0.25f, 0.2502500116825104f}},
      {8, {1.0833333730697632f, 1.7916666269302368f, 0.0f, 0.250166654586792f}},
      {99, {1.024999976158142f, 1.9375f, -0.3499999940395355f, 0.25005000829696655f}},
  };
  for (const auto& [tau, expected] : golden) {
    auto strategy = Wrapped(FedBuffConfig(0.5f, 0));
    std::vector<float> model = kModel;
    strategy->SetStaleness(tau);
    ASSERT_TRUE(strategy->Aggregate(kDelta, model).ok());
    strategy->CommitAggregate();
    EXPECT_EQ(model, expected) << "staleness " << tau;
  }
}

// FedAvgM's velocity takes the weighted mean: a group of staleness 3, then
// one of staleness 0.
TEST(FedBuffTest, FedAvgMVelocityTakesTheWeightedMean) {
  auto strategy = Wrapped(FedBuffConfig(0.5f, 0.9f));
  std::vector<float> model = kModel;
  for (uint32_t tau : {3u, 0u}) {
    strategy->SetStaleness(tau);
    ASSERT_TRUE(strategy->Aggregate(kDelta, model).ok());
    strategy->CommitAggregate();
  }
  EXPECT_EQ(model, (std::vector<float>{1.4874999523162842f, 0.78125f, 2.424999952316284f,
                                       0.25097501277923584f}));
}

TEST(FedBuffTest, EachStepNeedsItsGroupsStaleness) {
  auto strategy = Wrapped(FedBuffConfig(1, 0));
  std::vector<float> model = kModel;
  Status before = strategy->Aggregate(kDelta, model);
  EXPECT_EQ(before.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(before.message(), "FedBuff: Aggregate before SetStaleness");
  EXPECT_EQ(model, kModel);
  strategy->SetStaleness(0);
  ASSERT_TRUE(strategy->Aggregate(kDelta, model).ok());
  // Used once: the next group needs its own.
  EXPECT_EQ(strategy->Aggregate(kDelta, model).code(), StatusCode::kFailedPrecondition);

  config::RunConfig plain;
  auto refused = FedBuffStrategy::Wrap(std::move(*MakeStrategy(plain)), plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "fedbuff: the config does not ask for buffered aggregation");
}

}  // namespace
}  // namespace cohort::coordinator
