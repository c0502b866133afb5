#include "coordinator/round_engine.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "crypto/digest.h"
#include "privacy/rdp_accountant.h"
#include "privacy/rdp_wor.h"

namespace cohort::coordinator {
namespace {

constexpr size_t kParams = 10;  // logreg 4 -> 2.

config::RunConfig TestConfig(uint32_t clients, uint32_t min_clients, uint32_t rounds = 3) {
  config::RunConfig c;
  c.set_seed(11);
  c.mutable_model()->set_arch("logreg");
  c.mutable_model()->set_input_dim(4);
  c.mutable_model()->set_num_classes(2);
  c.mutable_rounds()->set_num_rounds(rounds);
  c.mutable_rounds()->set_min_clients(min_clients);
  c.mutable_rounds()->set_start_clients(clients);
  c.mutable_rounds()->set_round_deadline_s(10);
  c.mutable_rounds()->set_client_timeout_s(100);
  c.mutable_secagg()->set_aggregation(config::PLAIN);
  return c;
}

net::Envelope Hello(const std::string& name, uint64_t samples = 100) {
  net::Envelope e;
  e.header.set_version(wire::VERSION_1);
  e.header.mutable_hello()->set_client_name(name);
  e.header.mutable_hello()->set_num_samples(samples);
  return e;
}

net::Envelope UpdateFor(const wire::RoundTask& task, std::vector<float> delta,
                        uint64_t samples = 100) {
  net::Envelope e;
  e.header.set_version(wire::VERSION_1);
  auto* u = e.header.mutable_update();
  u->set_round(task.round());
  u->set_task_id(task.task_id());
  u->set_num_samples(samples);
  u->set_train_loss(0.5);
  e.payloads.push_back(std::move(delta));
  return e;
}

// An Env the test controls: its clock moves only when told, task ids count
// from a given start, and lines go to a logger the test can read.
class FakeEnv : public Env {
 public:
  FakeEnv() : log_(std::make_shared<spdlog::logger>("test", sink_)) {
    log_->set_level(spdlog::level::trace);
    sink_->set_pattern("%v");
  }
  double MonotonicSeconds() override { return seconds; }
  uint64_t Random64() override { return next_id++; }
  void RandomBytes(std::span<uint8_t> out) override {
    for (uint8_t& b : out) b = static_cast<uint8_t>(next_id++);
  }
  spdlog::logger& Log() override { return *log_; }
  Status ParallelFor(size_t n, const std::function<Status(size_t)>& fn) override {
    for (size_t i = 0; i < n; ++i) COHORT_RETURN_IF_ERROR(fn(i));  // One thread: in order.
    return OkStatus();
  }
  std::string Lines() const { return out_.str(); }

  double seconds = 0;
  uint64_t next_id = 0;

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_st> sink_ =
      std::make_shared<spdlog::sinks::ostream_sink_st>(out_);
  std::shared_ptr<spdlog::logger> log_;
};

class RoundEngineTest : public ::testing::Test {
 protected:
  void Start(const config::RunConfig& config, Env* env = Env::Default()) {
    config_ = config;
    if (!store_) store_ = std::move(store::OpenSqliteRunStore(":memory:")).value();
    auto e = RoundEngine::Create(config, std::vector<float>(kParams, 1.0f), store_.get(), {},
                                 "test", env);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(e).value();
  }
  // Registers clients "c0".."cN-1" (peer ids "p0"...) and collects tasks.
  void Register(int n) {
    for (int i = 0; i < n; ++i) Deliver("p" + std::to_string(i), Hello("c" + std::to_string(i)));
  }
  void Deliver(const std::string& peer, const net::Envelope& e) {
    Collect(engine_->OnMessage(peer, e, now_));
  }
  void Tick(TimeMs advance) {
    now_ += advance;
    Collect(engine_->OnTick(now_));
  }
  void Collect(std::vector<Outgoing> out) {
    for (auto& o : out) {
      if (o.header.has_task()) {
        tasks_[o.peer] = o.header.task();
        ASSERT_TRUE(o.payload);
        EXPECT_EQ(o.payload->size(), task_floats_);
      }
      if (o.header.has_error()) errors_[o.peer].push_back(o.header.error());
      if (o.header.has_finished()) finished_.insert(o.peer);
    }
  }
  std::vector<float> Global() {
    return {engine_->global_model().begin(), engine_->global_model().end()};
  }
  bool store_error_ok() const { return engine_->store_error().ok(); }

  config::RunConfig config_;
  std::unique_ptr<store::RunStore> store_;
  std::unique_ptr<RoundEngine> engine_;
  TimeMs now_ = 1000;
  size_t task_floats_ = kParams;  // A task's payload: the model (SCAFFOLD: and c).
  std::map<std::string, wire::RoundTask> tasks_;
  std::map<std::string, std::vector<wire::Error>> errors_;
  std::set<std::string> finished_;
};

TEST_F(RoundEngineTest, RoundCommitsTheSampleWeightedMeanOfDeltas) {
  Start(TestConfig(3, 3));
  Deliver("p0", Hello("c0", 100));
  Deliver("p1", Hello("c1", 100));
  Deliver("p2", Hello("c2", 200));
  ASSERT_EQ(tasks_.size(), 3u);
  EXPECT_EQ(tasks_["p0"].round(), 1u);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f), 100));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 2.0f), 100));
  EXPECT_EQ(engine_->last_committed_round(), 0u);
  Deliver("p2", UpdateFor(tasks_["p2"], std::vector<float>(kParams, 4.0f), 200));
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  // 1 + (1*100 + 2*100 + 4*200) / 400 = 3.75
  for (float v : Global()) EXPECT_FLOAT_EQ(v, 3.75f);
  auto rounds = store_->Rounds();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].participants, 3u);
  EXPECT_EQ(store_->LatestCheckpoint()->model, Global());
  EXPECT_EQ(tasks_["p0"].round(), 2u);  // Next round started at once.
}

// Issue 33's timings: a plain round's "train" stage lasts from its tasks to
// its last update on the protocol clock and carries their bytes; each
// client's upload and download are its update and its task; the lineage
// holds the config's digest and the clients it starts with.
TEST_F(RoundEngineTest, ARoundRecordsItsStagesBytesAndEachClientsTraffic) {
  config::RunConfig config = TestConfig(2, 2, 1);
  Start(config);
  uint64_t task_bytes = 0;  // Sent once the round started.
  Register(1);
  auto out = engine_->OnMessage("p1", Hello("c1"), now_);
  // The round starts in this event: its tasks and c1's Welcome count in it.
  for (const Outgoing& o : out) task_bytes += EncodedBytes(o);
  Collect(std::move(out));
  ASSERT_EQ(tasks_.size(), 2u);
  now_ += 2500;
  const net::Envelope u0 = UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f));
  const net::Envelope u1 = UpdateFor(tasks_["p1"], std::vector<float>(kParams, 2.0f));
  Deliver("p0", u0);
  now_ += 500;
  Deliver("p1", u1);
  ASSERT_EQ(engine_->last_committed_round(), 1u);
  auto rounds = store_->Rounds();
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  const store::RoundRecord& r = (*rounds)[0];
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].stage, "train");
  EXPECT_DOUBLE_EQ(r.stages[0].seconds, 3.0);
  EXPECT_EQ(r.stages[0].bytes_in, EncodedBytes(u0) + EncodedBytes(u1));
  EXPECT_EQ(r.stages[0].bytes_out, task_bytes);
  EXPECT_GT(EncodedBytes(u0), kParams * sizeof(float));  // The payload and its header.
  EXPECT_EQ(r.stages[1].stage, "aggregate");
  auto clients = store_->ClientRounds(1);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->size(), 2u);
  EXPECT_EQ((*clients)[0].upload_bytes, EncodedBytes(u0));
  EXPECT_EQ((*clients)[1].upload_bytes, EncodedBytes(u1));
  EXPECT_EQ((*clients)[0].download_bytes + (*clients)[1].download_bytes, task_bytes);
  auto info = store_->LoadRun();
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->config_sha256, crypto::Sha256Hex((*info)->config_text));
  EXPECT_EQ((*info)->world_size, 2u);
}

