// cohort simulate runs the daemons' protocol (issue 11, acceptance 1): the
// same config, seed and shards give the model the coordinator and client
// daemons give over loopback, bit for bit, with plain and with secure
// aggregation; and the run store reads the same.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

struct StoredRun {
  std::vector<store::RoundRecord> rounds;
  std::vector<float> model;
};

StoredRun Load(const std::string& run_dir) {
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  return {std::move(store->Rounds()).value(), std::move(store->LatestCheckpoint()).value().model};
}

class SimulateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SimulateTest, TheSimulatorEndsWithTheDaemonsModel) {
  constexpr int kClients = 10, kRounds = 3;
  Cluster c("simulate", kClients);
  const std::string config =
      c.WriteConfig("run.textproto", kRounds, "min_clients: 10 start_clients: 10",
                    "secagg { aggregation: " + GetParam() + " }");
  const std::string endpoint = c.StartCoordinator(config, c.dir() / "daemons");
  for (int k = 0; k < kClients; ++k) c.StartClient(k, endpoint);
  ASSERT_EQ(c.coordinator().Wait(), 0) << ReadFile(c.coordinator_log());

  std::string out;
  // --devices auto: a GPU where one is usable; on a machine without one the
  // CPU, said in the log (and then the daemons' bits).
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "sim", "--shards",
                       c.dir() / "shards", "--executors", "2", "--devices", "auto"},
                      &out, c.dir() / "simulate.log"),
            0)
      << ReadFile(c.dir() / "simulate.log");
  const std::string log = ReadFile(c.dir() / "simulate.log");
  if (log.find("executor 0: no usable GPU") == std::string::npos) {
    GTEST_SKIP() << "this machine trains on a GPU: its bits are not the CPU daemons'";
  }
  EXPECT_NE(out.find("round   3/3  clients 10/10"), std::string::npos) << out;

  const StoredRun daemons = Load(c.dir() / "daemons"), sim = Load(c.dir() / "sim");
  ASSERT_EQ(sim.rounds.size(), size_t{kRounds});
  ASSERT_EQ(daemons.rounds.size(), size_t{kRounds});
  EXPECT_EQ(sim.model, daemons.model);  // Bit for bit.
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_EQ(sim.rounds[r].participants, daemons.rounds[r].participants);
    EXPECT_EQ(sim.rounds[r].aggregation, daemons.rounds[r].aggregation);
    EXPECT_EQ(sim.rounds[r].test_accuracy, daemons.rounds[r].test_accuracy);
  }
  // Training moved the model (4 classes: an untrained one scores ~0.25).
  EXPECT_GT(sim.rounds.back().test_accuracy, 0.8);
}

INSTANTIATE_TEST_SUITE_P(Aggregation, SimulateTest, ::testing::Values("PLAIN", "SECAGG_PLUS"));

