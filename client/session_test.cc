#include "client/session.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <stdlib.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>

#include "aggregation/secagg_wire.h"
#include "client/control_variate.h"
#include "client/dp_ledger.h"
#include "common/bytes.h"

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
        nullptr, FaultPlan{aggregation::SecAggStage::kMaskedInput, pause, ""});
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

// Hello carries the shard's digest for the run's lineage, except from a
// client pinned to distributed DP: it would let the coordinator, which
// that client does not trust, confirm a guess of its data.
TEST_F(SessionTest, HelloCarriesTheDataDigestUnlessTheClientIsPinnedToDistributedDp) {
  Session s = Make();
  s.set_data_sha256("ab12");
  EXPECT_EQ(s.Start(0).send.at(0).header.hello().data_sha256(), "ab12");
  Session pinned = Make();
  pinned.set_data_sha256("ab12");
  pinned.set_dp_noise_multiplier(1.0);
  Actions a = pinned.Start(0);
  ASSERT_TRUE(a.send.at(0).header.has_hello());
  EXPECT_EQ(a.send[0].header.hello().data_sha256(), "");
  EXPECT_EQ(a.send[0].header.hello().client_name(), "c1");
}

// A model the client cannot build stops it, and the reason, which may quote
// the coordinator's config, is one line of printable text.
TEST_F(SessionTest, AModelItCannotBuildStopsItSayingWhyInPrintableText) {
  Session s(
      "c1", 50,
      [](const config::ModelConfig& m) -> StatusOr<size_t> {
        return InvalidArgumentError("unknown model.arch \"" + m.arch() + "\"");
      },
      nullptr);
  s.Start(0);
  net::Envelope welcome = Welcome();
  welcome.header.mutable_welcome()->mutable_model()->set_arch("mlp\nround 9 committed");
  Actions a = s.OnMessage(welcome, 10);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_EQ(a.exit->message(), "unknown model.arch \"mlp?round 9 committed\"");
}

// Lines go to the injected Env's logger. What the coordinator says (the
// run's name and nonce, an error, a rejection) is logged as one line of
// printable text: it cannot forge lines of the client's log.
TEST_F(SessionTest, LinesGoToTheInjectedEnvsLogger) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  sink->set_pattern("%v");
  LogRedirectEnv env(cohort::Env::Default(), std::make_shared<spdlog::logger>("t", sink));
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, nullptr,
      FaultPlan{}, InputObserver{}, &env);
  s.Start(0);
  net::Envelope welcome = Welcome();
  welcome.header.mutable_welcome()->set_run_name("mnist");
  welcome.header.mutable_welcome()->set_run_nonce("0123abcd");
  s.OnMessage(welcome, 300);
  EXPECT_NE(out.str().find("registered with run mnist (nonce 0123abcd)"), std::string::npos)
      << out.str();
  // The same run again (a reconnect) says nothing; another nonce is said.
  s.OnMessage(welcome, 350);
  EXPECT_EQ(out.str().find("now names"), std::string::npos) << out.str();
  welcome.header.mutable_welcome()->set_run_nonce("ffff\n");
  s.OnMessage(welcome, 400);
  EXPECT_NE(out.str().find("the coordinator now names run mnist (nonce ffff?), not mnist (nonce "
                           "0123abcd): its rounds count as another run's in the ledger of noised "
                           "rounds"),
            std::string::npos)
      << out.str();
  wire::Header error;
  error.mutable_error()->set_round(3);
  error.mutable_error()->set_message("disk full\nround 9 committed\x1b[2J");
  s.OnMessage(Env(error), 450);
  EXPECT_NE(out.str().find("\ncoordinator error (round 3): disk full?round 9 committed?[2J\n"),
            std::string::npos)
      << out.str();
  wire::Header reject;
  reject.mutable_reject()->set_reason("name taken\r\nc2 admitted" + std::string(2000, 'x'));
  Actions a = s.OnMessage(Env(reject), 500);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_EQ(a.exit->message(), "coordinator rejected this client: name taken??c2 admitted" +
                                   std::string(1024 - 23, 'x') + "...");
}

// FedNova (train.fednova): the plain update is the delta divided by the
// normaliser of the steps the trainer took, which goes with it; a trainer
// that reports no steps leaves the round saying why.
TEST_F(SessionTest, AFedNovaTaskSendsTheNormalisedDeltaAndItsNormaliser) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope task = Task(1, 7, {1, 2, 3, 4});
  task.header.mutable_task()->mutable_train()->set_fednova(true);
  task.header.mutable_task()->mutable_train()->set_momentum(0.5f);
  Actions a = s.OnMessage(task, 20);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_TRUE(a.train->fednova);
  train::TrainResult r;
  r.steps = 2;  // a = (2 - 0.5 (1 - 0.25) / 0.5) / 0.5 = 2.5
  std::vector<float> local = {1.5f, 2, 2.5f, 4};
  a = s.OnTrainingDone(7, r, local, 40);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.update().fednova_norm(), 2.5);
  EXPECT_EQ(a.send[0].payload, (std::vector<float>{0.2f, 0, -0.2f, 0}));

  net::Envelope next = Task(2, 8, {1, 2, 3, 4});
  next.header.mutable_task()->mutable_train()->set_fednova(true);
  ASSERT_TRUE(s.OnMessage(next, 50).train.has_value());
  a = s.OnTrainingDone(8, train::TrainResult{}, local, 60);
  ASSERT_EQ(a.send.size(), 1u);
  ASSERT_TRUE(a.send[0].header.has_goodbye());
  EXPECT_EQ(a.send[0].header.goodbye().reason(),
            "training failed: train.fednova: the trainer reports no local steps (a Python fit "
            "must return metrics['steps']), so the update has no normaliser");

  // More steps than the coordinator's trainer takes on 50 samples in
  // batches of 8 (7): the update is not sent (the coordinator would refuse
  // it), and a Python fit learns why.
  net::Envelope long_task = Task(3, 10, {1, 2, 3, 4});
  long_task.header.mutable_task()->mutable_train()->set_fednova(true);
  ASSERT_TRUE(s.OnMessage(long_task, 62).train.has_value());
  train::TrainResult too_many;
  too_many.steps = 8;
  a = s.OnTrainingDone(10, too_many, local, 64);
  ASSERT_EQ(a.send.size(), 1u);
  ASSERT_TRUE(a.send[0].header.has_goodbye());
  EXPECT_EQ(a.send[0].header.goodbye().reason(),
            "training failed: train.fednova: 8 steps, more than the 7 of train.local_epochs 1 x "
            "ceil(50 samples / train.batch_size 8), the most the coordinator accepts (a Python "
            "fit must batch by task.batch_size over the num_samples it declared)");
  net::Envelope seven = Task(3, 11, {1, 2, 3, 4});
  seven.header.mutable_task()->mutable_train()->set_fednova(true);
  ASSERT_TRUE(s.OnMessage(seven, 65).train.has_value());
  too_many.steps = 7;
  a = s.OnTrainingDone(11, too_many, local, 66);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.update().fednova_norm(), 7);

  // A task that asks FedNova of Adam is refused before training.
  net::Envelope adam = Task(4, 9, {1, 2, 3, 4});
  adam.header.mutable_task()->mutable_train()->set_fednova(true);
  adam.header.mutable_task()->mutable_train()->set_optimizer(config::ADAM);
  EXPECT_FALSE(s.OnMessage(adam, 70).train.has_value());
}

// A model.external run's fit counts its own steps (its loader's batches are
// its own): only a normaliser above 1e5 stops the update.
TEST_F(SessionTest, AnExternalModelsFedNovaStepsAreBoundedOnlyBy1e5) {
  Session s = Make();
  s.Start(0);
  net::Envelope welcome = Welcome();
  welcome.header.mutable_welcome()->mutable_model()->mutable_external()->set_num_params(kParams);
  s.OnMessage(welcome, 10);
  const std::vector<float> local = {1.5f, 2, 2.5f, 4};
  for (uint64_t steps : {1000u, 200000u}) {
    net::Envelope task = Task(1, steps, {1, 2, 3, 4});
    task.header.mutable_task()->mutable_train()->set_fednova(true);
    ASSERT_TRUE(s.OnMessage(task, 20).train.has_value());
    train::TrainResult r;
    r.steps = steps;
    Actions a = s.OnTrainingDone(steps, r, local, 40);
    ASSERT_EQ(a.send.size(), 1u);
    if (steps == 1000) {
      EXPECT_EQ(a.send[0].header.update().fednova_norm(), 1000);
      continue;
    }
    EXPECT_EQ(a.send[0].header.goodbye().reason(),
              "training failed: train.fednova: 200000 steps with momentum 0 give the normaliser "
              "200000, above the 100000 an update carries; lower train.local_epochs or raise "
              "train.batch_size");
  }
}

// SCAFFOLD (train.scaffold): the task carries [x | c]; the trainer gets
// c - c_i; the update is [y - x | c_i+ - c_i]; c_i+ goes to the state
// directory, where a restarted session finds it.
TEST_F(SessionTest, AScaffoldTaskKeepsTheClientVariateAcrossARestart) {
  char dir_template[] = "/tmp/cohort-scaffold-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto scaffold_task = [](uint64_t id, std::vector<float> payload) {
    net::Envelope t = Task(1, id, std::move(payload));
    t.header.mutable_task()->mutable_train()->set_scaffold(true);
    t.header.mutable_task()->mutable_train()->set_learning_rate(0.125f);
    return t;
  };
  {
    Session s = Make();
    s.set_state_dir(dir);
    s.Start(0);
    s.OnMessage(Welcome(), 10);
    // Without c after the model, the task is refused.
    EXPECT_FALSE(s.OnMessage(scaffold_task(6, {1, 2, 3, 4}), 15).train.has_value());
    Actions a = s.OnMessage(scaffold_task(7, {1, 2, 3, 4, 0.5f, 0, 0, -0.5f}), 20);
    ASSERT_TRUE(a.train.has_value());
    EXPECT_TRUE(a.train->scaffold);
    EXPECT_EQ(a.train->global, (std::vector<float>{1, 2, 3, 4}));
    // c_i starts at zeros: the correction is c itself.
    EXPECT_EQ(a.train->options.scaffold_correction, (std::vector<float>{0.5f, 0, 0, -0.5f}));
    train::TrainResult r;
    r.steps = 2;  // K lr = 0.25: (x - y) / (K lr) = {1, 0, 0, -1}.
    a = s.OnTrainingDone(7, r, std::vector<float>{0.75f, 2, 3, 4.25f}, 40);
    ASSERT_EQ(a.send.size(), 1u);
    ASSERT_TRUE(a.send[0].header.has_update());
    EXPECT_EQ(a.send[0].payload, (std::vector<float>{-0.25f, 0, 0, 0.25f, 0.5f, 0, 0, -0.5f}));
    EXPECT_EQ(std::vector<float>(s.control_variate().begin(), s.control_variate().end()),
              (std::vector<float>{0.5f, 0, 0, -0.5f}));
  }
  // A restarted client reads c_i back: with c = 0 a round-2 task's
  // correction is -c_i; round 1 run again starts from the c_i before it.
  Session restarted = Make();
  restarted.set_state_dir(dir);
  restarted.Start(100);
  restarted.OnMessage(Welcome(), 110);
  Actions again = restarted.OnMessage(scaffold_task(9, {1, 2, 3, 4, 0.5f, 0, 0, -0.5f}), 115);
  ASSERT_TRUE(again.train.has_value());
  EXPECT_EQ(again.train->options.scaffold_correction, (std::vector<float>{0.5f, 0, 0, -0.5f}));
  net::Envelope round2 = scaffold_task(8, {1, 2, 3, 4, 0, 0, 0, 0});
  round2.header.mutable_task()->set_round(2);
  Actions a = restarted.OnMessage(round2, 120);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->options.scaffold_correction, (std::vector<float>{-0.5f, 0, 0, 0.5f}));
  // No steps: the round is left, and c_i stays as it was.
  a = restarted.OnTrainingDone(8, train::TrainResult{}, std::vector<float>{1, 2, 3, 4}, 130);
  ASSERT_EQ(a.send.size(), 1u);
  ASSERT_TRUE(a.send[0].header.has_goodbye());
  EXPECT_EQ(a.send[0].header.goodbye().reason(),
            "train.scaffold: the trainer reports no local steps, so c_i+ = c_i - c + (x - y) / "
            "(K lr) has no K");
  const ClientVariate kept = LoadControlVariate(ControlVariatePath(dir), kParams).value();
  EXPECT_EQ(kept.round, 1u);
  EXPECT_EQ(kept.before, (std::vector<float>(kParams, 0.0f)));
  EXPECT_EQ(kept.after, (std::vector<float>{0.5f, 0, 0, -0.5f}));
  std::filesystem::remove_all(dir);
}