// A client's shard digest from its Hello is stored with its rounds; one
// that is not a SHA-256 in hex is refused, saying what it must be.
TEST_F(RoundEngineTest, AClientsDataDigestIsStoredAndAMalformedOneRefused) {
  Start(TestConfig(2, 2, 1));
  net::Envelope bad = Hello("c0");
  bad.header.mutable_hello()->set_data_sha256("not-a-digest");
  Deliver("p0", bad);
  ASSERT_EQ(errors_["p0"].size(), 1u);
  EXPECT_NE(errors_["p0"][0].message().find("data_sha256 must be empty or 64 lowercase hex"),
            std::string::npos)
      << errors_["p0"][0].message();
  net::Envelope good = Hello("c0");
  const std::string digest = crypto::Sha256Hex("shard of c0");
  good.header.mutable_hello()->set_data_sha256(digest);
  Deliver("p0", good);
  Deliver("p1", Hello("c1"));
  ASSERT_EQ(tasks_.size(), 2u);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  auto clients = store_->ClientRounds(1);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->size(), 2u);
  EXPECT_EQ((*clients)[0].data_sha256, digest);
  EXPECT_EQ((*clients)[1].data_sha256, "");
}

// Label counts are opt-in; shared ones are stored with the client's rounds,
// and counts that do not sum to the client's samples are refused, saying so.
TEST_F(RoundEngineTest, SharedLabelCountsAreStoredAndInconsistentOnesRefused) {
  Start(TestConfig(2, 2, 1));
  net::Envelope bad = Hello("c0", 100);
  for (uint64_t c : {60, 30}) bad.header.mutable_hello()->add_label_counts(c);
  Deliver("p0", bad);
  ASSERT_EQ(errors_["p0"].size(), 1u);
  EXPECT_NE(errors_["p0"][0].message().find("label_counts sum to 90, not num_samples (100)"),
            std::string::npos)
      << errors_["p0"][0].message();
  net::Envelope good = Hello("c0", 100);
  for (uint64_t c : {60, 0, 40}) good.header.mutable_hello()->add_label_counts(c);
  Deliver("p0", good);
  Deliver("p1", Hello("c1"));
  ASSERT_EQ(tasks_.size(), 2u);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  auto clients = store_->ClientRounds(1);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->size(), 2u);
  EXPECT_EQ((*clients)[0].label_counts, (std::vector<uint64_t>{60, 0, 40}));
  EXPECT_TRUE((*clients)[1].label_counts.empty());
}

TEST_F(RoundEngineTest, ASecureSetupCarriesTheRostersRootNotEveryKey) {
  // Issue 11: with n = 1,000 in a SecAgg+ round, a client's setup holds the
  // roster's root and its own proof (log2 n siblings), not 1,000 keys.
  auto setup_bytes = [&](int n) {
    config::RunConfig c = TestConfig(n, n, 1);
    c.mutable_secagg()->set_aggregation(config::SECAGG_PLUS);
    store_.reset();
    Start(c);
    size_t largest = 0, starts = 0;
    for (int i = 0; i < n; ++i) {
      net::Envelope hello = Hello("c" + std::to_string(i));
      std::string key(32, '\0');
      std::memcpy(key.data(), &i, sizeof(i));
      hello.header.mutable_hello()->set_identity_key(key);
      hello.header.mutable_hello()->set_wants_roster(i == 7);  // One client has --peers.
      for (const Outgoing& o : engine_->OnMessage("p" + std::to_string(i), hello, now_)) {
        if (!o.header.has_secagg_start()) continue;
        ++starts;
        const wire::SecAggSetup& setup = o.header.secagg_start().setup();
        EXPECT_EQ(setup.roster_proof_size(), n == 1000 ? 10 : 7);
        if (o.peer == "p7") {
          // It checks all n keys against its --peers: they come with its setup.
          EXPECT_EQ(setup.roster_size(), n);
          continue;
        }
        EXPECT_EQ(setup.roster_size(), 0);
        largest = std::max(largest, setup.ByteSizeLong());
      }
    }
    EXPECT_EQ(starts, static_cast<size_t>(n));
    return largest;
  };
  const size_t at_100 = setup_bytes(100), at_1000 = setup_bytes(1000);
  EXPECT_LT(at_1000, 600u);                 // 1,000 keys alone would be 34,000 bytes.
  EXPECT_LE(at_1000, at_100 + 3 * 34 + 8);  // Three more siblings, a longer index.
}

TEST_F(RoundEngineTest, ASecureSetupNamesTheConfiguredMaskGenerator) {
  // wire.SecAggSetup.mask_prg: 0 AES-256-CTR, 1 ChaCha20, 2 AES-128-CTR
  // (the default).
  auto setup_prg = [&](std::optional<config::MaskPrg> prg) {
    config::RunConfig c = TestConfig(3, 3, 1);
    c.mutable_secagg()->set_aggregation(config::SECAGG_PLUS);
    if (prg) c.mutable_secagg()->set_mask_prg(*prg);
    store_.reset();
    Start(c);
    std::set<uint32_t> seen;
    for (int i = 0; i < 3; ++i) {
      net::Envelope hello = Hello("c" + std::to_string(i));
      hello.header.mutable_hello()->set_identity_key(std::string(32, static_cast<char>(i + 1)));
      for (const Outgoing& o : engine_->OnMessage("p" + std::to_string(i), hello, now_)) {
        if (o.header.has_secagg_start()) seen.insert(o.header.secagg_start().setup().mask_prg());
      }
    }
    return seen;
  };
  EXPECT_EQ(setup_prg(std::nullopt), std::set<uint32_t>{2});
  EXPECT_EQ(setup_prg(config::AES128_CTR), std::set<uint32_t>{2});
  EXPECT_EQ(setup_prg(config::AES256_CTR), std::set<uint32_t>{0});
  EXPECT_EQ(setup_prg(config::CHACHA20), std::set<uint32_t>{1});
}

TEST_F(RoundEngineTest, AnAuthenticatedSenderMustSayHelloAsItself) {
  // The transport's word on who sent a message is an input of the engine:
  // the daemon's CURVE allowlist entry, the simulator's virtual client.
  Start(TestConfig(2, 2));
  RoundEngine::AuthenticatedPeer alice{"c0", {}};
  alice.identity.fill(1);
  auto hello = [](const std::string& name, char key) {
    net::Envelope e = Hello(name);
    e.header.mutable_hello()->set_identity_key(std::string(32, key));
    return e;
  };
  auto reason = [&](const net::Envelope& e) {
    auto out = engine_->OnMessage("p0", e, now_, &alice);
    return out.size() == 1 && out[0].header.has_reject() ? out[0].header.reject().reason()
                                                         : std::string("(not rejected)");
  };
  EXPECT_EQ(reason(hello("c1", 1)),
            "client name \"c1\" does not match this key's allowlist name \"c0\"");
  EXPECT_EQ(reason(hello("c0", 2)), "identity key in hello is not the allowlisted key of \"c0\"");
  auto out = engine_->OnMessage("p0", hello("c0", 1), now_, &alice);
  ASSERT_FALSE(out.empty());
  EXPECT_TRUE(out[0].header.has_welcome());
  // Without a sender (no authenticating transport) any name may register,
  // but not with a key another client registered.
  out = engine_->OnMessage("p1", hello("c1", 2), now_);
  ASSERT_FALSE(out.empty());
  EXPECT_TRUE(out[0].header.has_welcome());
  out = engine_->OnMessage("p2", hello("c2", 1), now_);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.reject().reason(), "identity key already registered by client \"c0\"");
  // Every later message is held to the sender too: another key on c0's
  // connection is not c0.
  RoundEngine::AuthenticatedPeer bob{"c1", {}};
  bob.identity.fill(2);
  net::Envelope beat;
  beat.header.set_version(wire::VERSION_1);
  beat.header.mutable_heartbeat();
  out = engine_->OnMessage("p0", beat, now_, &bob);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.error().code(), wire::UNKNOWN_CLIENT);
  out = engine_->OnMessage("p0", beat, now_, &alice);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].header.has_heartbeat_ack());
}

TEST_F(RoundEngineTest, TimesIdsAndLinesComeFromTheInjectedEnv) {
  // The engine reads no clock, draws no randomness and writes to no logger
  // of its own: a round that the fake clock says took 2.5 s is recorded as
  // 2.5 s, task ids count from the fake's start, the lines go to its log.
  FakeEnv env;
  env.next_id = 1000;
  env.seconds = 50;
  Start(TestConfig(2, 2), &env);
  Register(2);
  ASSERT_EQ(tasks_.size(), 2u);
  EXPECT_EQ(tasks_["p0"].task_id(), tasks_["p1"].task_id());
  EXPECT_GT(tasks_["p0"].task_id(), 1000u);
  EXPECT_LT(tasks_["p0"].task_id(), 1030u);  // After the run nonce's 16 bytes.
  EXPECT_EQ(store_->LoadRun().value()->run_nonce, "e8e9eaebecedeeeff0f1f2f3f4f5f6f7");
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  env.seconds = 52.5;
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  ASSERT_EQ(engine_->last_committed_round(), 1u);
  auto rounds = store_->Rounds();
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_DOUBLE_EQ((*rounds)[0].seconds, 2.5);
  EXPECT_NE(env.Lines().find("round 1"), std::string::npos) << env.Lines();
}

