#include "client/session.h"

#include <gtest/gtest.h>

#include <limits>

namespace cohort::client {
namespace {

constexpr size_t kParams = 4;

net::Envelope Env(wire::Header h, std::vector<float> payload = {}) {
  h.set_version(wire::VERSION_1);
  net::Envelope e;
  e.header = std::move(h);
  if (!payload.empty()) e.payloads.push_back(std::move(payload));
  return e;
}

net::Envelope Welcome(uint32_t num_params = kParams) {
  wire::Header h;
  h.mutable_welcome()->set_num_params(num_params);
  h.mutable_welcome()->set_heartbeat_s(1.0f);
  return Env(h);
}

net::Envelope Task(uint32_t round, uint64_t task_id, std::vector<float> model) {
  wire::Header h;
  h.mutable_task()->set_round(round);
  h.mutable_task()->set_task_id(task_id);
  h.mutable_task()->set_train_seed(99);
  h.mutable_task()->mutable_train()->set_batch_size(8);
  h.mutable_task()->mutable_train()->set_local_epochs(1);
  h.mutable_task()->mutable_train()->set_learning_rate(0.1f);
  return Env(h, std::move(model));
}

class SessionTest : public ::testing::Test {
 protected:
  Session Make(uint32_t pause = 0) {
    return Session(
        "c1", 50,
        [this](const config::ModelConfig&) -> StatusOr<size_t> {
          ++builds_;
          return kParams;
        },
        nullptr, FaultPlan{"masked_input", pause});
  }
  int builds_ = 0;
};

TEST_F(SessionTest, HelloUntilWelcomedThenHeartbeats) {
  Session s = Make();
  Actions a = s.Start(0);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.hello().client_name(), "c1");
  EXPECT_EQ(a.send[0].header.hello().num_samples(), 50u);
  EXPECT_TRUE(s.OnTick(100).send.empty());
  a = s.OnTick(250);  // Unwelcomed: retry quickly.
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.send[0].header.has_hello());
  s.OnMessage(Welcome(), 300);
  EXPECT_TRUE(s.welcomed());
  EXPECT_EQ(builds_, 1);
  a = s.OnTick(1250);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.send[0].header.has_heartbeat());
  // The coordinator went quiet for 3 heartbeats: hello again.
  a = s.OnTick(5000);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.send[0].header.has_hello());
}

TEST_F(SessionTest, ModelSizeMismatchStopsTheClient) {
  Session s = Make();
  s.Start(0);
  Actions a = s.OnMessage(Welcome(kParams + 1), 10);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_EQ(a.exit->code(), StatusCode::kFailedPrecondition);
}

TEST_F(SessionTest, TaskTrainsOnceAndSendsTheDelta) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  Actions a = s.OnMessage(Task(1, 7, {1, 2, 3, 4}), 20);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->options.seed, 99u);
  EXPECT_EQ(a.train->options.batch_size, 8u);
  EXPECT_FALSE(a.cancel_training);
  // The same task re-sent (after a reconnect) starts nothing.
  EXPECT_FALSE(s.OnMessage(Task(1, 7, {1, 2, 3, 4}), 30).train.has_value());
  train::TrainResult r;
  r.mean_loss = 0.5;
  std::vector<float> local = {1.5f, 2, 2.5f, 4};
  a = s.OnTrainingDone(7, r, local, 40);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.update().round(), 1u);
  EXPECT_EQ(a.send[0].header.update().task_id(), 7u);
  EXPECT_EQ(a.send[0].header.update().num_samples(), 50u);
  EXPECT_EQ(a.send[0].payload, (std::vector<float>{0.5f, 0, -0.5f, 0}));
  // Re-sent after completion: still nothing.
  EXPECT_FALSE(s.OnMessage(Task(1, 7, {1, 2, 3, 4}), 50).train.has_value());
}

TEST_F(SessionTest, BadTasksAreIgnored) {
  Session s = Make();
  s.Start(0);
  EXPECT_FALSE(s.OnMessage(Task(1, 1, {1, 2, 3, 4}), 5).train.has_value());  // Before welcome.
  s.OnMessage(Welcome(), 10);
  EXPECT_FALSE(s.OnMessage(Task(1, 2, {1, 2, 3}), 20).train.has_value());
  EXPECT_FALSE(
      s.OnMessage(Task(1, 3, {1, std::numeric_limits<float>::quiet_NaN(), 3, 4}), 30).train);
  net::Envelope bad_lr = Task(1, 4, {1, 2, 3, 4});
  bad_lr.header.mutable_task()->mutable_train()->set_learning_rate(-1);
  EXPECT_FALSE(s.OnMessage(bad_lr, 40).train.has_value());
  EXPECT_FALSE(s.OnMessage(Task(0, 5, {1, 2, 3, 4}), 50).train.has_value());
}

TEST_F(SessionTest, ReplacementTaskCancelsTheOldJobAndItsResultIsDropped) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  s.OnMessage(Task(2, 10, {0, 0, 0, 0}), 20);
  Actions a = s.OnMessage(Task(2, 11, {0, 0, 0, 0}), 30);  // Coordinator restarted the round.
  EXPECT_TRUE(a.cancel_training);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->task_id, 11u);
  std::vector<float> local(kParams, 1.0f);
  EXPECT_TRUE(s.OnTrainingDone(10, train::TrainResult{}, local, 40).send.empty());
  EXPECT_EQ(s.OnTrainingDone(11, train::TrainResult{}, local, 50).send.size(), 1u);
}

TEST_F(SessionTest, FaultInjectionWithholdsTheUpdate) {
  Session s = Make(/*pause=*/2);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  s.OnMessage(Task(2, 5, {0, 0, 0, 0}), 20);
  std::vector<float> local(kParams, 1.0f);
  Actions a = s.OnTrainingDone(5, train::TrainResult{}, local, 30);
  EXPECT_TRUE(a.send.empty());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "paused before update of round 2");
}

TEST_F(SessionTest, UnknownClientReRegistersFinishedAcknowledgesAndRejectStops) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  wire::Header unknown;
  unknown.mutable_error()->set_code(wire::UNKNOWN_CLIENT);
  Actions a = s.OnMessage(Env(unknown), 20);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.send[0].header.has_hello());
  EXPECT_FALSE(s.welcomed());
  wire::Header finished;
  finished.mutable_finished()->set_rounds(3);
  a = s.OnMessage(Env(finished), 30);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_TRUE(a.exit->ok());
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.send[0].header.has_heartbeat());

  Session r = Make();
  r.Start(0);
  wire::Header reject;
  reject.mutable_reject()->set_reason("name taken");
  a = r.OnMessage(Env(reject), 10);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_NE(a.exit->message().find("name taken"), std::string::npos);
}

}  // namespace
}  // namespace cohort::client