// An update the coordinator refuses (an error naming its task: late,
// invalid, not selected) did not move the coordinator's c, so c_i goes
// back to what the round trained from, in memory and in the state
// directory; an error about another task, or none, leaves it.
TEST_F(SessionTest, ARefusedScaffoldUpdateTakesBackItsVariateChange) {
  char dir_template[] = "/tmp/cohort-scaffold-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto scaffold_task = [](uint32_t round, uint64_t id) {
    net::Envelope t = Task(round, id, {1, 2, 3, 4, 0.5f, 0, 0, -0.5f});
    t.header.mutable_task()->mutable_train()->set_scaffold(true);
    t.header.mutable_task()->mutable_train()->set_learning_rate(0.125f);
    return t;
  };
  auto error_for = [](uint64_t task_id) {
    wire::Header h;
    h.mutable_error()->set_code(wire::STALE);
    h.mutable_error()->set_round(2);
    h.mutable_error()->set_message("update for round 1, current round is 2");
    h.mutable_error()->set_task_id(task_id);
    return Env(h);
  };
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::default_logger_raw()->sinks().push_back(sink);
  Session s = Make();
  s.set_state_dir(dir);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  ASSERT_TRUE(s.OnMessage(scaffold_task(1, 7), 20).train.has_value());
  train::TrainResult r;
  r.steps = 2;  // c_i+ = {0.5, 0, 0, -0.5}, as in the test above.
  ASSERT_EQ(s.OnTrainingDone(7, r, std::vector<float>{0.75f, 2, 3, 4.25f}, 40).send.size(), 1u);
  const std::vector<float> moved = {0.5f, 0, 0, -0.5f}, zeros(kParams, 0.0f);
  s.OnMessage(error_for(8), 50);  // Another task's: c_i stays.
  s.OnMessage(error_for(0), 55);  // Not about an update: c_i stays.
  EXPECT_EQ(std::vector<float>(s.control_variate().begin(), s.control_variate().end()), moved);
  s.OnMessage(error_for(7), 60);
  EXPECT_EQ(std::vector<float>(s.control_variate().begin(), s.control_variate().end()), zeros);
  EXPECT_EQ(LoadControlVariate(ControlVariatePath(dir), kParams).value().after, zeros);
  EXPECT_NE(out.str().find("SCAFFOLD: round 1's update did not count, so c_i goes back to what "
                           "the round trained from"),
            std::string::npos)
      << out.str();
  // Round 2 starts from c_i = 0: its correction is c itself.
  Actions a = s.OnMessage(scaffold_task(2, 9), 70);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->options.scaffold_correction, (std::vector<float>{0.5f, 0, 0, -0.5f}));

  // Round 2's update moves c_i to Δc_i = -c + 4 (x - y) = -c (y = x); round
  // 3 trains from it, and round 2's refusal comes while round 3 trains
  // (the coordinator sent round 3's task before it read the late update):
  // c_i goes back under round 3, whose change then lands on round 3's
  // rightful start, 0, not on the -c it trained from.
  ASSERT_EQ(s.OnTrainingDone(9, r, std::vector<float>{1, 2, 3, 4}, 80).send.size(), 1u);
  const std::vector<float> minus_c = {-0.5f, 0, 0, 0.5f};
  EXPECT_EQ(std::vector<float>(s.control_variate().begin(), s.control_variate().end()), minus_c);
  a = s.OnMessage(scaffold_task(3, 11), 90);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->options.scaffold_correction, (std::vector<float>{1, 0, 0, -1}));
  s.OnMessage(error_for(9), 95);
  ASSERT_EQ(s.OnTrainingDone(11, r, std::vector<float>{1, 2, 3, 4}, 100).send.size(), 1u);
  EXPECT_EQ(std::vector<float>(s.control_variate().begin(), s.control_variate().end()), minus_c)
      << "round 3's change landed on the c_i round 2's refusal took back";
  const ClientVariate kept = LoadControlVariate(ControlVariatePath(dir), kParams).value();
  EXPECT_EQ(kept.round, 3u);
  EXPECT_EQ(kept.before, zeros);
  EXPECT_EQ(kept.after, minus_c);

  // A restarted client never saw which task moved c_i: an error naming no
  // task leaves it.
  Session restarted = Make();
  restarted.set_state_dir(dir);
  restarted.Start(200);
  restarted.OnMessage(Welcome(), 210);
  ASSERT_TRUE(restarted.OnMessage(scaffold_task(4, 13), 220).train.has_value());
  restarted.OnMessage(error_for(0), 230);
  EXPECT_EQ(
      std::vector<float>(restarted.control_variate().begin(), restarted.control_variate().end()),
      minus_c);
  spdlog::default_logger_raw()->sinks().pop_back();
  std::filesystem::remove_all(dir);
}

// c_i is one run's: a client that joins another run (here another run
// name; a new run nonce or coordinator key too) starts its c_i at zero, as
// that run's c starts, whether c_i was in its state directory or only in
// memory. A file from before variates named their run is no run's.
TEST_F(SessionTest, AControlVariateIsNotCarriedIntoAnotherRun) {
  char dir_template[] = "/tmp/cohort-scaffold-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto welcome = [](const std::string& run) {
    net::Envelope w = Welcome();
    w.header.mutable_welcome()->set_run_name(run);
    return w;
  };
  // c = {0.5, 0, 0, -0.5} in round `round`.
  auto scaffold_task = [](uint32_t round, uint64_t id) {
    net::Envelope t = Task(round, id, {1, 2, 3, 4, 0.5f, 0, 0, -0.5f});
    t.header.mutable_task()->mutable_train()->set_scaffold(true);
    t.header.mutable_task()->mutable_train()->set_learning_rate(0.125f);
    return t;
  };
  // One round of run-a: c_i+ = {0.5, 0, 0, -0.5} (as in the test above).
  auto train_round_one = [&](Session& s) {
    ASSERT_TRUE(s.OnMessage(scaffold_task(1, 7), 20).train.has_value());
    train::TrainResult r;
    r.steps = 2;
    s.OnTrainingDone(7, r, std::vector<float>{0.75f, 2, 3, 4.25f}, 40);
    ASSERT_EQ(std::vector<float>(s.control_variate().begin(), s.control_variate().end()),
              (std::vector<float>{0.5f, 0, 0, -0.5f}));
  };
  const std::vector<float> c = {0.5f, 0, 0, -0.5f}, zero(kParams, 0.0f);
  {
    Session s = Make();
    s.set_state_dir(dir);
    s.Start(0);
    s.OnMessage(welcome("run-a"), 10);
    train_round_one(s);
  }
  // Run-a again (a restart): round 2's correction is c - c_i = 0.
  Session same = Make();
  same.set_state_dir(dir);
  same.Start(0);
  same.OnMessage(welcome("run-a"), 10);
  EXPECT_EQ(same.OnMessage(scaffold_task(2, 8), 20).train->options.scaffold_correction, zero);
  // Run-b on the same state directory: c_i is zero, the correction is c.
  Session other = Make();
  other.set_state_dir(dir);
  other.Start(0);
  other.OnMessage(welcome("run-b"), 10);
  EXPECT_EQ(other.OnMessage(scaffold_task(2, 9), 20).train->options.scaffold_correction, c);
  // In memory: the coordinator's next Welcome names another run.
  Session memory = Make();
  memory.Start(0);
  memory.OnMessage(welcome("run-a"), 10);
  train_round_one(memory);
  memory.OnMessage(welcome("run-b"), 50);
  EXPECT_EQ(memory.OnMessage(scaffold_task(2, 10), 60).train->options.scaffold_correction, c);
  // The format before the run id ("CHTSCAF1": count, round, CRC, values).
  std::vector<float> values = {0, 0, 0, 0, 0.5f, 0, 0, -0.5f};
  std::string old_file = "CHTSCAF1";
  PutU64(old_file, kParams);
  PutU32(old_file, 1);
  PutU32(old_file, Crc32({reinterpret_cast<const uint8_t*>(values.data()), 32}));
  old_file.append(reinterpret_cast<const char*>(values.data()), 32);
  std::ofstream(ControlVariatePath(dir), std::ios::binary | std::ios::trunc) << old_file;
  const ClientVariate loaded = LoadControlVariate(ControlVariatePath(dir), kParams).value();
  EXPECT_EQ(loaded.after, c);
  EXPECT_EQ(loaded.run, (std::array<uint8_t, 32>{}));
  Session upgraded = Make();
  upgraded.set_state_dir(dir);
  upgraded.Start(0);
  upgraded.OnMessage(welcome("run-a"), 10);
  EXPECT_EQ(upgraded.OnMessage(scaffold_task(2, 11), 20).train->options.scaffold_correction, c);
  std::filesystem::remove_all(dir);
}

// A variate file that is corrupt or of another model's size is never used
// or overwritten: each SCAFFOLD task is left with a Goodbye naming the file.
TEST_F(SessionTest, ABadVariateFileLeavesTheRoundNamingIt) {
  char dir_template[] = "/tmp/cohort-scaffold-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string path = ControlVariatePath(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"garbage", path + ": SCAFFOLD control variate: not a control variate file (bad magic or "
                         "cut short)"},
      {"three values", path + ": SCAFFOLD control variate: holds 3 values, the model has 4"},
      {"flipped bit", path + ": SCAFFOLD control variate: CRC-32 mismatch"},
  };
  for (const auto& [what, message] : cases) {
    if (what == "garbage") {
      std::ofstream(path, std::ios::binary) << "not a variate";
    } else if (what == "three values") {
      ASSERT_TRUE(SaveControlVariate(path, {1, {1, 2, 3}, {1, 2, 3}}).ok());
    } else {
      ASSERT_TRUE(SaveControlVariate(path, {1, {1, 2, 3, 4}, {1, 2, 3, 4}}).ok());
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-1, std::ios::end);
      f.put('\x7f');
    }
    Session s = Make();
    s.set_state_dir(dir);
    s.Start(0);
    s.OnMessage(Welcome(), 10);
    net::Envelope t = Task(1, 7, {1, 2, 3, 4, 0, 0, 0, 0});
    t.header.mutable_task()->mutable_train()->set_scaffold(true);
    Actions a = s.OnMessage(t, 20);
    EXPECT_FALSE(a.train.has_value()) << what;
    ASSERT_EQ(a.send.size(), 1u) << what;
    ASSERT_TRUE(a.send[0].header.has_goodbye()) << what;
    EXPECT_EQ(a.send[0].header.goodbye().task_id(), 7u);
    EXPECT_EQ(a.send[0].header.goodbye().reason(), message);
    ASSERT_EQ(a.printed.size(), 1u);
    EXPECT_EQ(a.printed[0], "round 1: " + message + "; leaving the round");
  }
  std::filesystem::remove_all(dir);
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