TEST_F(RoundEngineTest, AThousandRegistrationsSayWhatTheRoundWaitsForInAboutTwentyLines) {
  // The first ten registrations, each tenth of the way and the last one
  // missing say what the round waits for; the others do not repeat it.
  FakeEnv env;
  Start(TestConfig(1000, 2), &env);
  Register(999);
  const std::string lines = env.Lines();
  size_t count = 0;
  for (size_t at = lines.find("round 1 waits for"); at != std::string::npos;
       at = lines.find("round 1 waits for", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 10u + 9u + 1u) << lines;
  EXPECT_NE(lines.find("round 1 waits for 999 more clients (1 of 1000 registered; "
                       "rounds.start_clients sets the first round's cohort)"),
            std::string::npos);
  EXPECT_NE(lines.find("round 1 waits for 990 more clients (10 of 1000 registered"),
            std::string::npos);
  EXPECT_NE(lines.find("round 1 waits for 500 more clients (500 of 1000 registered"),
            std::string::npos);
  EXPECT_NE(lines.find("round 1 waits for 1 more client (999 of 1000 registered"),
            std::string::npos);
  EXPECT_EQ(lines.find("(11 of 1000 registered"), std::string::npos);
}

TEST_F(RoundEngineTest, DeadlineClosesRoundWithoutTheMissingClients) {
  Start(TestConfig(3, 2));
  Register(3);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  EXPECT_EQ(engine_->last_committed_round(), 0u);
  ASSERT_TRUE(engine_->NextWakeup().has_value());
  Tick(*engine_->NextWakeup() - now_);
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  auto rounds = store_->Rounds();
  EXPECT_EQ((*rounds)[0].participants, 2u);
  EXPECT_EQ((*rounds)[0].dropped, 1u);
  auto clients = store_->ClientRounds(1);
  EXPECT_EQ((*clients)[2].status, "dropped");
  EXPECT_EQ((*clients)[2].reason, "missed the round deadline");
  // Round 2 goes ahead with the two that answered.
  EXPECT_EQ(tasks_["p0"].round(), 2u);
  EXPECT_EQ(tasks_["p2"].round(), 1u);
}

TEST_F(RoundEngineTest, AClientLeavingItsRoundIsADropoutForTheReasonItGives) {
  Start(TestConfig(3, 2));
  Register(3);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  // Its fit raised: the round closes now, not at the deadline. The reason
  // is untrusted text: control and non-ASCII bytes become '?', and it is
  // cut at 200 characters.
  net::Envelope bye;
  bye.header.set_version(wire::VERSION_1);
  bye.header.mutable_goodbye()->set_task_id(tasks_["p2"].task_id());
  bye.header.mutable_goodbye()->set_reason("training failed: boom\n\x1b[31m\xff" +
                                           std::string(300, 'x'));
  Deliver("p2", bye);
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  auto clients = store_->ClientRounds(1);
  ASSERT_TRUE(clients.ok());
  EXPECT_EQ((*clients)[2].status, "dropped");
  EXPECT_EQ((*clients)[2].reason,
            "left: training failed: boom??[31m?" + std::string(200 - 28, 'x') + "...");
}

TEST_F(RoundEngineTest, ARevokedClientIsRejectedLeavesItsRoundAndIsNotSelectedAgain) {
  Start(TestConfig(3, 2));
  Register(3);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  const std::vector<Outgoing> out = engine_->Revoke("c2", "key revoked", now_);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out[0].peer, "p2");
  EXPECT_EQ(out[0].header.reject().reason(), "key revoked");
  // The round closed without it, at once.
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  auto clients = store_->ClientRounds(1);
  ASSERT_TRUE(clients.ok());
  EXPECT_EQ((*clients)[2].status, "dropped");
  EXPECT_EQ((*clients)[2].reason, "left: key revoked");
  tasks_.clear();
  Collect(out);
  EXPECT_EQ(tasks_.count("p2"), 0u);  // Round 2 starts with c0 and c1.
  EXPECT_EQ(tasks_.size(), 2u);
  EXPECT_EQ(tasks_["p0"].round(), 2u);
  EXPECT_TRUE(engine_->Revoke("nobody", "key revoked", now_).empty());
}

TEST_F(RoundEngineTest, FederatedEvaluationIsAskedEveryRRoundsAndWeighedByTestSamples) {
  config::RunConfig config = TestConfig(3, 3, 3);
  config.mutable_rounds()->set_federated_eval_every(2);  // Rounds 1 and 3.
  Start(config);
  Register(3);
  auto with_eval = [](const wire::RoundTask& task, uint64_t m, double loss, double accuracy) {
    net::Envelope e = UpdateFor(task, std::vector<float>(kParams, 0.0f));
    e.header.mutable_update()->set_eval_samples(m);
    e.header.mutable_update()->set_eval_loss(loss);
    e.header.mutable_update()->set_eval_accuracy(accuracy);
    return e;
  };
  for (const auto& [peer, task] : tasks_) EXPECT_TRUE(task.evaluate()) << peer;
  Deliver("p0", with_eval(tasks_["p0"], 10, 1.0, 0.5));
  Deliver("p1", with_eval(tasks_["p1"], 30, 2.0, 0.9));
  Deliver("p2", UpdateFor(tasks_["p2"], std::vector<float>(kParams, 0.0f)));  // No test split.
  ASSERT_EQ(engine_->last_committed_round(), 1u);
  // Round 2 does not ask; what a client sends anyway is not recorded.
  for (const auto& [peer, task] : tasks_) EXPECT_FALSE(task.evaluate()) << peer;
  Deliver("p0", with_eval(tasks_["p0"], 10, 1.0, 0.5));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 0.0f)));
  Deliver("p2", UpdateFor(tasks_["p2"], std::vector<float>(kParams, 0.0f)));
  ASSERT_EQ(engine_->last_committed_round(), 2u);
  for (const auto& [peer, task] : tasks_) EXPECT_TRUE(task.evaluate()) << peer;
  // An evaluation out of range is a bad update, named.
  Deliver("p0", with_eval(tasks_["p0"], 10, -1.0, 0.5));
  ASSERT_EQ(errors_["p0"].size(), 1u);
  EXPECT_NE(errors_["p0"][0].message().find("eval_loss finite and >= 0"), std::string::npos)
      << errors_["p0"][0].message();
  auto rounds = store_->Rounds();
  ASSERT_TRUE(rounds.ok());
  EXPECT_NEAR((*rounds)[0].federated_eval_loss, (10 * 1.0 + 30 * 2.0) / 40, 1e-12);
  EXPECT_NEAR((*rounds)[0].federated_eval_accuracy, (10 * 0.5 + 30 * 0.9) / 40, 1e-12);
  EXPECT_EQ((*rounds)[0].federated_eval_samples, 40u);
  EXPECT_EQ((*rounds)[1].federated_eval_samples, 0u);
  EXPECT_EQ((*rounds)[1].federated_eval_loss, -1);
}

TEST_F(RoundEngineTest, ANonFiniteModelIsNeverCommittedAndTheRunGoesOn) {
  // With the norm bound off, finite updates (the sum takes values up to
  // 2^23) and a large server learning rate can still step past FLT_MAX.
  config::RunConfig config = TestConfig(3, 3, 2);
  config.mutable_server()->set_max_update_norm(0);
  config.mutable_server()->set_learning_rate(1e38f);
  Start(config);
  Register(3);
  const std::vector<float> before = Global();
  const std::vector<float> huge(kParams, 8e6f);
  for (const char* peer : {"p0", "p1", "p2"}) Deliver(peer, UpdateFor(tasks_[peer], huge));
  ASSERT_EQ(engine_->last_committed_round(), 1u);
  auto rounds = store_->Rounds();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].outcome, "aborted");
  EXPECT_NE((*rounds)[0].outcome_reason.find("not finite"), std::string::npos)
      << (*rounds)[0].outcome_reason;
  EXPECT_EQ(Global(), before);  // Unchanged, and the checkpoint with it.
  EXPECT_TRUE(store_error_ok());
  // Round 2 runs as usual.
  const std::vector<float> good(kParams, 0.25f);
  for (const char* peer : {"p0", "p1", "p2"}) Deliver(peer, UpdateFor(tasks_[peer], good));
  rounds = store_->Rounds();
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[1].outcome, "committed");
  EXPECT_FLOAT_EQ(Global()[0], before[0] + 1e38f * 0.25f);
}

