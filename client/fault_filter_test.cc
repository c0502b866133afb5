#include "client/fault_filter.h"

#include <gtest/gtest.h>

namespace cohort::client {
namespace {

// A plain update of round 2 carrying `values`, as the session makes it.
Outbound PlainUpdate(std::vector<float> values, bool masked = false) {
  Outbound out;
  out.header.mutable_update()->set_round(2);
  out.header.mutable_update()->set_num_samples(100);
  out.header.mutable_update()->set_masked(masked);
  out.payload = std::move(values);
  return out;
}

std::vector<float> Sent(const std::string& misbehave, Outbound out) {
  FaultFilter filter(FaultPlan{aggregation::SecAggStage::kNone, 0, misbehave}, "c0", nullptr,
                     Env::Default());
  Actions a;
  a.send.push_back(std::move(out));
  filter.Apply(a);
  EXPECT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.update().num_samples(), 100u) << misbehave;
  return a.send[0].payload;
}

TEST(FaultFilterTest, AttackersMultiplyTheirPlainUpdates) {
  const std::vector<float> update = {0.5f, -2.0f, 0.0f};
  EXPECT_EQ(Sent("", PlainUpdate(update)), update);
  EXPECT_EQ(Sent("sign_flip", PlainUpdate(update)), (std::vector<float>{-0.5f, 2.0f, 0.0f}));
  EXPECT_EQ(Sent("scale10", PlainUpdate(update)), (std::vector<float>{5.0f, -20.0f, 0.0f}));
  EXPECT_EQ(Sent("sign_flip_scale10", PlainUpdate(update)),
            (std::vector<float>{-5.0f, 20.0f, 0.0f}));
  // A masked update's payload travels as words: the attack leaves it alone.
  Outbound masked = PlainUpdate({}, true);
  masked.words = {1, 2, 3};
  FaultFilter filter(FaultPlan{aggregation::SecAggStage::kNone, 0, "scale10"}, "c0", nullptr,
                     Env::Default());
  Actions a;
  a.send.push_back(std::move(masked));
  filter.Apply(a);
  EXPECT_EQ(a.send[0].words, (std::vector<uint32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace cohort::client