// A training that fails (a Python fit that raised or returned a bad value)
// leaves its round at once, as a dropout the coordinator sees, and the
// client trains the next round.
TEST_F(SessionTest, AFailedTrainingLeavesItsRoundAndTheNextRoundTrains) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  ASSERT_TRUE(s.OnMessage(Task(1, 7, {1, 2, 3, 4}), 20).train.has_value());
  std::vector<float> local = {1, 2, 3, 4};
  Actions a = s.OnTrainingDone(7, InvalidArgumentError("fit returned 3 values; the model has 4"),
                               local, 30);
  ASSERT_EQ(a.send.size(), 1u);  // A goodbye to the round; no update.
  EXPECT_TRUE(a.send[0].header.has_goodbye());
  EXPECT_EQ(a.send[0].header.goodbye().task_id(), 7u);
  // The coordinator records why, as the dropout's reason.
  EXPECT_EQ(a.send[0].header.goodbye().reason(),
            "training failed: fit returned 3 values; the model has 4");
  ASSERT_TRUE(s.OnMessage(Task(2, 8, {1, 2, 3, 4}), 40).train.has_value());
  a = s.OnTrainingDone(8, train::TrainResult{}, local, 50);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.update().task_id(), 8u);
}

TEST_F(SessionTest, TheTasksOptimizerSettingsReachTraining) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  // Every field a distinct value, so a mix-up between two shows.
  net::Envelope task = Task(1, 7, {1, 2, 3, 4});
  auto* train = task.header.mutable_task()->mutable_train();
  train->set_optimizer(config::ADAMW);
  train->set_weight_decay(0.01f);
  train->set_beta1(0.85f);
  train->set_beta2(0.98f);
  train->set_eps(1e-6f);
  Actions a = s.OnMessage(task, 20);
  ASSERT_TRUE(a.train.has_value());
  const train::OptimizerOptions& o = a.train->options.optimizer;
  EXPECT_EQ(o.kind, train::OptimizerKind::kAdamW);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.1f);
  EXPECT_FLOAT_EQ(o.weight_decay, 0.01f);
  EXPECT_FLOAT_EQ(o.beta1, 0.85f);
  EXPECT_FLOAT_EQ(o.beta2, 0.98f);
  EXPECT_FLOAT_EQ(o.eps, 1e-6f);
  net::Envelope sgd = Task(2, 8, {1, 2, 3, 4});
  train = sgd.header.mutable_task()->mutable_train();
  train->set_momentum(0.7f);
  train->set_dampening(0.3f);
  train->set_proximal_mu(0.25f);
  a = s.OnMessage(sgd, 30);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->options.optimizer.kind, train::OptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(a.train->options.optimizer.momentum, 0.7f);
  EXPECT_FLOAT_EQ(a.train->options.optimizer.dampening, 0.3f);
  EXPECT_FLOAT_EQ(a.train->options.optimizer.proximal_mu, 0.25f);
  EXPECT_FALSE(a.train->options.optimizer.nesterov);
  net::Envelope nesterov = Task(3, 9, {1, 2, 3, 4});
  nesterov.header.mutable_task()->mutable_train()->set_momentum(0.9f);
  nesterov.header.mutable_task()->mutable_train()->set_nesterov(true);
  a = s.OnMessage(nesterov, 40);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_TRUE(a.train->options.optimizer.nesterov);
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
  net::Envelope bad_beta = Task(1, 6, {1, 2, 3, 4});
  bad_beta.header.mutable_task()->mutable_train()->set_optimizer(config::ADAM);
  bad_beta.header.mutable_task()->mutable_train()->set_beta1(2.0f);
  EXPECT_FALSE(s.OnMessage(bad_beta, 60).train.has_value());
  net::Envelope bad_nesterov = Task(1, 7, {1, 2, 3, 4});
  bad_nesterov.header.mutable_task()->mutable_train()->set_nesterov(true);
  EXPECT_FALSE(s.OnMessage(bad_nesterov, 70).train.has_value());
  net::Envelope bad_mu = Task(1, 9, {1, 2, 3, 4});
  bad_mu.header.mutable_task()->mutable_train()->set_proximal_mu(-0.5f);
  EXPECT_FALSE(s.OnMessage(bad_mu, 75).train.has_value());
  EXPECT_TRUE(s.OnMessage(Task(1, 8, {1, 2, 3, 4}), 80).train.has_value());
}

TEST(SessionLogTest, ATaskWithABadFedProxMuIsIgnoredNamingIt) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  sink->set_pattern("%v");
  LogRedirectEnv env(cohort::Env::Default(), std::make_shared<spdlog::logger>("t", sink));
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, nullptr,
      FaultPlan{}, InputObserver{}, &env);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope bad_mu = Task(1, 9, {1, 2, 3, 4});
  bad_mu.header.mutable_task()->mutable_train()->set_proximal_mu(-0.5f);
  EXPECT_FALSE(s.OnMessage(bad_mu, 20).train.has_value());
  EXPECT_NE(out.str().find("round 1: bad task ignored: task: optimizer: proximal_mu -0.5 "
                           "must be finite and >= 0"),
            std::string::npos)
      << out.str();
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

crypto::Ed25519Public Key(char c) {
  crypto::Ed25519Public k;
  k.fill(static_cast<uint8_t>(c));
  return k;
}

// The roster root over `ids` and the proof for the setup's index.
void SetRoster(wire::SecAggSetup* sa, const std::vector<crypto::Ed25519Public>& ids) {
  const crypto::MerkleTree roster = aggregation::RosterTree(ids);
  sa->set_roster_root(roster.root().data(), roster.root().size());
  sa->clear_roster_proof();
  for (const auto& d : roster.Proof(sa->index())) sa->add_roster_proof(d.data(), d.size());
  sa->clear_roster();  // As a coordinator sends it to a client with --peers.
  for (const auto& id : ids) sa->add_roster(id.data(), id.size());
}

// The setup's task digest over the task itself, as an honest coordinator
// sends it (again after a test changes the task's settings, flag or model).
// `model`: the architecture the client was welcomed with (Welcome()'s).
void Seal(net::Envelope& e, const config::ModelConfig& model = {}) {
  const wire::RoundTask& t = e.header.task();
  const crypto::Digest d = aggregation::TaskDigest(model, t.train(), t.evaluate(), e.payloads[0]);
  e.header.mutable_task()->mutable_secagg()->set_task_digest(d.data(), d.size());
}

net::Envelope SecureTask(uint64_t task_id, const crypto::Ed25519Public& own, uint32_t t = 2) {
  net::Envelope e = Task(1, task_id, {0, 0, 0, 0});
  auto* sa = e.header.mutable_task()->mutable_secagg();
  sa->set_n(3);
  sa->set_k(2);
  sa->set_t(t);
  sa->set_index(0);
  sa->set_context(std::string(32, 'c'));
  SetRoster(sa, {own, Key('x'), Key('y')});
  sa->set_clip(4);
  sa->set_scale(1e6);
  sa->set_total_weight(150);
  Seal(e);
  return e;
}

// A session training the secure task 7 of round 1 (n = 3, k = 2).
Session InSecureRound(const crypto::Ed25519KeyPair& identity) {
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  EXPECT_TRUE(s.OnMessage(SecureTask(7, identity.public_key), 20).train.has_value());
  return s;
}

// A key list longer than the cohort's graph allows (n = 3, k = 2) is
// refused before it is copied: an empty entry is 2 bytes on the wire and a
// few hundred copied. The client leaves the round and says why.
TEST(SecureSessionTest, AKeyListLongerThanTheGraphAllowsIsRefusedBeforeTheCopy) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s = InSecureRound(identity);
  wire::Header keys;
  keys.mutable_secagg_keys()->set_round(1);
  keys.mutable_secagg_keys()->set_task_id(7);
  for (int i = 0; i < 100000; ++i) keys.mutable_secagg_keys()->add_listed();
  Actions a = s.OnMessage(Env(keys), 30);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0],
            "secagg refused in round 1: a key list of 100000 entries, more than the 3 a cohort "
            "of 3 with 2 neighbours each can have");
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.goodbye().task_id(), 7u);
}

net::Envelope SecAggStartFor(const net::Envelope& secure_task);

// A SCAFFOLD update that is never sent leaves c_i as its round found it,
// as the coordinator's c never has the change: when the secure session
// ended (here the client refused a stage message) before the training
// did, c_i never moves; when the update was made but its session stalled
// before the masked input, the next task (or SecAggStart) takes c_i back
// (secure_decode_test follows c_i through whole rounds).
TEST(SecureSessionTest, AScaffoldUpdateNeverSentLeavesTheVariateAsItsRoundFoundIt) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  // Secure SCAFFOLD task `id` of `round`: x = 0, c = {0.5, 0, 0, -0.5}.
  auto scaffold_task = [&](uint64_t id, uint32_t round) {
    net::Envelope task = SecureTask(id, identity.public_key);
    task.header.mutable_task()->set_round(round);
    task.payloads[0] = {0, 0, 0, 0, 0.5f, 0, 0, -0.5f};  // [x | c].
    task.header.mutable_task()->mutable_train()->set_scaffold(true);
    task.header.mutable_task()->mutable_train()->set_learning_rate(0.125f);
    Seal(task);
    return task;
  };
  const net::Envelope task = scaffold_task(7, 1), next = scaffold_task(9, 2);
  train::TrainResult r;
  r.steps = 2;
  const std::vector<float> local = {-0.25f, 0, 0, 0.25f}, zeros(kParams, 0.0f);
  const std::vector<float> moved = {0.5f, 0, 0, -0.5f};  // -c + (x - y) / (2 x 0.125).
  // A session training task 7; `refused`: it left the round before the end.
  auto trained = [&](bool refused) {
    auto s = std::make_unique<Session>(
        "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; },
        &identity);
    s->Start(0);
    s->OnMessage(Welcome(), 10);
    EXPECT_TRUE(s->OnMessage(task, 20).train.has_value());
    if (refused) {
      wire::Header keys;
      keys.mutable_secagg_keys()->set_round(1);
      keys.mutable_secagg_keys()->set_task_id(7);
      for (int i = 0; i < 4; ++i) keys.mutable_secagg_keys()->add_listed();
      EXPECT_EQ(s->OnMessage(Env(keys), 30).printed.size(), 1u);  // Refused: left the round.
    }
    EXPECT_TRUE(s->OnTrainingDone(7, r, local, 40).send.empty());
    return s;
  };
  auto variate = [](const Session& s) {
    return std::vector<float>(s.control_variate().begin(), s.control_variate().end());
  };
  EXPECT_EQ(variate(*trained(true)), zeros);

  // The key exchange stalls (no key list) while the training ends: the
  // update is made, c_i moves, the input waits. The round goes on without
  // it, and round 2's task comes: the input will never be sent, so round 2
  // trains from the c_i round 1 started from (its correction is c - 0).
  std::unique_ptr<Session> stalled = trained(false);
  EXPECT_EQ(variate(*stalled), moved);
  Actions a = stalled->OnMessage(next, 50);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_EQ(a.train->options.scaffold_correction, moved) << "trained from the unsent update's c_i";
  EXPECT_EQ(variate(*stalled), zeros);
  // So does a SecAggStart of another round (a session that starts before
  // its task), which ends the stalled session as well.
  std::unique_ptr<Session> early = trained(false);
  ASSERT_EQ(variate(*early), moved);
  early->OnMessage(SecAggStartFor(next), 50);
  EXPECT_EQ(variate(*early), zeros);
}