// Acceptance 4: with 20 % of the clients dropping out at stages drawn from
// the seed, secure rounds still commit, and the store says who left where:
// exactly the simulator's plan, as it would for daemons.
TEST(SimulateDropoutTest, SecureRoundsCommitAndTheStoreNamesEachDropoutsStage) {
  constexpr int kClients = 20, kRounds = 4;
  Cluster c("simulate-dropout", kClients);
  const std::string config =
      c.WriteConfig("run.textproto", kRounds, "min_clients: 10 start_clients: 20",
                    "secagg { aggregation: SECAGG_PLUS }");
  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "run", "--shards",
                       c.dir() / "shards", "--dropout", "0.2", "--json"},
                      &out, c.dir() / "simulate.log"),
            0)
      << ReadFile(c.dir() / "simulate.log");
  // The plan, from the log: "round R: NAME drops out before STAGE (simulated)".
  std::map<uint32_t, std::map<std::string, std::string>> plan;
  const std::string log = ReadFile(c.dir() / "simulate.log");
  for (size_t at = log.find("drops out before"); at != std::string::npos;
       at = log.find("drops out before", at + 1)) {
    const size_t line = log.rfind("round ", at);
    const uint32_t round = std::stoul(log.substr(line + 6));
    const size_t name = log.find(": ", line) + 2;
    const size_t stage = at + std::string("drops out before ").size();
    plan[round][log.substr(name, log.find(' ', name) - name)] =
        log.substr(stage, log.find(' ', stage) - stage);
  }
  auto store = std::move(store::OpenSqliteRunStore(c.dir() / "run/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), size_t{kRounds});
  // --json: `cohort status --json`'s object per round, as each commits.
  for (int r = 1; r <= kRounds; ++r) {
    EXPECT_NE(out.find("{\"round\":" + std::to_string(r) + ",\"aggregation\":\"secagg+\""),
              std::string::npos)
        << out;
  }
  EXPECT_NE(out.find("\"dropped_by_stage\""), std::string::npos) << out;
  size_t planned = 0;
  for (const auto& r : rounds) {
    EXPECT_EQ(r.aggregation, "secagg+");
    std::map<std::string, std::string> left;
    for (const auto& cr : std::move(store->ClientRounds(r.round)).value()) {
      if (!cr.stage.empty()) left[cr.client] = cr.stage;
    }
    EXPECT_EQ(left, plan[r.round]) << "round " << r.round;
    planned += plan[r.round].size();
  }
  // About 20 % of 80 selections; the seed fixes the figure.
  EXPECT_GE(planned, 8u);
  EXPECT_LE(planned, 28u);
}

// Heterogeneity on the virtual clock: clients whose training, at their
// drawn slowness, ends after the round deadline are dropped by the engine
// as stragglers, every round, and the round takes the deadline in
// simulated time; nobody sleeps (the run takes well under a second).
TEST(SimulateStragglersTest, TheDeadlineCutsExactlyTheClientsTooSlowForIt) {
  constexpr int kClients = 10, kRounds = 2;
  Cluster c("simulate-stragglers", kClients);
  const std::string config = c.WriteConfig("run.textproto", kRounds,
                                           "min_clients: 4 start_clients: 10 round_deadline_s: 20");
  std::string out;
  ASSERT_EQ(RunCohort({"--log-level", "debug", "simulate", "--config", config, "--run-dir",
                       c.dir() / "run", "--shards", c.dir() / "shards", "--sample-ms", "100",
                       "--speed-sigma", "0.8", "--latency-ms", "20"},
                      &out, c.dir() / "simulate.log"),
            0)
      << ReadFile(c.dir() / "simulate.log");
  // "NAME: slowness S, a task's round trip takes T virtual ms"
  std::set<std::string> too_slow;
  const std::string log = ReadFile(c.dir() / "simulate.log");
  int planned = 0;
  for (size_t at = log.find("round trip takes"); at != std::string::npos;
       at = log.find("round trip takes", at + 1)) {
    const size_t name = log.rfind("client-", at);
    const double ms = std::stod(log.substr(at + std::string("round trip takes ").size()));
    if (ms > 20000) too_slow.insert(log.substr(name, 10));
    ++planned;
  }
  ASSERT_EQ(planned, kClients);
  ASSERT_FALSE(too_slow.empty()) << "the seed gave no straggler: the test shows nothing";
  ASSERT_LT(too_slow.size(), size_t{kClients - 4});
  auto store = std::move(store::OpenSqliteRunStore(c.dir() / "run/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), size_t{kRounds});
  for (const auto& r : rounds) {
    // Every selected client that is too slow is cut, and only those. (A
    // straggler still training at the next round's start is not selected.)
    std::set<std::string> dropped, selected_slow;
    for (const auto& cr : std::move(store->ClientRounds(r.round)).value()) {
      if (cr.status != "ok") dropped.insert(cr.client);
      if (too_slow.count(cr.client)) selected_slow.insert(cr.client);
    }
    EXPECT_EQ(dropped, selected_slow) << "round " << r.round;
    if (r.round == 1) {
      EXPECT_EQ(dropped, too_slow);             // Round 1 selects everyone.
      EXPECT_DOUBLE_EQ(r.clock_seconds, 20.0);  // The deadline, on the virtual clock.
    }
    EXPECT_LT(r.seconds, 5.0);  // Wall time: no one waited 20 s.
  }
  EXPECT_NE(out.find("simulated round time 20.00s"), std::string::npos) << out;
}

// The training seconds a simulated client reports are virtual time (issue
// 30): its samples x epochs x --sample-ms, whatever the executor took. With
// a slowness spread and real training on two threads, wall time would give
// every client a different, machine-dependent figure.
TEST(SimulateVirtualTimeTest, TrainingSecondsAreTheClockModelsNotTheExecutors) {
  constexpr int kClients = 4;
  Cluster c("simulate-virtual-time", kClients);
  const std::string config = c.WriteConfig("run.textproto", 1, "min_clients: 4 start_clients: 4");
  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "run", "--shards",
                       c.dir() / "shards", "--sample-ms", "10"},
                      &out, c.dir() / "simulate.log"),
            0)
      << ReadFile(c.dir() / "simulate.log");
  auto store = std::move(store::OpenSqliteRunStore(c.dir() / "run/run.db")).value();
  const auto clients = std::move(store->ClientRounds(1)).value();
  ASSERT_EQ(clients.size(), size_t{kClients});
  for (const auto& cr : clients) {
    ASSERT_EQ(cr.status, "ok") << cr.client << ": " << cr.reason;
    // One local epoch (the default), 10 virtual ms a sample.
    EXPECT_NEAR(cr.train_seconds, cr.num_samples * 0.010, 1e-4) << cr.client;
  }
}