TEST_F(RoundEngineTest, BadUpdatesAreRejectedAndTheRoundGoesOn) {
  Start(TestConfig(5, 2));
  Register(5);
  const std::vector<float> good(kParams, 0.5f);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams - 1, 0.0f)));
  std::vector<float> nan = good;
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  Deliver("p1", UpdateFor(tasks_["p1"], nan));
  wire::RoundTask past = tasks_["p2"];
  past.set_round(0);
  Deliver("p2", UpdateFor(past, good));
  // Claiming more samples than registered (to weigh more) is refused.
  Deliver("p4", UpdateFor(tasks_["p4"], good, 100000));
  Deliver("stranger", UpdateFor(tasks_["p3"], good));
  ASSERT_EQ(errors_["p0"].size(), 1u);
  EXPECT_EQ(errors_["p0"][0].code(), wire::INVALID_UPDATE);
  EXPECT_NE(errors_["p0"][0].message().find("expected 10"), std::string::npos);
  EXPECT_NE(errors_["p1"][0].message().find("NaN"), std::string::npos);
  EXPECT_EQ(errors_["p2"][0].code(), wire::STALE);
  EXPECT_NE(errors_["p4"][0].message().find("claims 100000 samples"), std::string::npos);
  EXPECT_EQ(errors_["stranger"][0].code(), wire::UNKNOWN_CLIENT);
  // p2's stale message did not drop it; its real update and p3's close the round.
  const wire::RoundTask round1_p3 = tasks_["p3"];
  Deliver("p2", UpdateFor(tasks_["p2"], good));
  Deliver("p3", UpdateFor(round1_p3, good));
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  for (float v : Global()) EXPECT_FLOAT_EQ(v, 1.5f);
  auto rounds = store_->Rounds();
  EXPECT_EQ((*rounds)[0].participants, 2u);
  EXPECT_EQ((*rounds)[0].dropped, 3u);
  auto clients = store_->ClientRounds(1);
  EXPECT_EQ((*clients)[0].status, "rejected");
  EXPECT_EQ((*clients)[1].status, "rejected");
  EXPECT_EQ((*clients)[4].status, "rejected");
  // A replay of the round-1 update during round 2 is refused as stale.
  Deliver("p3", UpdateFor(round1_p3, good));
  ASSERT_EQ(errors_["p3"].size(), 1u);
  EXPECT_EQ(errors_["p3"][0].code(), wire::STALE);
  EXPECT_NE(errors_["p3"][0].message().find("current round is 2"), std::string::npos);
}

// A plain update's metrics are the client's word: a train loss that is NaN
// or infinite would make the round's mean loss (and `cohort status`)
// meaningless, so such an update is rejected whole, however good its delta.
TEST_F(RoundEngineTest, APlainUpdateWithANonFiniteTrainLossIsRejected) {
  Start(TestConfig(4, 2));
  Register(4);
  const std::vector<float> good(kParams, 0.5f);
  net::Envelope nan = UpdateFor(tasks_["p0"], good);
  nan.header.mutable_update()->set_train_loss(std::numeric_limits<double>::quiet_NaN());
  net::Envelope inf = UpdateFor(tasks_["p1"], good);
  inf.header.mutable_update()->set_train_loss(-std::numeric_limits<double>::infinity());
  Deliver("p0", nan);
  Deliver("p1", inf);
  for (const char* peer : {"p0", "p1"}) {
    ASSERT_EQ(errors_[peer].size(), 1u) << peer;
    EXPECT_EQ(errors_[peer][0].code(), wire::INVALID_UPDATE) << peer;
    EXPECT_NE(errors_[peer][0].message().find("non-finite training metrics"), std::string::npos)
        << errors_[peer][0].message();
  }
  Deliver("p2", UpdateFor(tasks_["p2"], good));
  Deliver("p3", UpdateFor(tasks_["p3"], good));
  ASSERT_EQ(engine_->last_committed_round(), 1u);
  auto rounds = store_->Rounds();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].participants, 2u);
  EXPECT_EQ((*rounds)[0].dropped, 2u);
  EXPECT_DOUBLE_EQ((*rounds)[0].train_loss, 0.5);  // The two honest clients' loss.
  auto clients = store_->ClientRounds(1);
  ASSERT_EQ(clients->size(), 4u);
  EXPECT_EQ((*clients)[0].status, "rejected");
  EXPECT_NE((*clients)[0].reason.find("non-finite training metrics"), std::string::npos);
  EXPECT_EQ((*clients)[1].status, "rejected");
  EXPECT_EQ((*clients)[2].status, "ok");
}

TEST_F(RoundEngineTest, NonClientMessagesAndMalformedFramesGetErrors) {
  Start(TestConfig(2, 2));
  net::Envelope welcome;
  welcome.header.set_version(wire::VERSION_1);
  welcome.header.mutable_welcome();
  Deliver("x", welcome);
  Collect(engine_->OnMalformed("y", InvalidArgumentError("malformed header frame")));
  EXPECT_EQ(errors_["x"][0].code(), wire::MALFORMED);
  EXPECT_EQ(errors_["y"][0].message(), "malformed header frame");
  net::Envelope bad_name = Hello("../../etc/passwd");
  Deliver("z", bad_name);
  EXPECT_TRUE(tasks_.empty());
}

// A one-round run in which c2 misses the deadline: it is marked
// unavailable but may be alive. c0 and c1 acknowledge Finished.
class CloseTest : public RoundEngineTest {
 protected:
  void RunWithoutC2() {
    Start(TestConfig(3, 2, 1));
    Register(3);
    Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
    Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
    Tick(*engine_->NextWakeup() - now_);
    ASSERT_TRUE(engine_->done());
    Deliver("p0", Ack());
    Deliver("p1", Ack());
  }
  static net::Envelope Ack() {
    net::Envelope ack;
    ack.header.set_version(wire::VERSION_1);
    ack.header.mutable_heartbeat()->set_finished(true);
    return ack;
  }
};

TEST_F(CloseTest, WaitsForAClientDroppedFromTheLastRoundToHearFinished) {
  RunWithoutC2();
  EXPECT_FALSE(engine_->all_acknowledged_finish(now_));
  // Its late update is answered with Finished, and its acknowledgement
  // lets the coordinator close.
  Deliver("p2", UpdateFor(tasks_["p2"], std::vector<float>(kParams, 1.0f)));
  EXPECT_TRUE(finished_.count("p2"));
  Deliver("p2", Ack());
  EXPECT_TRUE(engine_->all_acknowledged_finish(now_));
}

TEST_F(CloseTest, DoesNotWaitForAClientSilentLongerThanTheTimeout) {
  RunWithoutC2();
  EXPECT_TRUE(engine_->all_acknowledged_finish(now_ + 101 * 1000));  // Timeout: 100 s.
}

TEST_F(RoundEngineTest, AMisbehavingClientStaysExcludedAfterARestart) {
  Start(TestConfig(3, 2, 3));
  Register(3);
  // c2 claims another sample count on the same connection mid-round.
  Deliver("p2", Hello("c2", 1u << 30));
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  ASSERT_EQ(engine_->last_committed_round(), 1u);
  auto clients = store_->ClientRounds(1);
  ASSERT_TRUE(clients.ok());
  EXPECT_TRUE((*clients)[2].misbehaved) << (*clients)[2].reason;
  EXPECT_EQ(tasks_["p2"].round(), 1u);  // Not selected for round 2.
  // "Crash" and restart: the ban is read back from the round's records.
  tasks_.clear();
  Start(config_);
  Register(3);
  EXPECT_EQ(tasks_["p0"].round(), 2u);
  EXPECT_EQ(tasks_["p1"].round(), 2u);
  EXPECT_EQ(tasks_.count("p2"), 0u);
}