TEST(SecureSessionTest, TheEvaluationRidesInTheMaskedVectorWhereTheSetupSaysSo) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  std::vector<uint32_t> encoded;
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity,
      FaultPlan{},
      [&](uint32_t, std::span<const uint32_t> words) {
        encoded.assign(words.begin(), words.end());
      });
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope task = SecureTask(7, identity.public_key);
  task.header.mutable_task()->set_evaluate(true);
  task.header.mutable_task()->mutable_secagg()->set_eval_slots(true);
  Seal(task);
  ASSERT_TRUE(s.OnMessage(task, 20).train.has_value());
  std::vector<float> local = {0, 0, 0, 0};
  s.OnTrainingDone(7, train::TrainResult{}, local, 30,
                   train::EvalResult{.loss = 0.5, .accuracy = 0.75, .samples = 25});
  ASSERT_EQ(encoded.size(),
            kParams + aggregation::kSecureMetricSlots + aggregation::kSecureEvalSlots);
  // Weight 50/150, scale 1e6, clip 4; r = (25/50) / kMaxEvalRatio.
  const double r = 0.5 / aggregation::kMaxEvalRatio, unit = 50.0 / 150 * 1e6 * 4;
  const size_t at = kParams + aggregation::kSecureMetricSlots;
  EXPECT_NEAR(double(int32_t(encoded[at])), r * unit, 1.0);
  EXPECT_NEAR(double(int32_t(encoded[at + 1])), r * 0.5 / aggregation::kMaxSecureLoss * unit, 1.0);
  EXPECT_NEAR(double(int32_t(encoded[at + 2])), r * 0.75 * unit, 1.0);
}

TEST_F(SessionTest, AnAskedEvaluationGoesWithThePlainUpdateAndOnlyThen) {
  Session s = Make();
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope task = Task(1, 7, {1, 2, 3, 4});
  task.header.mutable_task()->set_evaluate(true);
  Actions a = s.OnMessage(task, 20);
  ASSERT_TRUE(a.train.has_value());
  EXPECT_TRUE(a.train->evaluate);
  std::vector<float> local = {1, 2, 3, 4};
  a = s.OnTrainingDone(7, train::TrainResult{}, local, 30,
                       train::EvalResult{.loss = 0.25, .accuracy = 0.5, .samples = 12});
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.update().eval_samples(), 12u);
  EXPECT_EQ(a.send[0].header.update().eval_loss(), 0.25);
  EXPECT_EQ(a.send[0].header.update().eval_accuracy(), 0.5);
  // A task that does not ask gets none, whatever the trainer did; nor does
  // an evaluation the coordinator would refuse.
  ASSERT_TRUE(s.OnMessage(Task(2, 8, {1, 2, 3, 4}), 40).train.has_value());
  a = s.OnTrainingDone(8, train::TrainResult{}, local, 50,
                       train::EvalResult{.loss = 0.25, .accuracy = 0.5, .samples = 12});
  EXPECT_EQ(a.send[0].header.update().eval_samples(), 0u);
  task = Task(3, 9, {1, 2, 3, 4});
  task.header.mutable_task()->set_evaluate(true);
  ASSERT_TRUE(s.OnMessage(task, 60).train.has_value());
  a = s.OnTrainingDone(9, train::TrainResult{}, local, 70,
                       train::EvalResult{.loss = std::nan(""), .accuracy = 0.5, .samples = 12});
  EXPECT_EQ(a.send[0].header.update().eval_samples(), 0u);
}

TEST(SecureSessionTest, AdvertisesKeysAndNeverSendsAPlaintextUpdate) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  Actions a = s.Start(0);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.hello().identity_key(),
            std::string(identity.public_key.begin(), identity.public_key.end()));
  s.OnMessage(Welcome(), 10);
  a = s.OnMessage(SecureTask(7, identity.public_key), 20);
  ASSERT_TRUE(a.train.has_value());
  ASSERT_EQ(a.send.size(), 1u);
  // First the commitment to its graph-seed contribution (stage 1).
  ASSERT_TRUE(a.send[0].header.has_secagg_seed());
  EXPECT_EQ(a.send[0].header.secagg_seed().commitment().size(), 32u);
  // A commitment root without this client's commitment: it reveals nothing
  // and leaves the round...
  wire::Header seed;
  seed.mutable_secagg_seed()->set_round(1);
  seed.mutable_secagg_seed()->set_task_id(7);
  seed.mutable_secagg_seed()->set_root(std::string(32, '\x07'));
  a = s.OnMessage(Env(seed), 30);
  // Only a goodbye to this round's task, so the coordinator need not wait.
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.goodbye().task_id(), 7u);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("secagg refused"), std::string::npos);
  EXPECT_NE(a.printed[0].find("does not hold this client's commitment"), std::string::npos)
      << a.printed[0];
  // ...and its trained delta is never sent in the clear.
  std::vector<float> local(kParams, 1.0f);
  EXPECT_TRUE(s.OnTrainingDone(7, train::TrainResult{}, local, 40).send.empty());
}

TEST(SecureSessionTest, LeavesARoundWhoseNextStageDoesNotComeInTime) {
  // A client-side deadline between stages (issue 29): a coordinator cannot
  // keep a round open to search for something between two of them.
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.set_secagg_stage_limit_ms(5000);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope task = SecureTask(7, identity.public_key);
  Actions a = s.OnMessage(SecAggStartFor(task), 20);
  ASSERT_TRUE(a.send[0].header.has_secagg_seed());
  EXPECT_TRUE(s.OnTick(5020).printed.empty());  // Within the limit: heartbeats only.
  a = s.OnTick(5021);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("the coordinator sent no commitment root within 5 s; leaving the "
                              "round"),
            std::string::npos)
      << a.printed[0];
  // Out of the round: the trained update is never sent.
  a = s.OnMessage(task, 5030);
  std::vector<float> local(kParams, 1.0f);
  EXPECT_TRUE(s.OnTrainingDone(7, train::TrainResult{}, local, 5040).send.empty());

  // With its default limit (600 s), a client waits twice the coordinator's
  // stated stage timeout plus 30 s: 50 s for a 10 s stage timeout.
  Session d(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  d.Start(0);
  d.OnMessage(Welcome(), 10);
  net::Envelope stated = SecureTask(7, identity.public_key);
  stated.header.mutable_task()->mutable_secagg()->set_stage_timeout_ms(10000);
  ASSERT_TRUE(d.OnMessage(SecAggStartFor(stated), 20).send[0].header.has_secagg_seed());
  EXPECT_TRUE(d.OnTick(50020).printed.empty());
  a = d.OnTick(50021);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("sent no commitment root within 50 s"), std::string::npos)
      << a.printed[0];
}

net::Envelope SecAggStartFor(const net::Envelope& secure_task) {
  wire::Header h;
  h.mutable_secagg_start()->set_round(secure_task.header.task().round());
  h.mutable_secagg_start()->set_task_id(secure_task.header.task().task_id());
  *h.mutable_secagg_start()->mutable_setup() = secure_task.header.task().secagg();
  return Env(h);
}

// A session of `identity`, started and registered with `welcome`.
Session Welcomed(const crypto::Ed25519KeyPair& identity, const net::Envelope& welcome) {
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(welcome, 10);
  return s;
}

TEST(SecureSessionTest, SecAggStartCommitsBeforeTheModelArrives) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope task = SecureTask(7, identity.public_key);
  // The seed commitment goes out on SecAggStart, with no model yet.
  Actions a = s.OnMessage(SecAggStartFor(task), 20);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.send.size(), 1u);
  ASSERT_TRUE(a.send[0].header.has_secagg_seed());
  // The task then trains without a second commitment.
  a = s.OnMessage(task, 30);
  EXPECT_TRUE(a.train.has_value());
  EXPECT_TRUE(a.send.empty());
  // A task whose setup differs from SecAggStart's is refused.
  net::Envelope next = SecureTask(8, identity.public_key);
  next.header.mutable_task()->set_round(2);
  a = s.OnMessage(SecAggStartFor(next), 40);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.cancel_training);  // Round 1's job is obsolete.
  next.header.mutable_task()->mutable_secagg()->set_total_weight(5000);
  a = s.OnMessage(next, 50);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("differs"), std::string::npos);
  // Neither task's delta is ever sent in the clear.
  std::vector<float> local(kParams, 1.0f);
  EXPECT_TRUE(s.OnTrainingDone(7, train::TrainResult{}, local, 60).send.empty());
  EXPECT_TRUE(s.OnTrainingDone(8, train::TrainResult{}, local, 70).send.empty());
}

// A malicious coordinator could give one client the real task and every
// other client one that trains nothing (a learning rate of 1e-30, a model
// with no gradient), so that the unmasked sum would be that one update. The
// task digest every client signs in the session context (SecAggContext)
// rules that out: a task that does not hash to it is refused before
// training, whether its setup came first in SecAggStart or with the task.
TEST(SecureSessionTest, ATaskOtherThanTheOneTheSessionBindsIsRefused) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  const std::string why =
      "secagg refused in round 1: the task's model or training settings are not the ones its "
      "secure session binds for every client (its task digest differs), so the sum might not mix "
      "this update with the others";
  // Welcomed with an architecture, which the honest task's digest binds.
  net::Envelope welcome = Welcome();
  welcome.header.mutable_welcome()->mutable_model()->add_hidden(4);
  std::vector<std::pair<std::string, std::function<void(net::Envelope&)>>> spoils = {
      {"learning rate",
       [](net::Envelope& e) {
         e.header.mutable_task()->mutable_train()->set_learning_rate(1e-30f);
       }},
      {"model", [](net::Envelope& e) { e.payloads[0][2] = 0.5f; }},
      {"evaluate", [](net::Envelope& e) { e.header.mutable_task()->set_evaluate(true); }},
      // The others were welcomed with another architecture of as many
      // parameters, which reads the same values otherwise (dead ReLUs).
      {"architecture",
       [](net::Envelope& e) {
         config::ModelConfig other;
         other.add_hidden(3);
         Seal(e, other);
       }},
      {"no architecture", [](net::Envelope& e) { Seal(e, config::ModelConfig{}); }},
  };
  for (const auto& [name, spoil] : spoils) {
    for (const bool early : {false, true}) {
      SCOPED_TRACE(name + (early ? " (after SecAggStart)" : " (setup in the task)"));
      Session s = Welcomed(identity, welcome);
      net::Envelope honest = SecureTask(7, identity.public_key);
      Seal(honest, welcome.header.welcome().model());
      // This client's task; its setup (and digest) is the one the others got.
      net::Envelope task = honest;
      spoil(task);
      if (early) {
        ASSERT_EQ(s.OnMessage(SecAggStartFor(task), 20).send.size(), 1u);
      }
      Actions a = s.OnMessage(task, 30);
      EXPECT_FALSE(a.train.has_value());
      ASSERT_EQ(a.printed.size(), 1u);
      EXPECT_EQ(a.printed[0], why);
      ASSERT_FALSE(a.send.empty());
      EXPECT_TRUE(a.send.back().header.has_goodbye());
      // The same session would have taken the honest task.
      Session t = Welcomed(identity, welcome);
      if (early) t.OnMessage(SecAggStartFor(honest), 20);
      EXPECT_TRUE(t.OnMessage(honest, 30).train.has_value());
    }
  }
}