// Link latency on the virtual clock applies to the secure stages' messages
// too, not only to the task and the update: a plain round takes one round
// trip, a secure one a round trip per stage (advertise, share, check, mask,
// sign, unmask), and nobody sleeps.
TEST(SimulateLatencyTest, ASecureRoundPaysARoundTripPerStage) {
  constexpr int kClients = 10;
  Cluster c("simulate-latency", kClients);
  std::map<std::string, double> round_seconds;
  for (const std::string agg : {"PLAIN", "SECAGG_PLUS"}) {
    const std::string config =
        c.WriteConfig(agg + ".textproto", 1, "min_clients: 10 start_clients: 10",
                      "secagg { aggregation: " + agg + " }");
    std::string out;
    ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / ("run-" + agg),
                         "--shards", c.dir() / "shards", "--latency-ms", "100"},
                        &out, c.dir() / (agg + ".log")),
              0)
        << ReadFile(c.dir() / (agg + ".log"));
    auto store = std::move(store::OpenSqliteRunStore(c.dir() / ("run-" + agg + "/run.db"))).value();
    const auto rounds = std::move(store->Rounds()).value();
    ASSERT_EQ(rounds.size(), 1u);
    EXPECT_LT(rounds[0].seconds, 5.0);  // Wall time.
    round_seconds[agg] = rounds[0].clock_seconds;
  }
  // Plain: the task down and the update up.
  EXPECT_NEAR(round_seconds["PLAIN"], 0.2, 0.05);
  // Secure: six stages of one round trip each (the masked input goes up
  // once the checked list is down), the task overlapping them.
  EXPECT_GE(round_seconds["SECAGG_PLUS"], 1.2) << round_seconds["SECAGG_PLUS"];
  EXPECT_LT(round_seconds["SECAGG_PLUS"], 2.0) << round_seconds["SECAGG_PLUS"];
  const std::string config = c.dir() / "SECAGG_PLUS.textproto";
  // The virtual time does not depend on how many executors train.
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "run-4", "--shards",
                       c.dir() / "shards", "--latency-ms", "100", "--executors", "4"},
                      nullptr, c.dir() / "four.log"),
            0)
      << ReadFile(c.dir() / "four.log");
  {
    auto store = std::move(store::OpenSqliteRunStore(c.dir() / "run-4/run.db")).value();
    EXPECT_DOUBLE_EQ(std::move(store->Rounds()).value().at(0).clock_seconds,
                     round_seconds["SECAGG_PLUS"]);
  }
  // --latency-sigma: each client its own link (from the seed); a stage
  // waits for the slowest one.
  ASSERT_EQ(RunCohort({"--log-level", "debug", "simulate", "--config", config, "--run-dir",
                       c.dir() / "run-spread", "--shards", c.dir() / "shards", "--latency-ms",
                       "100", "--latency-sigma", "0.5"},
                      nullptr, c.dir() / "spread.log"),
            0)
      << ReadFile(c.dir() / "spread.log");
  const std::string log = ReadFile(c.dir() / "spread.log");
  std::set<long> latencies;
  for (size_t at = log.find(", latency "); at != std::string::npos;
       at = log.find(", latency ", at + 1)) {
    latencies.insert(std::stol(log.substr(at + 10)));
  }
  ASSERT_EQ(latencies.size(), size_t{kClients}) << log;  // All different.
  auto store = std::move(store::OpenSqliteRunStore(c.dir() / "run-spread/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  // At least four stages wait for the slowest link both ways (the last ones
  // may close on the shares they need); above the uniform links' round.
  EXPECT_GE(rounds[0].clock_seconds, 8 * *latencies.rbegin() / 1000.0)
      << "slowest link " << *latencies.rbegin() << " ms";
  EXPECT_GT(rounds[0].clock_seconds, round_seconds["SECAGG_PLUS"]);
}

// Availability on the virtual clock: clients go offline and come back in
// spells drawn from the seed; an offline client is timed out and not
// selected, and registers again when back. Rounds go on with whoever is
// online, and the same seed gives the same run.
TEST(SimulateAvailabilityTest, RoundsGoOnWithWhoeverIsOnline) {
  constexpr int kClients = 20, kRounds = 8;
  Cluster c("simulate-availability", kClients);
  const std::string config =
      c.WriteConfig("run.textproto", kRounds,
                    "min_clients: 3 start_clients: 5 round_deadline_s: 5 client_timeout_s: 2");
  auto run = [&](const std::string& name) {
    EXPECT_EQ(RunCohort({"--log-level", "debug", "simulate", "--config", config, "--run-dir",
                         c.dir() / name, "--shards", c.dir() / "shards", "--sample-ms", "20",
                         "--availability", "0.6", "--availability-period-s", "6"},
                        nullptr, c.dir() / (name + ".log")),
              0)
        << ReadFile(c.dir() / (name + ".log"));
    auto store = std::move(store::OpenSqliteRunStore(c.dir() / (name + "/run.db"))).value();
    std::vector<std::pair<uint32_t, uint32_t>> rounds;  // Selected, participants.
    for (const auto& r : std::move(store->Rounds()).value()) {
      rounds.emplace_back(r.selected, r.participants);
    }
    return rounds;
  };
  const auto first = run("a");
  ASSERT_EQ(first.size(), size_t{kRounds});
  const std::string log = ReadFile(c.dir() / "a.log");
  EXPECT_NE(log.find("offline at"), std::string::npos);
  EXPECT_NE(log.find("online at"), std::string::npos);
  bool fewer = false;
  for (const auto& [selected, participants] : first) {
    EXPECT_GE(participants, 3u);
    fewer = fewer || selected < uint32_t{kClients};
  }
  EXPECT_TRUE(fewer) << "nobody was ever offline at a selection: the test shows nothing";
  EXPECT_EQ(run("b"), first);  // From the seed.
}

// data.partition: the simulator splits the data in memory exactly as
// `cohort partition` splits it into shards (same names, rows, test set),
// so both runs end with the same model.
TEST(SimulateInMemoryTest, SplittingInMemoryTrainsWhatTheShardsTrain) {
  Cluster c("simulate-memsplit", 10);  // Shards: synthetic 1200 + 400, 20 features, seed 3.
  const std::string shard_config =
      c.WriteConfig("shards.textproto", 2, "min_clients: 10 start_clients: 10");
  const std::string split_config = c.dir() / "split.textproto";
  WriteFile(split_config,
            "seed: 5\n"
            "data { partition { format: \"synthetic\" samples: 1200 test_samples: 400 "
            "features: 20 classes: 4 clients: 10 scheme: \"iid\" seed: 3 } }\n"
            "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
            "train { batch_size: 16 learning_rate: 0.05 }\n"
            "net { heartbeat_s: 0.5 }\n"
            "rounds { num_rounds: 2 min_clients: 10 start_clients: 10 }\n"
            "secagg { aggregation: PLAIN }\n");
  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", shard_config, "--run-dir", c.dir() / "a", "--shards",
                       c.dir() / "shards"},
                      &out, c.dir() / "a.log"),
            0)
      << ReadFile(c.dir() / "a.log");
  ASSERT_EQ(RunCohort({"simulate", "--config", split_config, "--run-dir", c.dir() / "b"}, &out,
                      c.dir() / "b.log"),
            0)
      << ReadFile(c.dir() / "b.log");
  const StoredRun a = Load(c.dir() / "a"), b = Load(c.dir() / "b");
  EXPECT_EQ(a.model, b.model);
  ASSERT_EQ(b.rounds.size(), 2u);
  EXPECT_EQ(a.rounds.back().test_accuracy, b.rounds.back().test_accuracy);  // Same test set.
  EXPECT_GT(b.rounds.back().test_accuracy, 0.8);
}