// The ban is read from the record's typed column, not from its reason.
TEST_F(RoundEngineTest, ABanSurvivesARestartThroughTheMisbehavedColumn) {
  Start(TestConfig(3, 2, 3));
  store::RoundRecord r;
  r.round = 1;
  store::ClientRoundRecord c2;
  c2.client = "c2";
  c2.status = "ok";
  c2.reason = "revealed a forged share";
  c2.misbehaved = true;
  store::Checkpoint cp{1, std::vector<float>(kParams, 1.0f), {}};
  ASSERT_TRUE(store_->CommitRound(r, {c2}, cp, 3).ok());
  Start(config_);  // Resumes after round 1.
  Register(3);
  EXPECT_EQ(tasks_["p0"].round(), 2u);
  EXPECT_EQ(tasks_["p1"].round(), 2u);
  EXPECT_EQ(tasks_.count("p2"), 0u);
}

TEST_F(RoundEngineTest, RunFinishesAndResumesFromTheStore) {
  Start(TestConfig(2, 2, 3));
  Register(2);
  for (int r = 1; r <= 2; ++r) {
    Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 0.25f)));
    Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 0.25f)));
  }
  EXPECT_EQ(engine_->last_committed_round(), 2u);
  const std::vector<float> after_two = Global();
  // "Crash": a new engine over the same store resumes after round 2.
  tasks_.clear();
  Start(config_);
  EXPECT_EQ(engine_->last_committed_round(), 2u);
  EXPECT_EQ(Global(), after_two);
  Register(2);
  EXPECT_EQ(tasks_["p0"].round(), 3u);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 0.25f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 0.25f)));
  EXPECT_TRUE(engine_->done());
  EXPECT_EQ(finished_.size(), 2u);
  for (float v : Global()) EXPECT_FLOAT_EQ(v, 1.75f);
  // More rounds on the same store extend the run.
  config::RunConfig longer = config_;
  longer.mutable_rounds()->set_num_rounds(4);
  auto extended = RoundEngine::Create(longer, std::vector<float>(kParams), store_.get(), {}, "t");
  ASSERT_TRUE(extended.ok()) << extended.status();
  EXPECT_FALSE((*extended)->done());
  EXPECT_EQ((*extended)->last_committed_round(), 3u);
  // A different config on the same store is refused.
  config::RunConfig other = config_;
  other.set_seed(12);
  const Status refused =
      RoundEngine::Create(other, std::vector<float>(kParams), store_.get(), {}, "t").status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("seed"), std::string::npos) << refused;
}

// Welcome.run_nonce: drawn when the run is created, kept in the store and
// sent again by a resumed coordinator; another run gets another. A client's
// ledger of noised rounds tells runs apart by it (client/dp_ledger.h).
TEST_F(RoundEngineTest, TheRunNonceIsKeptAcrossAResumeAndNewForANewRun) {
  auto nonce_sent = [&](const std::string& peer) {
    auto out = engine_->OnMessage(peer, Hello(peer), now_);
    return !out.empty() && out[0].header.has_welcome() ? out[0].header.welcome().run_nonce()
                                                       : std::string("(no welcome)");
  };
  Start(TestConfig(2, 2, 3));
  const std::string nonce = nonce_sent("a0");
  ASSERT_EQ(nonce.size(), 32u);
  EXPECT_EQ(nonce.find_first_not_of("0123456789abcdef"), std::string::npos) << nonce;
  EXPECT_EQ(store_->LoadRun().value()->run_nonce, nonce);
  Start(config_);  // "Crash" and restart on the same store.
  EXPECT_EQ(nonce_sent("a1"), nonce);
  // Restarted with another config before any round committed: the run is
  // replaced, its nonce kept (its clients may have noised round 1).
  config::RunConfig replaced = config_;
  replaced.set_seed(12);
  Start(replaced);
  EXPECT_EQ(store_->LoadRun().value()->seed, 12u);
  EXPECT_EQ(nonce_sent("a3"), nonce);
  store_.reset();  // A new run directory.
  Start(config_);
  EXPECT_NE(nonce_sent("a2"), nonce);
}

// Client k's delta in round r: different per round, client and coordinate,
// of both signs, so m and v move every coordinate differently.
std::vector<float> VaryingDelta(int round, int client) {
  std::vector<float> d(kParams);
  for (size_t i = 0; i < kParams; ++i) {
    d[i] =
        0.01f * static_cast<float>((round * 7 + client * 3 + static_cast<int>(i) * 5) % 11) - 0.05f;
  }
  return d;
}

TEST_F(RoundEngineTest, AnAdaptiveServerOptimizerResumesToTheBitIdenticalModel) {
  for (auto optimizer : {config::FEDADAM, config::FEDYOGI, config::FEDADAGRAD}) {
    config::RunConfig c = TestConfig(3, 3, 4);
    c.mutable_server()->set_optimizer(optimizer);
    c.mutable_server()->set_learning_rate(0.05f);
    const auto play = [&](int from, int to) {
      for (int r = from; r <= to; ++r) {
        for (int k = 0; k < 3; ++k) {
          const std::string peer = "p" + std::to_string(k);
          Deliver(peer, UpdateFor(tasks_[peer], VaryingDelta(r, k)));
        }
      }
    };
    // Uninterrupted.
    store_.reset();
    tasks_.clear();
    Start(c);
    Register(3);
    play(1, 4);
    ASSERT_TRUE(engine_->done()) << config::ServerOptimizer_Name(optimizer);
    const std::vector<float> reference = Global();
    const store::Checkpoint reference_cp = std::move(store_->LatestCheckpoint()).value();
    // Stopped after round 2 (a new engine over the same store), then resumed.
    store_.reset();
    tasks_.clear();
    Start(c);
    Register(3);
    play(1, 2);
    tasks_.clear();
    Start(c);
    ASSERT_EQ(engine_->last_committed_round(), 2u);
    Register(3);
    play(3, 4);
    ASSERT_TRUE(engine_->done());
    const store::Checkpoint resumed_cp = std::move(store_->LatestCheckpoint()).value();
    const std::vector<float> resumed = Global();
    EXPECT_EQ(std::memcmp(resumed.data(), reference.data(), kParams * sizeof(float)), 0)
        << config::ServerOptimizer_Name(optimizer) << ": the resumed model differs";
    ASSERT_EQ(resumed_cp.velocity.size(), 2 * kParams);  // m and v.
    EXPECT_EQ(resumed_cp.velocity, reference_cp.velocity);
    EXPECT_EQ(resumed_cp.optimizer_steps, 4u);
    EXPECT_NE(resumed, std::vector<float>(kParams, 1.0f));
  }
}

TEST_F(RoundEngineTest, ARobustRuleKeepsAFarUpdateOutOfTheModel) {
  // Six honest deltas 0.125 + k / 64 (k = 0..5; dyadic, so every distance
  // and tie is exact) and one of 30 (L2 norm 95, under the default
  // server.max_update_norm 100); f = 1, n = 7 = 4f + 3. In units of 1/64
  // above 0.125: the median and the mean of the middle five (trim 0.2:
  // floor(1.4) = 1 each end) are 3. Krum (4 neighbours, squared
  // distances): k = 2 and 3 score 10, tied; the lower index wins, 2.
  // Multi-Krum (m = n - f = 6): the six honest ones, 2.5. Bulyan picks 2,
  // 3, 1, 4, 0 (iterated Krum, ties to the lower index); per coordinate the
  // 3 nearest the median 2 are 2, 3, 1: 2.
  const auto at = [](double units) { return static_cast<float>(0.125 + units / 64); };
  const std::pair<config::RobustRule, float> rules[] = {{config::MEDIAN, at(3)},
                                                        {config::TRIMMED_MEAN, at(3)},
                                                        {config::KRUM, at(2)},
                                                        {config::MULTI_KRUM, at(2.5)},
                                                        {config::BULYAN, at(2)}};
  for (const auto& [rule, exact] : rules) {
    config::RunConfig c = TestConfig(8, 7, 1);
    c.mutable_server()->mutable_robust()->set_rule(rule);
    if (rule == config::TRIMMED_MEAN) c.mutable_server()->mutable_robust()->set_trim_fraction(0.2f);
    store_.reset();
    tasks_.clear();
    Start(c);
    Register(8);
    for (int k = 0; k < 7; ++k) {
      const std::string peer = "p" + std::to_string(k);
      const float v = k == 6 ? 30.0f : at(k);
      net::Envelope update = UpdateFor(tasks_[peer], std::vector<float>(kParams, v));
      // The far client's loss is wild too: the round's figure is the median.
      update.header.mutable_update()->set_train_loss(k == 6 ? 1e6 : 0.25 * k);
      Deliver(peer, update);
    }
    // An eighth, refused (not finite): its update and its loss never count.
    Deliver("p7", UpdateFor(tasks_["p7"], std::vector<float>(kParams, NAN)));
    ASSERT_EQ(engine_->last_committed_round(), 1u) << config::RobustRule_Name(rule);
    for (float x : Global()) EXPECT_NEAR(x, 1.0f + exact, 1e-6) << config::RobustRule_Name(rule);
    EXPECT_EQ(store_->Rounds()->back().train_loss, 0.75) << config::RobustRule_Name(rule);
  }
}