// A later Welcome (a reconnection, a restarted coordinator) may spell the
// same model config otherwise; another model config stops the client, which
// trains the model it built, not the coordinator's.
TEST(SecureSessionTest, ALaterWelcomeOfAnotherModelStopsTheClient) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  net::Envelope welcome = Welcome();
  welcome.header.mutable_welcome()->mutable_model()->add_hidden(4);
  Session s = Welcomed(identity, welcome);
  net::Envelope spelled = welcome;
  spelled.header.mutable_welcome()->mutable_model()->set_input_dim(784);  // The default.
  spelled.header.mutable_welcome()->set_run_name("run");
  Actions a = s.OnMessage(spelled, 20);
  EXPECT_FALSE(a.exit.has_value());
  net::Envelope task = SecureTask(7, identity.public_key);
  Seal(task, welcome.header.welcome().model());
  EXPECT_TRUE(s.OnMessage(task, 30).train.has_value());
  net::Envelope other = welcome;
  other.header.mutable_welcome()->mutable_model()->set_hidden(0, 5);
  a = s.OnMessage(other, 40);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_EQ(a.exit->code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.exit->message(),
            "welcome: the coordinator's model config differs from the one this client built its "
            "model from (did the coordinator restart with another config?): restart the client to "
            "build the new model");
}

// SecAggStart's round is the one the context and the ledger took: a task of
// the same id with another round is refused.
TEST(SecureSessionTest, ATaskOfAnotherRoundThanItsSessionIsRefused) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s = Welcomed(identity, Welcome());
  net::Envelope task = SecureTask(7, identity.public_key);
  ASSERT_EQ(s.OnMessage(SecAggStartFor(task), 20).send.size(), 1u);
  task.header.mutable_task()->set_round(2);
  Actions a = s.OnMessage(task, 30);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0],
            "secagg refused in round 1: a task of round 2 for the secure session of round 1");
}

TEST(SecureSessionTest, ADivergedUpdateLeavesTheRoundInsteadOfBeingEncoded) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s = InSecureRound(identity);
  std::vector<float> local = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0, 0};
  Actions a = s.OnTrainingDone(7, train::TrainResult{}, local, 30);
  ASSERT_EQ(a.send.size(), 1u);  // A goodbye to the round; no update.
  EXPECT_TRUE(a.send[0].header.has_goodbye());
  EXPECT_EQ(a.send[0].header.goodbye().task_id(), 7u);
  EXPECT_EQ(a.send[0].header.goodbye().reason(),
            "refused the round's secure aggregation: local update has NaN or Inf");
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("NaN"), std::string::npos);
}

// Clipping is said, not silent: update values beyond secagg.clip and a
// loss beyond what the secure sum carries each get a warning in the round.
TEST(SecureSessionTest, ClippingIsWarnedAbout) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  sink->set_pattern("%v");
  LogRedirectEnv env(cohort::Env::Default(), std::make_shared<spdlog::logger>("t", sink));
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity,
      FaultPlan{}, InputObserver{}, &env);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  ASSERT_TRUE(s.OnMessage(SecureTask(7, identity.public_key), 20).train.has_value());
  train::TrainResult trained;
  trained.mean_loss = 383.76;
  s.OnTrainingDone(7, trained, std::vector<float>{9.0f, 0.5f, 0, -5.0f}, 30);
  EXPECT_NE(out.str().find("round 1: secagg.clip 4 clipped 2 of 4 update values (the largest was "
                           "9): the sum holds the clipped values"),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("round 1: training loss 383.7600 is above 100, the most a secure sum "
                           "carries"),
            std::string::npos)
      << out.str();
}

// secagg.l2_clip: a client whose delta is longer than the bound encodes
// the delta scaled onto it, and says so; one within the bound encodes the
// same words as without a bound; a setup with a bad bound is refused.
TEST(SecureSessionTest, AnUpdateAboveTheL2BoundIsScaledOntoItBeforeMasking) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  sink->set_pattern("%v");
  LogRedirectEnv env(cohort::Env::Default(), std::make_shared<spdlog::logger>("t", sink));
  auto identity = std::move(crypto::GenerateEd25519()).value();
  auto encode = [&](float l2_clip, std::vector<float> local) {
    std::vector<uint32_t> encoded;
    Session s(
        "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity,
        FaultPlan{},
        [&](uint32_t, std::span<const uint32_t> words) {
          encoded.assign(words.begin(), words.end());
        },
        &env);
    s.Start(0);
    s.OnMessage(Welcome(), 10);
    net::Envelope task = SecureTask(7, identity.public_key);
    task.header.mutable_task()->mutable_secagg()->set_l2_clip(l2_clip);
    EXPECT_TRUE(s.OnMessage(task, 20).train.has_value());
    s.OnTrainingDone(7, train::TrainResult{}, local, 30);
    return encoded;
  };
  // ||(3, 4, 0, 0)|| = 5, bound 1: (0.6, 0.8, 0, 0). Weight 50/150, scale 1e6.
  const std::vector<uint32_t> clipped = encode(1.0f, {3, 4, 0, 0});
  ASSERT_EQ(clipped.size(), kParams + aggregation::kSecureMetricSlots);
  const double unit = 50.0 / 150 * 1e6;
  EXPECT_NEAR(double(int32_t(clipped[0])), 0.6 * unit, 1.0);
  EXPECT_NEAR(double(int32_t(clipped[1])), 0.8 * unit, 1.0);
  EXPECT_EQ(clipped[2], 0u);
  EXPECT_NE(out.str().find("round 1: secagg.l2_clip 1 scaled the update (L2 norm 5) by 0.2 "
                           "before masking"),
            std::string::npos)
      << out.str();
  // Without the bound, secagg.clip 4 alone would have kept 3 and 4.
  const std::vector<uint32_t> unbounded = encode(0.0f, {3, 4, 0, 0});
  EXPECT_NEAR(double(int32_t(unbounded[1])), 4 * unit, 1.0);
  // Within the bound nothing changes, word for word.
  EXPECT_EQ(encode(10.0f, {0.5f, -0.25f, 1, 0}), encode(0.0f, {0.5f, -0.25f, 1, 0}));
  // A non-finite delta is refused before any scaling.
  EXPECT_TRUE(encode(1.0f, {std::numeric_limits<float>::infinity(), 0, 0, 0}).empty());

  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  net::Envelope bad = SecureTask(8, identity.public_key);
  bad.header.mutable_task()->mutable_secagg()->set_l2_clip(-1);
  Actions a = s.OnMessage(bad, 20);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("secagg setup: l2_clip -1 is not a finite value >= 0"),
            std::string::npos)
      << a.printed[0];
}

TEST(SecureSessionTest, RefusesSetupsThatWouldExposeIt) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  auto other = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  // Threshold 1 of 2 neighbours: one colluder could rebuild both secrets.
  Actions a = s.OnMessage(SecureTask(8, identity.public_key, /*t=*/1), 20);
  EXPECT_FALSE(a.train.has_value());
  EXPECT_TRUE(a.send.empty());
  // Another client's identity at this client's index.
  a = s.OnMessage(SecureTask(9, other.public_key), 30);
  EXPECT_FALSE(a.train.has_value());
  EXPECT_TRUE(a.send.empty());
  // A roster proof of the wrong length.
  net::Envelope short_proof = SecureTask(11, identity.public_key);
  short_proof.header.mutable_task()->mutable_secagg()->mutable_roster_proof()->RemoveLast();
  a = s.OnMessage(short_proof, 35);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("roster proof has 1 siblings, expected 2"), std::string::npos)
      << a.printed[0];
  // Weights that would let the sum wrap around 2^32.
  net::Envelope wrap = SecureTask(10, identity.public_key);
  wrap.header.mutable_task()->mutable_secagg()->set_scale(1e9);
  a = s.OnMessage(wrap, 40);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("overflows"), std::string::npos);
  // A mask generator it does not know (2, AES-128-CTR, is the last one).
  net::Envelope prg = SecureTask(12, identity.public_key);
  prg.header.mutable_task()->mutable_secagg()->set_mask_prg(3);
  a = s.OnMessage(prg, 45);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("unknown mask PRG 3"), std::string::npos) << a.printed[0];
  // Distributed DP's numbers: honest ones pass; a huge share variance is no
  // noise at all (Poisson past 2^63), so it is refused, as is an L2 bound
  // below the clipped update's.
  auto ddp = [&](uint64_t id, double variance, double l2_bound) {
    net::Envelope e = SecureTask(id, identity.public_key);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_dp_scale(1024);
    sa->set_dp_clip_norm(0.5);
    sa->set_dp_l2_bound(l2_bound);
    sa->set_dp_share_variance(variance);
    return e;
  };
  a = s.OnMessage(ddp(13, 1e300, 600), 50);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("noise variance 1e+300 is above 4398046511104"), std::string::npos)
      << a.printed[0];
  EXPECT_NE(a.printed[0].find("(2^42), where the Skellam sampler cannot draw it"),
            std::string::npos)
      << a.printed[0];
  a = s.OnMessage(ddp(14, 1e6, 100), 55);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("distributed DP's scale, clip norm, L2 bound or noise variance"),
            std::string::npos)
      << a.printed[0];
  // A SCAFFOLD task would send its variate's change un-noised beside it.
  net::Envelope scaffold = ddp(16, 1e6, 600);
  scaffold.header.mutable_task()->mutable_train()->set_scaffold(true);
  scaffold.payloads[0].resize(2 * kParams);  // [x | c].
  a = s.OnMessage(scaffold, 58);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("distributed DP with a train.scaffold task"), std::string::npos)
      << a.printed[0];
  a = s.OnMessage(ddp(15, 4398046511104.0, 600), 60);
  EXPECT_TRUE(a.train.has_value()) << (a.printed.empty() ? "" : a.printed[0]);
}

TEST(SecureSessionTest, WithPeersItAsksForAndChecksTheWholeRoster) {
  // A key this client never meets could sit at many indices around it: with
  // --peers it checks all n against the root, for repeats and against them.
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  std::vector<crypto::Ed25519Public> peers = {identity.public_key};
  for (int i = 1; i < 30; ++i) peers.push_back(Key(static_cast<char>(i)));
  std::vector<crypto::Ed25519Public> sorted = peers;
  std::sort(sorted.begin(), sorted.end());
  s.set_peers(sorted);
  Actions a = s.Start(0);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_TRUE(a.send[0].header.hello().wants_roster());
  s.OnMessage(Welcome(), 10);
  // Ten of the thirty: up to 3 may collude, so t = 7 of 9.
  auto cohort = [&](uint64_t task_id, std::vector<crypto::Ed25519Public> ids) {
    net::Envelope e = SecureTask(task_id, identity.public_key, 7);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_n(10);
    sa->set_k(9);
    SetRoster(sa, ids);
    return e;
  };
  const std::vector<crypto::Ed25519Public> ten(peers.begin(), peers.begin() + 10);
  auto refusal = [&](net::Envelope e, TimeMs now) {
    Actions r = s.OnMessage(e, now);
    EXPECT_FALSE(r.train.has_value());
    return r.printed.size() == 1 ? r.printed[0] : std::string("(no line)");
  };
  net::Envelope hidden = cohort(40, ten);
  hidden.header.mutable_task()->mutable_secagg()->clear_roster();
  EXPECT_NE(refusal(hidden, 20).find("0 roster keys for a cohort of 10"), std::string::npos);
  std::vector<crypto::Ed25519Public> twice = ten;
  twice[9] = twice[8];  // One colluder at two places.
  EXPECT_NE(refusal(cohort(41, twice), 30).find("appears twice"), std::string::npos);
  std::vector<crypto::Ed25519Public> stranger = ten;
  stranger[5] = Key('z');
  EXPECT_NE(
      refusal(cohort(42, stranger), 40).find("identity 5 is not one of this client's --peers"),
      std::string::npos);
  net::Envelope swapped = cohort(43, ten);
  swapped.header.mutable_task()->mutable_secagg()->set_roster(
      3, std::string(peers[20].begin(), peers[20].end()));
  EXPECT_NE(refusal(swapped, 50).find("do not match the roster root"), std::string::npos);
  EXPECT_TRUE(s.OnMessage(cohort(44, ten), 60).train.has_value());
}