// Bad input stops a simulation before it starts, with an error that names
// what was wrong.
// The spelling of the options: clients per round, CPU threads, and
// every GPU (here none: the CPU, said in the log).
TEST(SimulateOptionsTest, PerRoundThreadsAndAllDevices) {
  Cluster c("simulate-options", 6);
  const std::string config =
      c.WriteConfig("run.textproto", 2, "min_clients: 2 start_clients: 6 fraction: 1.0");
  std::string out;
  ASSERT_EQ(
      RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "run", "--shards",
                 c.dir() / "shards", "--per-round", "4", "--threads", "2", "--devices", "all"},
                &out, c.dir() / "sim.log"),
      0)
      << ReadFile(c.dir() / "sim.log");
  const std::string log = ReadFile(c.dir() / "sim.log");
  if (log.find("--devices all: ") == std::string::npos) {
    GTEST_SKIP() << "this machine has a GPU";
  }
  EXPECT_NE(log.find("(2 executors on cpu)"), std::string::npos) << log;
  EXPECT_NE(out.find("round   1/2  clients 4/4"), std::string::npos) << out;
  EXPECT_NE(out.find("round   2/2  clients 4/4"), std::string::npos) << out;
}

TEST(SimulateBadInputTest, EachMistakeIsNamed) {
  Cluster c("simulate-bad", 3);
  const std::string config = c.WriteConfig("run.textproto", 1, "min_clients: 3 start_clients: 3");
  const std::string big = c.WriteConfig("big.textproto", 1, "min_clients: 5 start_clients: 5");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"--config", config, "--run-dir", c.dir() / "r1", "--shards", c.dir() / "nowhere"},
       "nowhere"},
      {{"--config", config, "--run-dir", c.dir() / "r2"}, "give --shards DIR, or a data.partition"},
      {{"--config", big, "--run-dir", c.dir() / "r3", "--shards", c.dir() / "shards"},
       "needs 5 clients to start a round"},
      {{"--config", config, "--run-dir", c.dir() / "r4", "--shards", c.dir() / "shards",
        "--dropout", "1.5"},
       "--dropout"},
      {{"--config", config, "--run-dir", c.dir() / "r5", "--shards", c.dir() / "shards",
        "--executors", "0"},
       "--executors"},
      {{"--config", config, "--run-dir", c.dir() / "r6", "--shards", c.dir() / "shards",
        "--devices", "tpu:3"},
       "--devices tpu:3"},
      {{"--config", config, "--run-dir", c.dir() / "r7", "--shards", c.dir() / "shards",
        "--latency-ms", "1e9"},
       "--latency-ms in [0, 86400000]"},
      {{"--config", config, "--run-dir", c.dir() / "r8", "--shards", c.dir() / "shards",
        "--per-round", "2"},
       "--per-round"},
      {{"--config", config, "--run-dir", c.dir() / "r9", "--shards", c.dir() / "shards",
        "--devices", "cuda:0,x"},
       "--devices x"},
      {{"--config", config, "--run-dir", c.dir() / "r10", "--shards", c.dir() / "shards",
        "--fault-misbehave", "sign_flip"},
       "simulate: --fault-misbehave and --fault-misbehave-fraction go together"},
      {{"--config", config, "--run-dir", c.dir() / "r11", "--shards", c.dir() / "shards",
        "--fault-misbehave", "flip", "--fault-misbehave-fraction", "0.2"},
       "simulate: --fault-misbehave: unknown behaviour \"flip\""},
      {{"--config", config, "--run-dir", c.dir() / "r12", "--shards", c.dir() / "shards",
        "--fault-misbehave", "scale10", "--fault-misbehave-fraction", "2"},
       "simulate: --fault-misbehave-fraction must be in [0, 1]"},
  };
  int n = 0;
  for (const Case& k : cases) {
    std::vector<std::string> args = {"simulate"};
    args.insert(args.end(), k.args.begin(), k.args.end());
    std::string out;
    const std::string log = c.dir() / ("bad-" + std::to_string(n++) + ".log");
    EXPECT_NE(RunCohort(args, &out, log), 0) << k.says;
    EXPECT_NE((ReadFile(log) + out).find(k.says), std::string::npos) << ReadFile(log) << out;
  }
}

