// Issue 8, acceptance 6: the secure decode against plain FedAvg. One real
// RoundEngine and real client::Sessions, wired together in process (no
// sockets, virtual time); the test plays each client's training by handing
// the session a chosen local model. Shards are unequal and clients drop
// out, so a decode that divided by the cohort's weight instead of the
// survivors' (or ignored dropouts) would miss the plain weighted mean.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>

#include "client/session.h"
#include "coordinator/round_engine.h"
#include "crypto/keys.h"
#include "store/run_store.h"

namespace cohort::testing {
namespace {

constexpr size_t kInputs = 6, kClasses = 3;
constexpr size_t kParams = kInputs * kClasses + kClasses;  // logreg

config::RunConfig Config(int clients, config::Aggregation aggregation) {
  config::RunConfig c;
  c.set_seed(5);
  c.mutable_model()->set_arch("logreg");
  c.mutable_model()->set_input_dim(kInputs);
  c.mutable_model()->set_num_classes(kClasses);
  c.mutable_rounds()->set_num_rounds(1);
  c.mutable_rounds()->set_min_clients(3);
  c.mutable_rounds()->set_start_clients(clients);
  c.mutable_rounds()->set_round_deadline_s(10);
  c.mutable_rounds()->set_client_timeout_s(1000);
  c.mutable_secagg()->set_aggregation(aggregation);
  c.mutable_secagg()->set_clip(1.0f);
  return c;
}

// Everything in one process: messages are delivered in order, time only
// moves when the test advances it.
class InProcessRun {
 public:
  InProcessRun(const config::RunConfig& config, std::vector<uint64_t> samples,
               std::vector<std::vector<float>> deltas,
               std::map<int, aggregation::SecAggStage> faults)
      : deltas_(std::move(deltas)) {
    store_ = std::move(store::OpenSqliteRunStore(":memory:")).value();
    engine_ = std::move(coordinator::RoundEngine::Create(config, std::vector<float>(kParams, 0.0f),
                                                         store_.get(), {}, "test"))
                  .value();
    for (size_t i = 0; i < samples.size(); ++i) {
      keys_.push_back(std::move(crypto::GenerateEd25519()).value());
    }
    for (size_t i = 0; i < samples.size(); ++i) {
      client::FaultPlan fault;
      if (faults.count(static_cast<int>(i))) fault = {faults.at(static_cast<int>(i)), 1, ""};
      sessions_.push_back(std::make_unique<client::Session>(
          "c" + std::to_string(i), samples[i],
          [](const config::ModelConfig&) -> StatusOr<size_t> { return kParams; }, &keys_[i],
          fault));
      Handle(static_cast<int>(i), sessions_[i]->Start(now_));
    }
  }

  // Runs until the engine is done, advancing time to each wakeup.
  void Run() {
    for (int guard = 0; guard < 10000 && !engine_->done(); ++guard) {
      if (!Pump()) {
        auto next = engine_->NextWakeup();
        ASSERT_TRUE(next.has_value()) << "stalled";
        now_ = std::max(now_, *next);
        for (auto& o : engine_->OnTick(now_)) ToClient(o);
      }
    }
    ASSERT_TRUE(engine_->done());
  }

  store::RunStore& store() { return *store_; }
  // Called on each client message before the engine sees it.
  void set_tamper(std::function<void(int client, net::Envelope&)> tamper) {
    tamper_ = std::move(tamper);
  }
  // Errors the engine sent; without a tamper function each is a failure.
  const std::vector<std::string>& errors() const { return errors_; }
  std::span<const float> model() const { return engine_->global_model(); }

 private:
  struct ToEngine {
    int client;
    net::Envelope envelope;
  };

  void Handle(int i, client::Actions a) {
    for (auto& out : a.send) to_engine_.push_back({i, client::AsEnvelope(std::move(out))});
    if (a.train) {
      std::vector<float> local = a.train->global;
      for (size_t j = 0; j < local.size(); ++j) local[j] += deltas_[i][j];
      train::TrainResult result;
      result.mean_loss = 0.1 * (i + 1);
      result.samples = 1;
      pending_training_.push_back({i, a.train->task_id, std::move(local), result});
    }
  }

  void ToClient(const coordinator::Outgoing& o) {
    net::Envelope e;
    e.header = o.header;
    if (o.payload) e.payloads.push_back(*o.payload);
    if (o.header.has_error()) {
      errors_.push_back(o.peer + ": " + wire::ErrorCode_Name(o.header.error().code()) + ": " +
                        o.header.error().message());
      if (!tamper_) ADD_FAILURE() << errors_.back();
    }
    const int i = std::stoi(o.peer.substr(1));
    Handle(i, sessions_[i]->OnMessage(e, now_));
  }