TEST(SecureSessionTest, AClientThatRequiresSecureAggregationRefusesAPlainTask) {
  // A coordinator could otherwise just send plain tasks and read the update.
  auto identity = std::move(crypto::GenerateEd25519()).value();
  auto make = [&] {
    return Session(
        "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; },
        &identity);
  };
  for (int how = 0; how < 4; ++how) {
    Session s = make();
    if (how == 1) s.set_require_secure(true);
    if (how == 2) s.set_peers({identity.public_key});  // --peers implies it.
    if (how == 3) s.set_dp_noise_multiplier(1);        // So does a pinned DP noise.
    s.Start(0);
    s.OnMessage(Welcome(), 10);
    Actions a = s.OnMessage(Task(1, 5, {0, 0, 0, 0}), 20);
    EXPECT_EQ(a.train.has_value(), how == 0) << how;
    if (how > 0) {
      ASSERT_EQ(a.printed.size(), 1u);
      EXPECT_NE(a.printed[0].find("requires secure aggregation"), std::string::npos);
    }
  }
}

TEST(SecureSessionTest, RefusesAThresholdWeakerThanItsOwnDerivation) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  // Ten clients on the complete graph: with one possible colluder the
  // client wants t = 6 of its 9 neighbours.
  auto ten = [&](uint64_t task_id, uint32_t t, float corrupt) {
    net::Envelope e = SecureTask(task_id, identity.public_key, t);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_n(10);
    sa->set_k(9);
    sa->set_corrupt_fraction(corrupt);
    std::vector<crypto::Ed25519Public> ids = {identity.public_key};
    for (int i = 1; i < 10; ++i) ids.push_back(Key(static_cast<char>('a' + i)));
    SetRoster(sa, ids);
    return e;
  };
  // The rule before issue 8 (t = k/2 + 1 = 5), sent by a coordinator that
  // claims nobody colludes: refused, and the client says why.
  Actions a = s.OnMessage(ten(20, 5, 0.0f), 20);
  EXPECT_FALSE(a.train.has_value());
  EXPECT_TRUE(a.send.empty());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("weaker than this client's t=6"), std::string::npos) << a.printed[0];
  EXPECT_TRUE(s.OnMessage(ten(21, 6, 0.0f), 30).train.has_value());
  // A site that expects more collusion asks more of the threshold.
  s.set_min_corrupt_fraction(0.3);
  a = s.OnMessage(ten(22, 6, 0.1f), 40);
  EXPECT_FALSE(a.train.has_value());
  EXPECT_TRUE(s.OnMessage(ten(23, 7, 0.1f), 50).train.has_value());
}

TEST(SecureSessionTest, ACohortOfTwoNeedsAClientThatAssumesNoColluder) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  auto two = [&](uint64_t task_id) {
    net::Envelope e = SecureTask(task_id, identity.public_key, 1);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_n(2);
    sa->set_k(1);
    sa->set_corrupt_fraction(0);
    SetRoster(sa, {identity.public_key, Key('b')});
    return e;
  };
  // By default the other client may be the coordinator's: refused.
  Actions a = s.OnMessage(two(20), 20);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("weaker than this client's t=2"), std::string::npos) << a.printed[0];
  // --corrupt-fraction 0: the pair aggregates (k = 1, t = 1).
  s.set_min_corrupt_fraction(0);
  EXPECT_TRUE(s.OnMessage(two(21), 30).train.has_value());
}

TEST(SecureSessionTest, WithPeersACohortTheColludersCouldFillIsRefused) {
  auto identity = std::move(crypto::GenerateEd25519()).value();
  Session s(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity);
  s.Start(0);
  s.OnMessage(Welcome(), 10);
  // An allowlist of 30: up to 3 may collude (corrupt fraction 0.1).
  std::vector<crypto::Ed25519Public> peers = {identity.public_key};
  for (int i = 1; i < 30; ++i) {
    crypto::Ed25519Public k;
    k.fill(static_cast<uint8_t>(i));
    peers.push_back(k);
  }
  s.set_peers(peers);
  auto cohort = [&](uint64_t task_id, uint32_t n, uint32_t t) {
    net::Envelope e = SecureTask(task_id, identity.public_key, t);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_n(n);
    sa->set_k(n - 1);
    SetRoster(sa, std::vector<crypto::Ed25519Public>(peers.begin(), peers.begin() + n));
    return e;
  };
  // Five: this client, three colluders and one honest client at worst.
  Actions a = s.OnMessage(cohort(30, 5, 4), 20);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("secagg setup: a cohort of 5 could hold 3 colluding clients of the "
                              "30 in --peers (corrupt fraction 0.1) and fewer than 2 honest ones "
                              "besides this client (a larger cohort, or --corrupt-fraction 0 and "
                              "the run's secagg.corrupt_fraction 0"),
            std::string::npos)
      << a.printed[0];
  // Ten: the threshold must then count 3 colluders, not ceil(0.1 x 10) = 1.
  a = s.OnMessage(cohort(31, 10, 6), 30);
  EXPECT_FALSE(a.train.has_value());
  EXPECT_TRUE(s.OnMessage(cohort(32, 10, 7), 40).train.has_value());
}

// Distributed DP's ledger (client/dp_ledger.h): a client noises at most
// one update per round of a run.
class DistributedDpLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/cohort-dp-session-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  // A welcomed session of run `run`, its ledger in the test's state
  // directory (or in memory), its encoded inputs counted.
  std::unique_ptr<Session> Make(const std::string& run = "mnist-dp", bool state = true,
                                const std::string& nonce = "") {
    auto s = std::make_unique<Session>(
        "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; },
        &identity_, FaultPlan{},
        [this](uint32_t, std::span<const uint32_t> words) {
          ++encoded_;
          last_input_.assign(words.begin(), words.end());
        });
    if (state) s->set_state_dir(dir_);
    s->set_coordinator_key("coordinator key");
    s->Start(0);
    net::Envelope welcome = Welcome();
    welcome.header.mutable_welcome()->set_run_name(run);
    welcome.header.mutable_welcome()->set_run_nonce(nonce);
    s->OnMessage(welcome, 10);
    return s;
  }
  // A securely aggregated task of `round` under distributed DP.
  net::Envelope DpTask(uint32_t round, uint64_t task_id) const {
    net::Envelope e = SecureTask(task_id, identity_.public_key);
    e.header.mutable_task()->set_round(round);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_dp_scale(1024);
    sa->set_dp_clip_norm(0.5);
    sa->set_dp_l2_bound(600);
    sa->set_dp_share_variance(1e6);
    return e;
  }
  // The coordinator's survivor list for task `task_id` of `round`.
  static net::Envelope SurvivorsFor(uint32_t round, uint64_t task_id, std::vector<uint32_t> who) {
    wire::Header h;
    h.mutable_secagg_survivors()->set_round(round);
    h.mutable_secagg_survivors()->set_task_id(task_id);
    for (uint32_t v : who) h.mutable_secagg_survivors()->add_survivors(v);
    return Env(h);
  }
  // Trains task `task_id` to the end: its noised input is then counted
  // and encoded (it waits for the other clients to be masked and sent).
  Actions Train(Session& s, uint64_t task_id) {
    const std::vector<float> local = {0.1f, -0.2f, 0, 0.05f};
    return s.OnTrainingDone(task_id, train::TrainResult{}, local, 40);
  }
  static void ExpectLeft(const Actions& a, uint64_t task_id, const std::string& reason) {
    EXPECT_FALSE(a.train.has_value());
    ASSERT_EQ(a.send.size(), 1u);
    ASSERT_TRUE(a.send[0].header.has_goodbye());
    EXPECT_EQ(a.send[0].header.goodbye().task_id(), task_id);
    EXPECT_EQ(a.send[0].header.goodbye().reason(), reason);
  }
  std::string Repeat(uint32_t round, const std::string& run = "mnist-dp") const {
    return "already contributed a noised update to round " + std::to_string(round) + " of run " +
           run + ": refusing a repeat, which would let the coordinator average away the noise";
  }
  std::string Budget(uint32_t round, const std::string& run, uint32_t cap) const {
    return "this client has noised " + std::to_string(cap) +
           " updates, the most --dp-max-rounds allows: refusing round " + std::to_string(round) +
           " of run " + run + " (the cap holds whatever a coordinator numbers or names its rounds)";
  }
  crypto::Ed25519KeyPair identity_ = std::move(crypto::GenerateEd25519()).value();
  std::string dir_;
  int encoded_ = 0;
  std::vector<uint32_t> last_input_;  // The last input encoded, before masking.
};

// A round re-sent after this client noised an update for it is left at
// its setup, before training, with a Goodbye naming the round and why;
// the client takes the rounds after it, and so does a restarted client
// on the same state directory.
// Under distributed DP only the noised delta leaves the client: the
// metric slots (loss, accuracy, seconds) and the evaluation's, which no
// noise covers, are zero in the input it masks, whatever it trained, and
// whatever the setup asks.
TEST_F(DistributedDpLedgerTest, NoUnnoisedStatisticRidesInTheMaskedVector) {
  std::unique_ptr<Session> s = Make();
  net::Envelope task = DpTask(3, 7);
  task.header.mutable_task()->set_evaluate(true);
  task.header.mutable_task()->mutable_secagg()->set_eval_slots(true);
  Seal(task);
  ASSERT_TRUE(s->OnMessage(task, 20).train.has_value());
  train::TrainResult trained;
  trained.mean_loss = 0.7, trained.accuracy = 0.6, trained.seconds = 3;
  (void)s->OnTrainingDone(7, trained, std::vector<float>{0.1f, -0.2f, 0, 0.05f}, 40,
                          train::EvalResult{.loss = 0.5, .accuracy = 0.75, .samples = 25});
  ASSERT_EQ(last_input_.size(),
            kParams + aggregation::kSecureMetricSlots + aggregation::kSecureEvalSlots);
  for (size_t i = kParams; i < last_input_.size(); ++i) {
    EXPECT_EQ(last_input_[i], 0u) << "slot " << i - kParams;
  }
  EXPECT_NE(std::vector<uint32_t>(last_input_.begin(), last_input_.begin() + kParams),
            std::vector<uint32_t>(kParams, 0u))
      << "the noised delta is there";
}