// Hostile input that used to hang or abort a simulation (issue 29): each
// now ends it at once with an error naming the flag or file. Bounded waits:
// before, these ran forever.
class SimulateHostileInputTest : public ::testing::Test {
 protected:
  SimulateHostileInputTest() : c_("simulate-hostile", 3) {}
  // Runs `cohort simulate ARGS` (after `prefix`, e.g. prlimit) with the
  // cluster's shards; expects exit code 1 within a minute and `says` in
  // its log.
  void ExpectRefused(const std::vector<std::string>& args, const std::string& says,
                     const std::vector<std::string>& prefix = {}) {
    std::vector<std::string> argv = prefix;
    const std::string run = "refused-" + std::to_string(runs_++);
    argv.insert(argv.end(), {CohortBin(), "simulate", "--run-dir", c_.dir() / run, "--shards",
                             c_.dir() / "shards"});
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = c_.dir() / (run + ".log");
    Process sim(argv, log);
    EXPECT_EQ(sim.Wait(std::chrono::seconds(60)), 1) << "still running, or not refused: " << says;
    EXPECT_NE(ReadFile(log).find(says), std::string::npos) << ReadFile(log);
  }
  Cluster c_;
  int runs_ = 0;
};

// A FIFO named like a shard blocked the simulator in its open for ever.
TEST_F(SimulateHostileInputTest, AFifoAmongTheShardsIsNamed) {
  const std::string config = c_.WriteConfig("run.textproto", 1, "min_clients: 3 start_clients: 3");
  const std::string fifo = c_.dir() / "shards/client-003.shard";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectRefused({"--config", config}, fifo + ": is a FIFO (named pipe), not a regular file");
}

