#include "coordinator/messages.h"

#include <gtest/gtest.h>

namespace cohort::coordinator {
namespace {

// A client refuses a header of another wire version: every builder sets it.
TEST(MessagesTest, EveryMessageSpeaksTheWireVersion) {
  config::RunConfig config;
  config.set_name("run");
  aggregation::SecAggSetup setup;
  setup.n = 3;
  auto model = std::make_shared<const std::vector<float>>(4, 1.0f);
  const std::vector<Outgoing> sent = {
      ErrorMessage("p", wire::STALE, "late", 2),
      RejectMessage("p", "unknown key"),
      WelcomeMessage("p", "c0", config, 4, std::string(32, 'a')),
      HeartbeatAckMessage("p"),
      FinishedMessage("p", 5),
      TaskMessage("p", 3, 7, {}, 10, nullptr, model),
      TaskMessage("p", 3, 7, {}, 10, &setup, model),
      SecAggStartMessage("p", 3, 7, setup),
  };
  for (const Outgoing& o : sent) {
    EXPECT_EQ(o.peer, "p");
    EXPECT_EQ(o.header.version(), wire::VERSION_1) << o.header.ShortDebugString();
    EXPECT_NE(o.header.body_case(), wire::Header::BODY_NOT_SET);
  }
}

// The task is the strategy's, completed with the session and the deadline,
// and carries the round's model without copying it.
TEST(MessagesTest, ATaskKeepsTheStrategysFieldsAndSharesTheModel) {
  wire::RoundTask configured;
  configured.set_train_seed(99);
  auto model = std::make_shared<const std::vector<float>>(4, 1.0f);
  aggregation::SecAggSetup setup;
  setup.n = 5;
  setup.t = 3;
  const Outgoing o = TaskMessage("p", 3, 7, configured, 12.5f, &setup, model);
  const wire::RoundTask& t = o.header.task();
  EXPECT_EQ(t.train_seed(), 99u);
  EXPECT_EQ(t.round(), 3u);
  EXPECT_EQ(t.task_id(), 7u);
  EXPECT_EQ(t.deadline_s(), 12.5f);
  EXPECT_TRUE(t.has_secagg());
  EXPECT_EQ(o.payload.get(), model.get());
  EXPECT_FALSE(
      TaskMessage("p", 3, 7, configured, 12.5f, nullptr, model).header.task().has_secagg());
}

TEST(MessagesTest, AnErrorNamesTheRoundItIsAbout) {
  const Outgoing o = ErrorMessage("p", wire::NOT_SELECTED, "not selected for round 4", 4);
  EXPECT_EQ(o.header.error().code(), wire::NOT_SELECTED);
  EXPECT_EQ(o.header.error().round(), 4u);
  EXPECT_EQ(o.header.error().message(), "not selected for round 4");
}

}  // namespace
}  // namespace cohort::coordinator