TEST_F(DistributedDpLedgerTest, ARepeatOfANoisedRoundIsRefusedAcrossARestart) {
  {
    std::unique_ptr<Session> s = Make();
    ASSERT_TRUE(s->OnMessage(DpTask(3, 7), 20).train.has_value());
    Actions a = Train(*s, 7);
    EXPECT_TRUE(a.send.empty());  // The input waits for the key exchange.
    EXPECT_TRUE(a.printed.empty()) << a.printed[0];
    EXPECT_EQ(encoded_, 1);
    a = s->OnMessage(DpTask(3, 8), 50);  // Round 3 again, a new task.
    ExpectLeft(a, 8, Repeat(3));
    ASSERT_EQ(a.printed.size(), 1u);
    EXPECT_EQ(a.printed[0], "round 3: " + Repeat(3) + "; leaving the round");
    // So is a repeat that starts with SecAggStart.
    ExpectLeft(s->OnMessage(SecAggStartFor(DpTask(3, 9)), 60), 9, Repeat(3));
    // The next round is this client's to noise.
    ASSERT_TRUE(s->OnMessage(DpTask(4, 10), 70).train.has_value());
  }
  std::unique_ptr<Session> restarted = Make();
  ExpectLeft(restarted->OnMessage(DpTask(3, 11), 20), 11, Repeat(3));
  // Round 4 was set up but never noised: it counts for nothing.
  ASSERT_TRUE(restarted->OnMessage(DpTask(4, 12), 30).train.has_value());
  Train(*restarted, 12);
  EXPECT_EQ(encoded_, 2);
  ExpectLeft(restarted->OnMessage(DpTask(4, 13), 40), 13, Repeat(4));
  // Another run's round 3 (another name, or another coordinator) is not a
  // repeat; a task without distributed DP never looks at the ledger.
  ASSERT_TRUE(Make("other-dp")->OnMessage(DpTask(3, 14), 20).train.has_value());
  std::unique_ptr<Session> elsewhere = Make();
  elsewhere->set_coordinator_key("another coordinator key");
  ASSERT_TRUE(elsewhere->OnMessage(DpTask(3, 15), 20).train.has_value());
  net::Envelope plain_secure = SecureTask(16, identity_.public_key);
  plain_secure.header.mutable_task()->set_round(3);
  ASSERT_TRUE(Make()->OnMessage(plain_secure, 20).train.has_value());
}

// A coordinator's new run of the same name carries a new nonce
// (Welcome.run_nonce): its round 3 is not the old run's; the old run's
// nonce still names the old rounds.
TEST_F(DistributedDpLedgerTest, ANewRunNonceIsANewRunAndTheOldNonceStillRefuses) {
  const std::string old_nonce(32, 'a'), new_nonce(32, 'b');
  {
    std::unique_ptr<Session> s = Make("run", true, old_nonce);
    ASSERT_TRUE(s->OnMessage(DpTask(3, 7), 20).train.has_value());
    Train(*s, 7);
  }
  std::unique_ptr<Session> renewed = Make("run", true, new_nonce);
  ASSERT_TRUE(renewed->OnMessage(DpTask(3, 8), 20).train.has_value());
  ExpectLeft(Make("run", true, old_nonce)->OnMessage(DpTask(3, 9), 20), 9, Repeat(3, "run"));
  // Without a nonce (an older coordinator) the run is another again.
  ASSERT_TRUE(Make("run", true)->OnMessage(DpTask(3, 10), 20).train.has_value());
}

// A nonce is at most 64 bytes: a longer one ends the client, saying so.
TEST_F(DistributedDpLedgerTest, AnOverlongRunNonceIsRefusedAtTheWelcome) {
  auto s = std::make_unique<Session>(
      "c1", 50, [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &identity_,
      FaultPlan{}, [](uint32_t, std::span<const uint32_t>) {});
  s->Start(0);
  net::Envelope welcome = Welcome();
  welcome.header.mutable_welcome()->set_run_nonce(std::string(64, 'n'));
  EXPECT_FALSE(s->OnMessage(welcome, 10).exit.has_value());
  welcome.header.mutable_welcome()->set_run_nonce(std::string(65, 'n'));
  Actions a = s->OnMessage(welcome, 20);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_EQ(a.exit->message(), "welcome: run_nonce has 65 bytes, at most 64");
}

// Without a state directory the ledger lives in the session: a repeat is
// refused all the same, until the process ends.
TEST_F(DistributedDpLedgerTest, WithoutAStateDirectoryTheSessionStillRefusesARepeat) {
  std::unique_ptr<Session> s = Make("mnist-dp", /*state=*/false);
  ASSERT_TRUE(s->OnMessage(DpTask(2, 7), 20).train.has_value());
  Train(*s, 7);
  ExpectLeft(s->OnMessage(DpTask(2, 8), 50), 8, Repeat(2));
  EXPECT_FALSE(std::filesystem::exists(DpLedgerPath(dir_)));
  EXPECT_TRUE(Make("mnist-dp", /*state=*/false)->OnMessage(DpTask(2, 9), 20).train.has_value());
}

// The count that binds is taken when the noised input is made: two
// sessions on one state directory (two client processes) that both set up
// round 5 noise only one update for it.
TEST_F(DistributedDpLedgerTest, TheCountIsTakenWhenTheNoisedInputIsMade) {
  std::unique_ptr<Session> first = Make(), second = Make();
  ASSERT_TRUE(first->OnMessage(DpTask(5, 20), 20).train.has_value());
  ASSERT_TRUE(second->OnMessage(DpTask(5, 21), 20).train.has_value());
  EXPECT_TRUE(Train(*second, 21).send.empty());
  EXPECT_EQ(encoded_, 1);
  Actions a = Train(*first, 20);
  ExpectLeft(a, 20, "refused the round's secure aggregation: " + Repeat(5));
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "secagg refused in round 5: " + Repeat(5));
  EXPECT_EQ(encoded_, 1);  // The refused one's input was never handed on.
}

// --dp-max-rounds: a cap on the noised updates a client ever makes, over
// every run, name and restart the ledger has seen, so a coordinator that
// renumbers or renames rounds gets at most that many noised copies. The
// cap binds at the setup and again when the noised input is made.
TEST_F(DistributedDpLedgerTest, TheMaxRoundsCapHoldsOverRunsNamesAndRestarts) {
  auto capped = [&](const std::string& run, uint32_t cap) {
    std::unique_ptr<Session> s = Make(run);
    s->set_dp_max_rounds(cap);
    return s;
  };
  {
    std::unique_ptr<Session> s = capped("run-a", 2);
    ASSERT_TRUE(s->OnMessage(DpTask(1, 7), 20).train.has_value());
    Train(*s, 7);
    ASSERT_TRUE(s->OnMessage(DpTask(2, 8), 30).train.has_value());  // Not noised: not counted.
  }
  std::unique_ptr<Session> renamed = capped("run-b", 2);
  ASSERT_TRUE(renamed->OnMessage(DpTask(9, 9), 20).train.has_value());
  Train(*renamed, 9);
  ExpectLeft(renamed->OnMessage(DpTask(10, 10), 30), 10, Budget(10, "run-b", 2));
  // Restarted under a third name: refused at the setup, before training.
  ExpectLeft(capped("run-c", 2)->OnMessage(DpTask(1, 11), 20), 11, Budget(1, "run-c", 2));
  EXPECT_EQ(encoded_, 2);
  // Set up under the cap, but the cap is reached before the noising (a
  // second process on the state directory): the input is never handed on.
  std::unique_ptr<Session> first = capped("run-d", 3), second = capped("run-e", 3);
  ASSERT_TRUE(first->OnMessage(DpTask(4, 12), 20).train.has_value());
  ASSERT_TRUE(second->OnMessage(DpTask(4, 13), 20).train.has_value());
  Train(*second, 13);
  Actions a = Train(*first, 12);
  ExpectLeft(a, 12, "refused the round's secure aggregation: " + Budget(4, "run-d", 3));
  EXPECT_EQ(encoded_, 3);
  // Without a cap the ledger still refuses only repeats.
  ASSERT_TRUE(Make("run-c")->OnMessage(DpTask(1, 14), 20).train.has_value());
}

// A ledger file that cannot be read is never taken for an empty one: every
// distributed-DP task is left naming the file, which stays as it was, and
// other tasks go on.
TEST_F(DistributedDpLedgerTest, ACorruptLedgerRefusesEveryNoisedUpdateNamingTheFile) {
  const std::string path = DpLedgerPath(dir_);
  const std::string garbage = "CHTDPLG1 not a ledger";
  std::ofstream(path, std::ios::binary) << garbage;
  const std::string why = path +
                          ": distributed DP's ledger of noised rounds: 21 bytes for "
                          "7791334147371265568 entries; this client noises no update until "
                          "its operator repairs or removes the file (removing it forgets which "
                          "rounds were noised)";
  std::unique_ptr<Session> s = Make();
  ExpectLeft(s->OnMessage(DpTask(1, 7), 20), 7, why);
  ExpectLeft(s->OnMessage(DpTask(2, 8), 30), 8, why);
  ASSERT_TRUE(s->OnMessage(SecureTask(9, identity_.public_key), 40).train.has_value());
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
            garbage);

  // Corrupted between the setup and the noising: the input is not sent.
  std::filesystem::remove(path);
  std::unique_ptr<Session> t = Make();
  ASSERT_TRUE(t->OnMessage(DpTask(3, 10), 20).train.has_value());
  std::ofstream(path, std::ios::binary) << garbage;
  Actions a = Train(*t, 10);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_NE(a.send[0].header.goodbye().reason().find(
                path + ": distributed DP's ledger of noised rounds: 21 bytes for"),
            std::string::npos)
      << a.send[0].header.goodbye().reason();
  EXPECT_NE(a.send[0].header.goodbye().reason().find(
                "the noised update is not sent, since it could not be counted"),
            std::string::npos);
  EXPECT_EQ(encoded_, 0);
}

// The setup says each share's variance, not the m survivors it is sized
// for; with its own noise multiplier a client knows the target (s sigma
// C)^2, and refuses a cohort too small to carry it at its setup.
TEST_F(DistributedDpLedgerTest, ACohortSmallerThanTheSurvivorsItsShareAssumesIsRefused) {
  const double target = std::pow(1024 * 0.5, 2);  // s 1024, C 0.5, sigma 1: 262144.
  auto with_share = [&](uint64_t id, double share) {
    net::Envelope e = DpTask(1, id);
    e.header.mutable_task()->mutable_secagg()->set_dp_share_variance(share);
    return e;
  };
  // Without a noise multiplier of its own, the share is the coordinator's word.
  ASSERT_TRUE(Make("mnist-dp", false)->OnMessage(with_share(7, target / 10), 20).train.has_value());
  std::unique_ptr<Session> pinned = Make("mnist-dp", false);
  pinned->set_dp_noise_multiplier(1.0);
  Actions a = pinned->OnMessage(with_share(8, target / 10), 20);  // A cohort of 3, sized for 10.
  EXPECT_FALSE(a.train.has_value());
  EXPECT_TRUE(a.send.empty());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0],
            "secagg refused in round 1: secagg setup: a cohort of 3 is smaller than the 10 "
            "survivors this round's noise share assumes (share variance 26214.4 per coordinate; "
            "this client's noise multiplier 1 needs 262144 from the survivors together)");
  // Sized for the three of the cohort (or fewer): the cohort carries the target.
  ASSERT_TRUE(pinned->OnMessage(with_share(9, target / 3), 30).train.has_value());
  ASSERT_TRUE(pinned->OnMessage(with_share(10, target / 2), 40).train.has_value());
}