// --availability 1e-300 was accepted and the run never ended: no round
// ever found its clients online at once.
TEST_F(SimulateHostileInputTest, AvailabilityThatCannotFinishIsRefused) {
  const std::string config = c_.WriteConfig("run.textproto", 1, "min_clients: 3 start_clients: 3");
  ExpectRefused({"--config", config, "--availability", "1e-300"},
                "simulate: --availability 1e-300 cannot finish: on average 3e-300 of the 3 "
                "clients would be online, and a round needs 3 at once (rounds.start_clients, "
                "min_clients); use at least 1");
  const std::string one = c_.WriteConfig("one.textproto", 1, "min_clients: 1 start_clients: 1");
  ExpectRefused(
      {"--config", one, "--availability", "0.5", "--availability-period-s", "1"},
      "simulate: --availability 0.5 cannot finish: online spells would average 0.5 s "
      "of --availability-period-s 1, under the 1 s a round trip needs; use at least 1 or a longer "
      "--availability-period-s");
}

// 1024 executors under a 6 GiB address space (8 MiB thread stacks): the
// threads do not fit, and the process aborted on std::system_error.
TEST_F(SimulateHostileInputTest, ExecutorsBeyondTheProcessLimitsAreAnError) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the cap allows";
#endif
  if (!std::filesystem::exists("/usr/bin/prlimit")) GTEST_SKIP() << "no /usr/bin/prlimit";
  const std::string config = c_.WriteConfig("run.textproto", 1, "min_clients: 3 start_clients: 3");
  ExpectRefused({"--config", config, "--executors", "1024"},
                "simulate: --executors 1024: could not start executor ",
                {"/usr/bin/prlimit", "--as=" + std::to_string(uint64_t{6} << 30),
                 "--stack=" + std::to_string(8 << 20)});
}

// Memory does not grow with the clients of a round: 300 clients of an
// 800 KB model (one copy each would be 240 MB) in a process that stays
// under 120 MB at its peak (about 40 MB measured).
TEST(SimulateMemoryTest, ARoundHoldsAFewModelsNotOnePerClient) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "peak RSS means nothing under AddressSanitizer (shadow memory, quarantine)";
#endif
  constexpr int kClients = 300;
  Cluster c("simulate-memory", kClients);
  c.set_hidden_units(8192);  // 20-8192-4: 204,804 parameters.
  const std::string config =
      c.WriteConfig("run.textproto", 2, "min_clients: 300 start_clients: 300");
  // With client speeds on the virtual clock too: results then come out of
  // order and must not pile up either.
  Process sim({CohortBin(), "--log-level", "warn", "simulate", "--config", config, "--run-dir",
               c.dir() / "run", "--shards", c.dir() / "shards", "--executors", "2", "--sample-ms",
               "10", "--speed-sigma", "0.5"},
              c.dir() / "simulate.log");
  ASSERT_EQ(sim.Wait(), 0) << ReadFile(c.dir() / "simulate.log");
  ASSERT_TRUE(sim.peak_rss_bytes().has_value());
  std::printf("peak RSS of a 300-client round: %zu MB\n", *sim.peak_rss_bytes() >> 20);
  EXPECT_LT(*sim.peak_rss_bytes(), size_t{120} << 20);
  auto store = std::move(store::OpenSqliteRunStore(c.dir() / "run/run.db")).value();
  EXPECT_EQ(std::move(store->Rounds()).value().back().participants, uint32_t{kClients});
}

}  // namespace
}  // namespace cohort::testing