// An error refusing an update names its task, so the client knows which
// of its updates did not count (a SCAFFOLD client takes back its c_i
// change: session_test).
TEST_F(RoundEngineTest, ARefusedUpdatesErrorNamesItsTask) {
  Start(TestConfig(3, 2));
  Register(3);
  wire::RoundTask stale = tasks_["p0"];
  stale.set_task_id(stale.task_id() + 1000);
  Deliver("p0", UpdateFor(stale, std::vector<float>(kParams, 0.1f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams - 1, 0.1f)));
  ASSERT_EQ(errors_["p0"].size(), 1u);
  EXPECT_EQ(errors_["p0"][0].code(), wire::STALE);
  EXPECT_EQ(errors_["p0"][0].task_id(), stale.task_id());
  ASSERT_EQ(errors_["p1"].size(), 1u);
  EXPECT_EQ(errors_["p1"][0].code(), wire::INVALID_UPDATE);
  EXPECT_EQ(errors_["p1"][0].task_id(), tasks_["p1"].task_id());
  // A second copy of an update that counted: its first copy counts, so the
  // error names no task (the client must not take its change back).
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 0.1f)));
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 0.1f)));
  ASSERT_EQ(errors_["p0"].size(), 2u);
  EXPECT_EQ(errors_["p0"][1].message(), "a second update for round 1");
  EXPECT_EQ(errors_["p0"][1].task_id(), 0u);
  // Not about an update: no task.
  Deliver("p9", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 0.1f)));
  ASSERT_EQ(errors_["p9"].size(), 1u);
  EXPECT_EQ(errors_["p9"][0].code(), wire::UNKNOWN_CLIENT);
  EXPECT_EQ(errors_["p9"][0].task_id(), 0u);
}

TEST_F(RoundEngineTest, SelectionIsASeededFraction) {
  config::RunConfig c = TestConfig(10, 2);
  c.mutable_rounds()->set_fraction(0.5f);
  Start(c);
  Register(10);
  ASSERT_EQ(tasks_.size(), 5u);
  std::set<std::string> first;
  for (auto& [peer, t] : tasks_) first.insert(peer);
  tasks_.clear();
  store_.reset();
  Start(c);
  Register(10);
  std::set<std::string> second;
  for (auto& [peer, t] : tasks_) second.insert(peer);
  EXPECT_EQ(first, second);
}

TEST_F(RoundEngineTest, ReconnectedClientGetsItsTaskAgain) {
  Start(TestConfig(2, 2));
  Register(2);
  const uint64_t task_id = tasks_["p1"].task_id();
  Deliver("p1-new", Hello("c1"));
  ASSERT_TRUE(tasks_.count("p1-new"));
  EXPECT_EQ(tasks_["p1-new"].task_id(), task_id);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 0.0f)));
  Deliver("p1-new", UpdateFor(tasks_["p1-new"], std::vector<float>(kParams, 0.0f)));
  EXPECT_EQ(engine_->last_committed_round(), 1u);
}

TEST_F(RoundEngineTest, TooFewUpdatesRunTheRoundAgainWithoutCommitting) {
  Start(TestConfig(3, 3));
  Register(3);
  const uint64_t first_task = tasks_["p0"].task_id();
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Tick(11000);  // Past the deadline: 1 of 3 arrived, 3 needed.
  EXPECT_EQ(engine_->last_committed_round(), 0u);
  EXPECT_TRUE(store_->Rounds()->empty());
  // The two silent clients are unavailable until they speak again.
  net::Envelope hb;
  hb.header.set_version(wire::VERSION_1);
  hb.header.mutable_heartbeat();
  Deliver("p1", hb);
  Deliver("p2", hb);
  EXPECT_EQ(tasks_["p0"].round(), 1u);
  EXPECT_NE(tasks_["p0"].task_id(), first_task);
}

// A re-run trains the same model with the same seeds, so an update a check
// refused is refused again: the round is committed aborted at once (it used
// to be run again forever), and the run goes on to its end.
TEST_F(RoundEngineTest, ARefusedUpdateShortOfMinClientsAbortsTheRoundInsteadOfRerunningIt) {
  FakeEnv env;
  config::RunConfig c = TestConfig(3, 3, 2);
  c.mutable_server()->set_max_update_norm(5);
  Start(c, &env);
  Register(3);
  for (uint32_t round = 1; round <= 2; ++round) {
    ASSERT_EQ(tasks_["p0"].round(), round);
    Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
    Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
    Deliver("p2", UpdateFor(tasks_["p2"], std::vector<float>(kParams, 100.0f)));
    EXPECT_EQ(engine_->last_committed_round(), round);
  }
  EXPECT_TRUE(engine_->done());
  for (float v : Global()) EXPECT_FLOAT_EQ(v, 1.0f);  // Never stepped.
  auto rounds = store_->Rounds();
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].outcome, "aborted");
  EXPECT_EQ((*rounds)[0].outcome_reason,
            "only 2 updates accepted, need 3; client c2's update was refused (update has L2 norm "
            "316.2, above server.max_update_norm 5), and a re-run, with the same model and seeds, "
            "could accept at most 2");
  EXPECT_NE(env.Lines().find("round 1: only 2 updates accepted, need 3; client c2's update was "
                             "refused"),
            std::string::npos)
      << env.Lines();
  EXPECT_EQ(env.Lines().find("run again"), std::string::npos) << env.Lines();
}

// A refused update does not make a re-run futile while the clients that
// did not answer could still make up min_clients: the round is run again.
// (At the deadline c2 became unavailable, so the re-run starts at once with
// c0, c1 and c3, and c3's refusal then leaves at most 2: aborted.)
TEST_F(RoundEngineTest, ARefusedUpdateBesideASilentClientStillGetsARerun) {
  FakeEnv env;
  config::RunConfig c = TestConfig(4, 3, 1);
  c.mutable_server()->set_max_update_norm(5);
  Start(c, &env);
  Register(4);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  Deliver("p3", UpdateFor(tasks_["p3"], std::vector<float>(kParams, 100.0f)));  // Refused.
  Tick(11000);  // c2 silent: 2 accepted, and c2 could have made 3.
  EXPECT_EQ(engine_->last_committed_round(), 0u);
  // The line names who did not count and why.
  EXPECT_NE(env.Lines().find("round 1: only 2 updates accepted, need 3; not counted: c2 (missed "
                             "the round deadline), c3 (update refused: update has L2 norm 316.2, "
                             "above server.max_update_norm 5); the round is run again (attempt 1 "
                             "of 3)"),
            std::string::npos)
      << env.Lines();
  for (const char* peer : {"p0", "p1"}) {
    Deliver(peer, UpdateFor(tasks_[peer], std::vector<float>(kParams, 1.0f)));
  }
  Deliver("p3", UpdateFor(tasks_["p3"], std::vector<float>(kParams, 100.0f)));
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  EXPECT_EQ((*store_->Rounds())[0].outcome_reason,
            "only 2 updates accepted, need 3; client c3's update was refused (update has L2 norm "
            "316.2, above server.max_update_norm 5), and a re-run, with the same model and seeds, "
            "could accept at most 2");
}