  // Delivers one message or finishes one training job; false when idle.
  bool Pump() {
    if (!to_engine_.empty()) {
      ToEngine m = std::move(to_engine_.front());
      to_engine_.pop_front();
      if (tamper_) tamper_(m.client, m.envelope);
      for (auto& o : engine_->OnMessage("p" + std::to_string(m.client), m.envelope, now_)) {
        ToClient(o);
      }
      return true;
    }
    if (!pending_training_.empty()) {
      auto job = std::move(pending_training_.front());
      pending_training_.pop_front();
      Handle(job.client,
             sessions_[job.client]->OnTrainingDone(job.task_id, job.result, job.local, now_));
      return true;
    }
    return false;
  }

  struct Job {
    int client;
    uint64_t task_id;
    std::vector<float> local;
    train::TrainResult result;
  };
  TimeMs now_ = 1000;
  std::unique_ptr<store::RunStore> store_;
  std::unique_ptr<coordinator::RoundEngine> engine_;
  std::vector<crypto::Ed25519KeyPair> keys_;
  std::vector<std::unique_ptr<client::Session>> sessions_;
  std::vector<std::vector<float>> deltas_;
  std::deque<ToEngine> to_engine_;
  std::deque<Job> pending_training_;
  std::function<void(int, net::Envelope&)> tamper_;
  std::vector<std::string> errors_;
};

TEST(SecureDecodeTest, EqualsPlainFedAvgOnUnequalShardsWithDropouts) {
  constexpr int kClients = 9;
  const std::vector<uint64_t> samples = {10, 2000, 35, 700, 1, 90, 5000, 64, 333};
  std::vector<std::vector<float>> deltas(kClients, std::vector<float>(kParams));
  uint64_t seed = 7;
  for (auto& d : deltas) {
    for (auto& v : d) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>((seed >> 40) % 20001) / 10000.0f - 1.0f;  // In [-1, 1] = +-clip.
    }
  }
  // Client 6 (the largest shard) drops before its masked input, client 1
  // before the key exchange; client 8 leaves after its input (it counts).
  const std::map<int, aggregation::SecAggStage> faults = {
      {6, aggregation::SecAggStage::kMaskedInput},
      {1, aggregation::SecAggStage::kShareKeys},
      {8, aggregation::SecAggStage::kConsistency}};
  InProcessRun run(Config(kClients, config::SECAGG_PLUS), samples, deltas, faults);
  run.Run();
  auto rounds = std::move(run.store().Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].outcome, "committed") << rounds[0].outcome_reason;
  ASSERT_EQ(rounds[0].participants, 7u);

  // Plain FedAvg over the clients whose inputs are in the sum.
  double weight = 0;
  std::vector<double> mean(kParams, 0);
  for (int i = 0; i < kClients; ++i) {
    if (i == 6 || i == 1) continue;
    weight += samples[i];
    for (size_t j = 0; j < kParams; ++j) mean[j] += samples[i] * double{deltas[i][j]};
  }
  // The bound: each client's encoding rounds by less than one unit of the
  // grid, 1 / (scale * n_k / W); summed over the survivors and divided by
  // their weight, the error stays below survivors / (scale * sum n_k / W).
  double cohort = 0;  // W: the registered samples of the whole cohort.
  for (uint64_t s : samples) cohort += s;
  const double scale = std::floor((2147483647.0 - kClients) / 1.0);
  const double bound = 7.0 / (scale * weight / cohort) + 1e-6;  // + float rounding of the model.
  for (size_t j = 0; j < kParams; ++j) {
    EXPECT_NEAR(run.model()[j], mean[j] / weight, bound) << "parameter " << j;
  }
  // The round's training loss is the weighted mean of the survivors' losses.
  double loss = 0;
  for (int i = 0; i < kClients; ++i) {
    if (i != 6 && i != 1) loss += samples[i] * 0.1 * (i + 1);
  }
  EXPECT_NEAR(rounds[0].train_loss, loss / weight, 1e-4);
}

// Six clients (k = 5, t = 4): client 1 drops before its masked input and
// client 3 after it. Each survivor's secrets were shared with its 5
// neighbours, 2 of which are gone, so no survivor's self mask can be
// rebuilt; the round aborts at the consistency stage, saying so (it used to
// wait for unmask responses that the clients refuse and report "0 valid
// shares of client 0's self mask").
TEST(SecureDecodeTest, TwoDropoutsOfSixAbortNamingTheNeighboursLeft) {
  constexpr int kClients = 6;
  const std::vector<uint64_t> samples(kClients, 100);
  const std::vector<std::vector<float>> deltas(kClients, std::vector<float>(kParams, 0.5f));
  const std::map<int, aggregation::SecAggStage> faults = {
      {1, aggregation::SecAggStage::kMaskedInput}, {3, aggregation::SecAggStage::kConsistency}};
  InProcessRun run(Config(kClients, config::SECAGG_PLUS), samples, deltas, faults);
  run.Run();
  auto rounds = std::move(run.store().Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].outcome, "aborted");
  EXPECT_NE(rounds[0].outcome_reason.find("only 3 of client 0's 5 neighbours signed the survivor "
                                          "list, need t = 4 to rebuild its self mask"),
            std::string::npos)
      << rounds[0].outcome_reason;
}