// A coordinator that drops masked inputs until fewer than the m survivors
// the share is sized for remain would release an under-noised sum: a
// pinned client refuses to sign a survivor list shorter than m and leaves
// the round. Here m = 2 of a cohort of 3. A list of m, or any list for an
// unpinned client, goes on to the protocol's own checks (here it comes
// before this client masked: out of order).
TEST_F(DistributedDpLedgerTest, APinnedClientRefusesToSignAShortSurvivorList) {
  const double target = std::pow(1024 * 0.5, 2);  // s 1024, C 0.5, sigma 1.
  auto task = [&](uint64_t id) {
    net::Envelope e = DpTask(1, id);
    e.header.mutable_task()->mutable_secagg()->set_dp_share_variance(target / 2);
    return e;
  };
  std::unique_ptr<Session> pinned = Make("mnist-dp", false);
  pinned->set_dp_noise_multiplier(1.0);
  ASSERT_TRUE(pinned->OnMessage(task(7), 20).train.has_value());
  Actions a = pinned->OnMessage(SurvivorsFor(1, 7, {0}), 30);
  const std::string why =
      "survivor list: 1 survivor, fewer than the 2 whose noise shares (variance 131072 per "
      "coordinate) together carry this client's noise multiplier 1; the sum would be "
      "under-noised";
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "secagg refused in round 1: " + why);
  ExpectLeft(a, 7, "refused the round's secure aggregation: " + why);

  ASSERT_TRUE(pinned->OnMessage(task(8), 40).train.has_value());
  a = pinned->OnMessage(SurvivorsFor(1, 8, {0, 2}), 50);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "secagg refused in round 1: secagg client: SignSurvivors out of order");
  // V / m in floating point can come out a hair short: (1024 x 1.3 x 0.7)^2
  // / 2 as the share makes V / share 2.0000000000000004, still 2 survivors.
  std::unique_ptr<Session> rounded = Make("mnist-dp", false);
  rounded->set_dp_noise_multiplier(1.3);
  net::Envelope e = DpTask(1, 10);
  e.header.mutable_task()->mutable_secagg()->set_dp_clip_norm(0.7);
  e.header.mutable_task()->mutable_secagg()->set_dp_l2_bound(800);
  e.header.mutable_task()->mutable_secagg()->set_dp_share_variance(std::pow(1024 * 1.3 * 0.7, 2) /
                                                                   2);
  ASSERT_TRUE(rounded->OnMessage(e, 20).train.has_value());
  a = rounded->OnMessage(SurvivorsFor(1, 10, {1, 2}), 30);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "secagg refused in round 1: secagg client: SignSurvivors out of order");
  std::unique_ptr<Session> unpinned = Make("mnist-dp", false);
  ASSERT_TRUE(unpinned->OnMessage(task(9), 20).train.has_value());
  a = unpinned->OnMessage(SurvivorsFor(1, 9, {0}), 30);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "secagg refused in round 1: secagg client: SignSurvivors out of order");
}

// A pinned client refuses a setup that drops the noise (all DP fields 0:
// the plain encoding) and a grid whose L2 bound is above 2 s C, where the
// rounding (seeded from the coordinator's train seed) would carry more of
// the update than the pinned noise covers.
TEST_F(DistributedDpLedgerTest, APinnedClientRefusesNoNoiseAndACoarseGrid) {
  auto setup = [&](uint64_t id, double scale, double l2) {
    net::Envelope e = DpTask(1, id);
    auto* sa = e.header.mutable_task()->mutable_secagg();
    sa->set_dp_scale(scale);
    sa->set_dp_l2_bound(l2);
    sa->set_dp_share_variance(std::pow(1024 * 0.5, 2));
    if (scale == 0) {
      sa->set_dp_clip_norm(0);
      sa->set_dp_share_variance(0);
    }
    return e;
  };
  std::unique_ptr<Session> pinned = Make("mnist-dp", false);
  pinned->set_dp_noise_multiplier(1.0);
  Actions a = pinned->OnMessage(setup(7, 0, 0), 20);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0],
            "secagg refused in round 1: secagg setup: this client insists on distributed DP's "
            "noise (--dp-noise-multiplier 1) and the round's setup carries none");
  a = pinned->OnMessage(setup(8, 1024, 1025), 30);  // 2 s C is 1024.
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(
      a.printed[0],
      "secagg refused in round 1: secagg setup: the grid's L2 bound 1025 is above twice the "
      "scaled clip norm 512 (or that is below 1): the rounding would carry more of the update "
      "than this client's noise multiplier 1 covers");
  ASSERT_TRUE(pinned->OnMessage(setup(9, 1024, 1024), 40).train.has_value());
  // Unpinned, both are the coordinator's word, as before.
  ASSERT_TRUE(Make("mnist-dp", false)->OnMessage(setup(10, 0, 0), 50).train.has_value());
  ASSERT_TRUE(Make("mnist-dp", false)->OnMessage(setup(11, 1024, 1025), 60).train.has_value());
}

// Adaptive clipping under distributed DP: the word after the delta is the
// bit [||delta|| <= C] on the count grid S plus the client's noise share
// (a share of 1e-9 draws 0 here, so the word is the bit exactly); the
// metric slots follow it. A count word without a share is refused by any
// client; a pinned client (--dp-noise-multiplier) refuses a share too small
// for the pair to spend no more than its noise multiplier alone.
TEST_F(DistributedDpLedgerTest, TheCountWordCarriesTheBitAndAPinnedClientChecksItsNoise) {
  constexpr double kGrid = 2097152;  // 2^21.
  auto with_count = [&](uint64_t id, uint32_t round, double share) {
    net::Envelope e = DpTask(round, id);
    e.header.mutable_task()->mutable_secagg()->set_dp_count_scale(kGrid);
    e.header.mutable_task()->mutable_secagg()->set_dp_count_share_variance(share);
    return e;
  };
  std::unique_ptr<Session> s = Make("mnist-dp", false);
  ASSERT_TRUE(s->OnMessage(with_count(7, 1, 1e-9), 20).train.has_value());
  (void)Train(*s, 7);  // Norm 0.229 <= C 0.5.
  ASSERT_EQ(last_input_.size(), kParams + 1 + aggregation::kSecureMetricSlots);
  EXPECT_EQ(last_input_[kParams], kGrid);
  ASSERT_TRUE(s->OnMessage(with_count(8, 2, 1e-9), 30).train.has_value());
  const std::vector<float> long_delta = {1.0f, 0, 0, 0};  // Norm 1 > C 0.5.
  (void)s->OnTrainingDone(8, train::TrainResult{}, long_delta, 40);
  EXPECT_EQ(last_input_[kParams], 0u);

  Actions a = Make("mnist-dp", false)->OnMessage(with_count(9, 3, 0), 50);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0],
            "secagg refused in round 3: secagg setup: adaptive clipping's count word (grid "
            "2.09715e+06, noise share 0) needs distributed DP's noised delta, a whole grid >= 1 "
            "on which 3 bits fit 31 bits, and a noise share in (0, 2^42]");

  // Pinned to 1: the update's noise over the cohort of 3 is z 3.38; the
  // count's must keep z_update^-2 + (2 sigma)^-2 <= 1, so sigma >= 0.523.
  std::unique_ptr<Session> pinned = Make("mnist-dp", false);
  pinned->set_dp_noise_multiplier(1.0);
  a = pinned->OnMessage(with_count(10, 4, std::pow(0.3 * kGrid, 2) / 3), 60);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0],
            "secagg refused in round 4: secagg setup: adaptive clipping's count word carries too "
            "little noise for this client's noise multiplier 1: over a cohort of 3 the update's "
            "noise multiplier is 3.38291 and the count's standard deviation 0.3, together noise "
            "multiplier 0.59078 (Andrew et al.: z_update^-2 + (2 sigma_count)^-2 must not exceed "
            "1^-2)");
  ASSERT_TRUE(
      pinned->OnMessage(with_count(11, 5, std::pow(0.6 * kGrid, 2) / 3), 70).train.has_value());
  // Without the count word, the pinned client's checks are as before.
  ASSERT_TRUE(pinned->OnMessage(DpTask(6, 12), 80).train.has_value());
  // An honest coordinator at z 1, sigma_b 0.6 with shares sized for all 3:
  // the update at z_Delta = (1 - 1/1.44)^-1/2, the pair exactly at z 1. A
  // client pinned to 1 takes it; one pinned to 1.01 refuses it.
  const double z_delta = 1 / std::sqrt(1 - 1 / 1.44);
  auto honest = [&](uint64_t id, uint32_t round) {
    net::Envelope e = with_count(id, round, std::pow(0.6 * kGrid, 2) / 3);
    e.header.mutable_task()->mutable_secagg()->set_dp_share_variance(
        std::pow(1024 * z_delta * 0.5, 2) / 3);
    return e;
  };
  ASSERT_TRUE(pinned->OnMessage(honest(13, 7), 90).train.has_value());
  // The pair sets the survivors it needs: all 3 (the update alone, 1).
  a = pinned->OnMessage(SurvivorsFor(7, 13, {0, 1}), 95);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("survivor list: 2 survivors, fewer than the 3 whose noise shares"),
            std::string::npos)
      << a.printed[0];
  ASSERT_TRUE(pinned->OnMessage(honest(15, 9), 96).train.has_value());
  a = pinned->OnMessage(SurvivorsFor(9, 15, {0, 1, 2}), 97);
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "secagg refused in round 9: secagg client: SignSurvivors out of order");
  std::unique_ptr<Session> stricter = Make("mnist-dp", false);
  stricter->set_dp_noise_multiplier(1.01);
  a = stricter->OnMessage(honest(14, 8), 100);
  EXPECT_FALSE(a.train.has_value());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_NE(a.printed[0].find("together noise multiplier 1 (Andrew et al."), std::string::npos)
      << a.printed[0];
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
  EXPECT_TRUE(a.send[0].header.heartbeat().finished());

  Session r = Make();
  r.Start(0);
  wire::Header reject;
  reject.mutable_reject()->set_reason("name taken");
  a = r.OnMessage(Env(reject), 10);
  ASSERT_TRUE(a.exit.has_value());
  EXPECT_NE(a.exit->message().find("name taken"), std::string::npos);
}

// The fault filter withholds exactly the planned stage of the planned round
// and says so; other rounds, stages and heartbeats pass untouched.
TEST(FaultFilterTest, WithholdsOnlyThePlannedStageOfThePlannedRound) {
  FaultFilter filter({aggregation::SecAggStage::kAdvertiseKeys, 2, ""}, "c1", nullptr,
                     Env::Default());
  Actions a;
  for (uint32_t round : {2u, 3u}) {
    wire::Header h;
    h.mutable_secagg_keys()->set_round(round);
    a.send.push_back({h, {}, {}});
  }
  wire::Header beat;
  beat.mutable_heartbeat();
  a.send.push_back({beat, {}, {}});
  filter.Apply(a);
  ASSERT_EQ(a.send.size(), 2u);
  EXPECT_EQ(a.send[0].header.secagg_keys().round(), 3u);
  EXPECT_TRUE(a.send[1].header.has_heartbeat());
  ASSERT_EQ(a.printed.size(), 1u);
  EXPECT_EQ(a.printed[0], "paused before advertise_keys of round 2");
}

// A malicious client's tampering needs none of the protocol's secrets: it
// rewrites what the session made (the advert's mask key, a second Hello).
TEST(FaultFilterTest, MisbehavioursTamperWithOutgoingMessages) {
  FaultFilter low({aggregation::SecAggStage::kNone, 0, "low_order_key"}, "c1", nullptr,
                  Env::Default());
  Actions a;
  wire::Header keys;
  keys.mutable_secagg_keys()->add_adverts()->set_mask_key(std::string(32, 'k'));
  a.send.push_back({keys, {}, {}});
  low.Apply(a);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0].header.secagg_keys().adverts(0).mask_key(), std::string(32, '\0'));

  FaultFilter rehello({aggregation::SecAggStage::kNone, 0, "rehello_weight"}, "c1", nullptr,
                      Env::Default());
  Actions task;
  task.train = TrainTask{};
  rehello.Apply(task);
  ASSERT_EQ(task.send.size(), 1u);
  EXPECT_EQ(task.send[0].header.hello().client_name(), "c1");
  EXPECT_EQ(task.send[0].header.hello().num_samples(), uint64_t{1} << 40);
  Actions idle;
  rehello.Apply(idle);
  EXPECT_TRUE(idle.send.empty());
}

}  // namespace
}  // namespace cohort::client