// Clients that do not answer may answer a re-run, so a round short of them
// is run again, but at most three times in all: then it is aborted.
TEST_F(RoundEngineTest, ARoundShortOfAnswersIsTriedThreeTimesThenAborted) {
  FakeEnv env;
  Start(TestConfig(3, 3, 2), &env);
  Register(3);
  net::Envelope hb;
  hb.header.set_version(wire::VERSION_1);
  hb.header.mutable_heartbeat();
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_EQ(tasks_["p0"].round(), 1u);
    EXPECT_EQ(engine_->last_committed_round(), 0u);
    Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
    Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
    Tick(11000);        // Past the deadline without c2.
    Deliver("p2", hb);  // Back: the next try can start.
  }
  EXPECT_EQ(engine_->last_committed_round(), 1u);
  EXPECT_EQ(tasks_["p0"].round(), 2u);
  auto rounds = store_->Rounds();
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].outcome, "aborted");
  EXPECT_EQ((*rounds)[0].outcome_reason,
            "only 2 updates accepted, need 3; not counted: c2 (missed the round deadline); the "
            "round was tried 3 times");
  const std::string lines = env.Lines();
  EXPECT_NE(lines.find("round 1: only 2 updates accepted, need 3; not counted: c2 (missed the "
                       "round deadline); the round is run again (attempt 1 of 3)"),
            std::string::npos)
      << lines;
  EXPECT_NE(lines.find("(attempt 2 of 3)"), std::string::npos);
  EXPECT_EQ(lines.find("(attempt 3 of 3)"), std::string::npos);
  // Round 2 is tried afresh: three tries again.
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  Tick(11000);
  EXPECT_NE(env.Lines().find("round 2: only 2 updates accepted, need 3; not counted: c2 (missed "
                             "the round deadline); the round is run again (attempt 1 of 3)"),
            std::string::npos)
      << env.Lines();
  Deliver("p2", hb);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  Deliver("p1", UpdateFor(tasks_["p1"], std::vector<float>(kParams, 1.0f)));
  Deliver("p2", UpdateFor(tasks_["p2"], std::vector<float>(kParams, 1.0f)));
  EXPECT_EQ(engine_->last_committed_round(), 2u);
  EXPECT_EQ((*store_->Rounds())[1].outcome, "committed");
}

// Clients that fail their own training (a SCAFFOLD variate gone to NaN, say)
// leave with their reason: the re-run line says who did not count and why,
// the first three by name, so the operator need not dig it out of the store.
TEST_F(RoundEngineTest, ARerunNamesTheClientsThatDidNotCountAndWhy) {
  FakeEnv env;
  Start(TestConfig(5, 5, 1), &env);
  Register(5);
  Deliver("p0", UpdateFor(tasks_["p0"], std::vector<float>(kParams, 1.0f)));
  for (const char* peer : {"p1", "p2", "p3", "p4"}) {
    net::Envelope bye;
    bye.header.set_version(wire::VERSION_1);
    bye.header.mutable_goodbye()->set_task_id(tasks_[peer].task_id());
    bye.header.mutable_goodbye()->set_reason(
        "train.scaffold: the new control variate has NaN or Inf");
    Deliver(peer, bye);
  }
  EXPECT_EQ(engine_->last_committed_round(), 0u);
  EXPECT_NE(env.Lines().find("round 1: only 1 update accepted, need 5; not counted: c1 (left: "
                             "train.scaffold: the new control variate has NaN or Inf), c2 (left: "
                             "train.scaffold: the new control variate has NaN or Inf), c3 (left: "
                             "train.scaffold: the new control variate has NaN or Inf) and 1 more; "
                             "the round is run again (attempt 1 of 3)"),
            std::string::npos)
      << env.Lines();
}

// SCAFFOLD's N, the clients c's step divides by, is stored with each round
// and never falls: a coordinator restarted after round 2, whose round 3
// starts once 2 of the 4 clients are back, moves c by their changes / 4,
// as the uninterrupted run would, not / 2 (a review found it did).
TEST_F(RoundEngineTest, ScaffoldsNIsStoredAndAResumedRunDividesByNoFewer) {
  config::RunConfig config = TestConfig(4, 2, 3);
  config.mutable_rounds()->set_start_clients(0);  // Round 1 starts with 2.
  config.mutable_train()->set_scaffold(true);
  task_floats_ = 2 * kParams;
  auto send = [&](const std::string& peer) {
    std::vector<float> update(2 * kParams, 0.0f);  // [y_i - x | delta c_i = 1].
    std::fill(update.begin() + kParams, update.end(), 1.0f);
    Deliver(peer, UpdateFor(tasks_[peer], update));
  };
  auto c = [&] { return std::move(store_->LatestCheckpoint()).value().velocity; };
  Start(config);
  Register(4);
  send("p0");
  send("p1");  // Round 1: c0 and c1 of 2 registered at its start: c = 2 / 2.
  EXPECT_EQ(c(), std::vector<float>(kParams, 1.0f));
  for (const char* peer : {"p0", "p1", "p2", "p3"}) send(peer);  // c += 4 / 4.
  EXPECT_EQ(c(), std::vector<float>(kParams, 2.0f));
  ASSERT_EQ(engine_->last_committed_round(), 2u);

  tasks_.clear();
  FakeEnv env;
  Start(config, &env);
  EXPECT_NE(env.Lines().find("SCAFFOLD: c moves by the sum of changes / N, N at least 4 (the "
                             "clients registered before the restart)"),
            std::string::npos)
      << env.Lines();
  Register(2);
  ASSERT_EQ(tasks_.size(), 2u);
  send("p0");
  send("p1");
  EXPECT_EQ(engine_->last_committed_round(), 3u);
  EXPECT_EQ(c(), std::vector<float>(kParams, 2.5f)) << "c moved by 2 / N with N below 4";
  const std::vector<store::RoundRecord> rounds = std::move(store_->Rounds()).value();
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_EQ(rounds[0].scaffold_population, 2u);
  EXPECT_EQ(rounds[1].scaffold_population, 4u);
  EXPECT_EQ(rounds[2].scaffold_population, 4u);
}

// A store written before N was stored resumes with N = the clients
// registered so far, and says so.
TEST_F(RoundEngineTest, AScaffoldStoreWithoutNResumesSayingSo) {
  config::RunConfig config = TestConfig(4, 2, 3);
  config.mutable_train()->set_scaffold(true);
  task_floats_ = 2 * kParams;
  Start(config);  // Creates the run; round 1 as an older build committed it:
  store::RoundRecord old;
  old.round = 1;
  store::Checkpoint cp{1, std::vector<float>(kParams, 1.0f), std::vector<float>(kParams, 0.0f)};
  ASSERT_TRUE(store_->CommitRound(old, {}, cp, 3).ok());
  FakeEnv env;
  Start(config, &env);
  EXPECT_NE(env.Lines().find("SCAFFOLD: the store's 1 round keep no N (written before it was "
                             "stored): N is the clients registered when each round starts; set "
                             "rounds.start_clients to the population so that the first round "
                             "after this restart waits for every one"),
            std::string::npos)
      << env.Lines();
}

// Central differential privacy (issue 34): DP-FedAvg on plain rounds.
config::RunConfig DpConfig(double budget = 0, uint32_t rounds = 50) {
  config::RunConfig c = TestConfig(6, 2, rounds);
  c.mutable_rounds()->set_fraction(0.5f);  // 3 of 6: q = 0.5.
  c.mutable_privacy()->set_noise_multiplier(1.0);
  c.mutable_privacy()->set_clip_norm(1.0);
  c.mutable_privacy()->set_target_delta(1e-5);
  c.mutable_privacy()->set_epsilon_budget(budget);
  return c;
}

SecretBytes NoiseKey(uint8_t fill) {
  SecretBytes key(32);
  std::fill(key.bytes().begin(), key.bytes().end(), fill);
  return key;
}

class PrivacyTest : public RoundEngineTest {
 protected:
  void StartDp(const config::RunConfig& config, uint8_t key = 9) {
    Start(config);
    engine_->SetNoiseKey(NoiseKey(key));
  }
  // Every client selected for the round in progress sends a delta of
  // `value` per parameter (norm sqrt(10) x value: clipped above 1).
  int FinishRound(float value) {
    const uint32_t round = engine_->last_committed_round() + 1;
    std::vector<std::string> peers;
    for (const auto& [peer, task] : tasks_) {
      if (task.round() == round) peers.push_back(peer);
    }
    for (const auto& peer : peers) {
      Deliver(peer, UpdateFor(tasks_[peer], std::vector<float>(kParams, value + peer[1] - '0')));
    }
    return static_cast<int>(peers.size());
  }
};

// The run stops before the round that would pass the budget, with the round
// count the accountant gives, commits what it has and says why.
TEST_F(PrivacyTest, ARunStopsBeforeTheRoundThatWouldSpendMoreThanTheBudget) {
  std::vector<double> eps;
  privacy::RdpAccountant accountant;
  for (int r = 1; r <= 6; ++r) {
    ASSERT_TRUE(privacy::ComposeSampledWithoutReplacement(accountant, 0.5, 1.0 / 2).ok());
    eps.push_back(accountant.Spent(1e-5)->epsilon);
  }
  const double budget = (eps[2] + eps[3]) / 2;  // Room for 3 rounds, not 4.
  StartDp(DpConfig(budget));
  Register(6);
  for (int r = 1; r <= 3; ++r) ASSERT_EQ(FinishRound(5.0f), 3) << "round " << r;
  ASSERT_TRUE(store_error_ok()) << engine_->store_error();
  EXPECT_TRUE(engine_->done());
  EXPECT_EQ(engine_->last_committed_round(), 3u);
  EXPECT_EQ(finished_.size(), 6u);
  char want[96];
  std::snprintf(want, sizeof(want), "privacy budget spent: ε=%.4g > %.4g (round 4, 3 of 6 clients",
                eps[3], budget);
  EXPECT_EQ(engine_->finish_reason().rfind(want, 0), 0u) << engine_->finish_reason();
  EXPECT_NE(engine_->finish_reason().find("the run stops after round 3"), std::string::npos);
  auto rounds = store_->Rounds();
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*rounds)[r].dp_sampling_rate, 0.5);
    EXPECT_NEAR((*rounds)[r].dp_epsilon, eps[r], 1e-9) << "round " << r + 1;
  }
}