TEST(SecureDecodeTest, SecAggMessageWithAStaleTaskIdIsRefusedAndItsSenderLeft) {
  // Client 2's shares carry the right round but another task id (a replay
  // from an earlier task of the same round number, e.g. before a restart).
  constexpr int kClients = 6;
  const std::vector<uint64_t> samples(kClients, 100);
  const std::vector<std::vector<float>> deltas(kClients, std::vector<float>(kParams, 0.5f));
  InProcessRun run(Config(kClients, config::SECAGG_PLUS), samples, deltas, {});
  run.set_tamper([](int client, net::Envelope& e) {
    if (client == 2 && e.header.has_secagg_shares()) {
      e.header.mutable_secagg_shares()->set_task_id(e.header.secagg_shares().task_id() + 1);
    }
  });
  run.Run();
  ASSERT_EQ(run.errors().size(), 1u);
  EXPECT_NE(run.errors()[0].find("p2: STALE: shares for round 1, which is not in progress"),
            std::string::npos)
      << run.errors()[0];
  auto rounds = std::move(run.store().Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].outcome, "committed") << rounds[0].outcome_reason;
  EXPECT_EQ(rounds[0].participants, 5u);  // Without client 2.
  for (size_t j = 0; j < kParams; ++j) EXPECT_NEAR(run.model()[j], 0.5f, 1e-6) << j;
}

// Issue 34: secagg.l2_clip under SecAgg+. Client 3 sends a delta of L2
// norm 0.9 x sqrt(21) = 4.1 (every coordinate within secagg.clip 1, so only
// the norm bound can stop it); every client scales its own delta by
// min(1, C / ||delta||) before masking, so the unmasked sum is the sum of
// the clipped deltas, within the fixed-point grid.
TEST(SecureDecodeTest, TheUnmaskedSumIsTheSumOfTheL2ClippedUpdates) {
  constexpr int kClients = 5;
  constexpr double kBound = 1.5;
  const std::vector<uint64_t> samples = {100, 250, 40, 300, 80};
  std::vector<std::vector<float>> deltas(kClients, std::vector<float>(kParams));
  for (int i = 0; i < kClients; ++i) {
    for (size_t j = 0; j < kParams; ++j) {
      deltas[i][j] = i == 3 ? 0.9f : 0.05f * static_cast<float>((i + j) % 7) - 0.15f;
    }
  }
  config::RunConfig config = Config(kClients, config::SECAGG_PLUS);
  config.mutable_secagg()->set_l2_clip(static_cast<float>(kBound));
  InProcessRun run(config, samples, deltas, {});
  run.Run();
  auto rounds = std::move(run.store().Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].outcome, "committed") << rounds[0].outcome_reason;
  ASSERT_EQ(rounds[0].participants, 5u);

  double weight = 0;
  std::vector<double> clipped_mean(kParams, 0), raw_mean(kParams, 0);
  int scaled = 0;
  for (int i = 0; i < kClients; ++i) {
    double norm = 0;
    for (float v : deltas[i]) norm += double{v} * v;
    norm = std::sqrt(norm);
    const double factor = std::min(1.0, kBound / norm);
    scaled += factor < 1;
    weight += samples[i];
    for (size_t j = 0; j < kParams; ++j) {
      clipped_mean[j] += samples[i] * factor * deltas[i][j];
      raw_mean[j] += samples[i] * double{deltas[i][j]};
    }
  }
  ASSERT_EQ(scaled, 1);  // Only client 3 is over the bound.
  // The grid: each of the 5 encodings rounds by less than one unit,
  // 1 / (scale x n_k / W), and W is the cohort's weight here.
  const double scale = std::floor(2147483647.0 - kClients);
  const double bound = 5.0 / scale + 1e-6;  // + float rounding of the model and the scaling.
  double largest_gap = 0;
  for (size_t j = 0; j < kParams; ++j) {
    EXPECT_NEAR(run.model()[j], clipped_mean[j] / weight, bound) << "parameter " << j;
    largest_gap = std::max(largest_gap, std::fabs(raw_mean[j] - clipped_mean[j]) / weight);
  }
  EXPECT_GT(largest_gap, 0.1);  // The bound changed the model, far beyond the grid.
}

}  // namespace
}  // namespace cohort::testing