TEST_F(PrivacyTest, UpdatesAreClippedAndTheMeanNoised) {
  config::RunConfig c = DpConfig(0, 1);
  c.mutable_privacy()->set_noise_multiplier(1e-3);  // Noise sd 1e-3 x 1 / 3 per value.
  StartDp(c);
  Register(6);
  ASSERT_EQ(FinishRound(10.0f), 3);
  ASSERT_TRUE(engine_->done());
  // Each update points along (1, ..., 1), clipped to norm 1: 1/sqrt(10)
  // per value, and so is their mean over the cohort of 3.
  const double clipped = 1 / std::sqrt(10.0);
  int exact = 0;
  for (float v : Global()) {
    EXPECT_NEAR(v, 1 + clipped, 5e-3);
    exact += std::abs(v - (1 + clipped)) < 1e-7;
  }
  EXPECT_LT(exact, 2);  // Noise was added.
  EXPECT_GT((*store_->Rounds())[0].dp_epsilon, 0);
}

// Central DP refuses no update for its length: with server.max_update_norm
// a refusal that left the round short would abort it, so whether a round
// commits would hinge on one client's update, which the released models
// show. Every update is clipped instead, and the round commits with all 3.
TEST_F(PrivacyTest, AnUpdateAboveMaxUpdateNormIsClippedNotRefused) {
  config::RunConfig c = DpConfig(0, 1);
  c.mutable_privacy()->set_noise_multiplier(1e-3);
  c.mutable_rounds()->set_min_clients(3);
  c.mutable_server()->set_max_update_norm(5);
  StartDp(c);
  Register(6);
  ASSERT_EQ(FinishRound(100.0f), 3);  // Norms of about 316 to 320.
  ASSERT_TRUE(engine_->done()) << engine_->store_error();
  auto rounds = std::move(store_->Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].outcome, "committed") << rounds[0].outcome_reason;
  EXPECT_EQ(rounds[0].participants, 3u);
  for (float v : Global()) EXPECT_NEAR(v, 1 + 1 / std::sqrt(10.0), 5e-3);
}

TEST_F(PrivacyTest, AResumedRunEndsWithTheSameModelAndEpsilon) {
  StartDp(DpConfig(0, 4));
  Register(6);
  for (int r = 1; r <= 4; ++r) ASSERT_EQ(FinishRound(0.2f), 3);
  ASSERT_TRUE(engine_->done());
  const std::vector<float> uninterrupted = Global();
  const double eps = (*store_->Rounds())[3].dp_epsilon;

  store_.reset();
  tasks_.clear();
  StartDp(DpConfig(0, 4));
  Register(6);
  for (int r = 1; r <= 2; ++r) ASSERT_EQ(FinishRound(0.2f), 3);
  engine_.reset();  // The coordinator stops; the store keeps rounds 1-2.
  tasks_.clear();
  StartDp(DpConfig(0, 4));
  Register(6);
  for (int r = 3; r <= 4; ++r) ASSERT_EQ(FinishRound(0.2f), 3);
  ASSERT_TRUE(engine_->done());
  EXPECT_EQ(Global(), uninterrupted);
  EXPECT_EQ((*store_->Rounds())[3].dp_epsilon, eps);
}

// Adaptive clipping (privacy.adaptive_clip): C starts at clip_norm and moves
// each round from the noisy count of unclipped updates.
config::RunConfig AdaptiveDpConfig(double z, double count_stddev, uint32_t rounds) {
  config::RunConfig c = DpConfig(0, rounds);
  c.mutable_privacy()->set_noise_multiplier(z);
  config::AdaptiveClipConfig* a = c.mutable_privacy()->mutable_adaptive_clip();
  a->set_target_quantile(0.5);
  a->set_learning_rate(1.0);
  a->set_clipped_count_stddev(count_stddev);
  return c;
}

// Round 1's updates are short (0.01 per value, unclipped at C = 1): with
// b̄ near 1, C shrinks by about exp(-0.5). Round 2's are long (norm
// sqrt(10) x 10 and more): clipped at that C, the mean moves the model by
// C / sqrt(10) per value. The store keeps each round's C and the next.
TEST_F(PrivacyTest, UpdatesAreClippedAtTheAdaptiveClipOfTheRound) {
  FakeEnv env;
  Start(AdaptiveDpConfig(1e-3, 0.01, 2), &env);
  engine_->SetNoiseKey(NoiseKey(9));
  Register(6);
  int sent = 0;
  for (const auto& [peer, task] : std::map<std::string, wire::RoundTask>(tasks_)) {
    if (task.round() != 1) continue;
    Deliver(peer, UpdateFor(task, std::vector<float>(kParams, 0.01f)));
    ++sent;
  }
  ASSERT_EQ(sent, 3);
  ASSERT_EQ(FinishRound(10.0f), 3);
  ASSERT_TRUE(engine_->done()) << engine_->store_error();
  auto rounds = std::move(store_->Rounds()).value();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].dp_clip_norm, 1.0);
  const double c2 = rounds[0].dp_next_clip_norm;
  EXPECT_NEAR(c2, std::exp(-0.5), 0.01);
  EXPECT_EQ(rounds[1].dp_clip_norm, c2);
  EXPECT_GT(rounds[1].dp_next_clip_norm, c2);  // All clipped: C grows again.
  const double want = 1 + 0.01 + c2 / std::sqrt(10.0);
  for (float v : Global()) EXPECT_NEAR(v, want, 5e-3);
  EXPECT_NE(env.Lines().find("round 2: privacy: clipped at C 0.60"), std::string::npos)
      << env.Lines();
  engine_.reset();  // Before `env`.
}

// Kill-and-resume (the engine stops after round 2, a new one opens the
// same store): the same model, C and ε as the run that never stopped.
TEST_F(PrivacyTest, AnAdaptiveClipResumesToTheSameModelAndClip) {
  const config::RunConfig config = AdaptiveDpConfig(1.0, 2.5, 4);
  StartDp(config);
  Register(6);
  for (int r = 1; r <= 4; ++r) ASSERT_EQ(FinishRound(0.2f), 3);
  ASSERT_TRUE(engine_->done());
  const std::vector<float> uninterrupted = Global();
  const std::vector<store::RoundRecord> straight = std::move(store_->Rounds()).value();

  store_.reset();
  tasks_.clear();
  StartDp(config);
  Register(6);
  for (int r = 1; r <= 2; ++r) ASSERT_EQ(FinishRound(0.2f), 3);
  engine_.reset();  // The coordinator stops; the store keeps rounds 1-2.
  tasks_.clear();
  StartDp(config);
  Register(6);
  for (int r = 3; r <= 4; ++r) ASSERT_EQ(FinishRound(0.2f), 3);
  ASSERT_TRUE(engine_->done());
  EXPECT_EQ(Global(), uninterrupted);
  const std::vector<store::RoundRecord> resumed = std::move(store_->Rounds()).value();
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(resumed[r].dp_clip_norm, straight[r].dp_clip_norm) << "round " << r + 1;
    EXPECT_EQ(resumed[r].dp_next_clip_norm, straight[r].dp_next_clip_norm) << "round " << r + 1;
    EXPECT_EQ(resumed[r].dp_epsilon, straight[r].dp_epsilon) << "round " << r + 1;
  }
  EXPECT_NE(straight[3].dp_clip_norm, straight[0].dp_clip_norm);  // C moved.
}

TEST_F(PrivacyTest, NoRoundStartsWithoutANoiseKey) {
  Start(DpConfig());
  Register(6);
  EXPECT_TRUE(tasks_.empty());
  EXPECT_EQ(engine_->store_error().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(engine_->store_error().message().find("privacy: no noise key"), std::string::npos);
}

}  // namespace
}  // namespace cohort::coordinator
