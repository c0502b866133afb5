// Distributed DP's client ledger end to end (docs/privacy.md, "Repeated
// rounds"): an honest coordinator runs a round again under its number only
// when it restarts before that round's commit. The clients noised it before
// the crash, and their ledgers (--state-dir) outlive it: each refuses the
// replay as a dropout, saying why, the round aborts, and the run goes on
// with the next rounds and finishes.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <stdexcept>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kClients = 4;
constexpr uint32_t kRounds = 4;
constexpr uint32_t kKilledRound = 2;

TEST(DpRepeatTest, ARoundReplayedAfterACoordinatorCrashIsRefusedAndTheRunFinishes) {
  Cluster cluster("dp-repeat", kClients);
  cluster.EnableCurve({0, 1, 2, 3});  // The run is named by the pinned coordinator key too.
  const std::string config = cluster.WriteConfig(
      "run.textproto", kRounds, "min_clients: 3 start_clients: 4 max_clients_per_round: 4",
      "secagg { aggregation: SECAGG_PLUS }\n"
      "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1.0 clip_norm: 1.0 }");
  const std::string run_dir = cluster.dir() / "run";
  // Killed inside round 2's commit: the clients' noised inputs were unmasked.
  setenv("COHORT_FAULT_KILL_IN_COMMIT", std::to_string(kKilledRound).c_str(), 1);
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  for (int k = 0; k < kClients; ++k) {
    cluster.StartClient(k, endpoint,
                        {"--state-dir", cluster.dir() / ("state-" + std::to_string(k))});
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 128 + SIGKILL) << ReadFile(cluster.coordinator_log());

  cluster.StartCoordinator(config, run_dir, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < kClients; ++k) {
    EXPECT_EQ(cluster.client(k).Wait(), 0) << ReadFile(cluster.client_log(k));
    const std::string log = ReadFile(cluster.client_log(k));
    EXPECT_NE(log.find("round 2: already contributed a noised update to round 2 of run run: "
                       "refusing a repeat, which would let the coordinator average away the "
                       "noise; leaving the round"),
              std::string::npos)
        << log;
  }
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), kRounds);
  EXPECT_EQ(rounds[0].outcome, "committed");
  EXPECT_EQ(rounds[1].outcome, "aborted");  // The replay: every client refused it.
  EXPECT_EQ(rounds[1].participants, 0u);
  EXPECT_EQ(rounds[2].outcome, "committed") << rounds[2].outcome_reason;
  EXPECT_EQ(rounds[3].outcome, "committed") << rounds[3].outcome_reason;
  EXPECT_EQ(rounds[3].participants, 4u);
  for (const auto& c : std::move(store->ClientRounds(kKilledRound)).value()) {
    EXPECT_EQ(c.status, "dropped");
    EXPECT_NE(c.reason.find("already contributed a noised update to round 2"), std::string::npos)
        << c.reason;
  }
}

// The ledger binds a round to the run's nonce (Welcome.run_nonce), drawn
// when the run is created: a new run with the same coordinator key and the
// same name (the default, "run") is a new run to the clients, whose
// ledgers already hold its round numbers from the last one.
TEST(DpRepeatTest, ANewRunWithTheSameKeyAndNameIsNotRefused) {
  Cluster cluster("dp-new-run", kClients);
  cluster.EnableCurve({0, 1, 2, 3});
  const std::string config = cluster.WriteConfig(
      "run.textproto", 2, "min_clients: 3 start_clients: 4 max_clients_per_round: 4",
      "secagg { aggregation: SECAGG_PLUS }\n"
      "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1.0 clip_norm: 1.0 }");
  for (const char* run : {"first", "second"}) {
    const std::string run_dir = cluster.dir() / run;
    const std::string endpoint = cluster.StartCoordinator(config, run_dir);
    for (int k = 0; k < kClients; ++k) {
      cluster.StartClient(k, endpoint,
                          {"--state-dir", cluster.dir() / ("state-" + std::to_string(k))});
    }
    ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
    for (int k = 0; k < kClients; ++k) {
      EXPECT_EQ(cluster.client(k).Wait(), 0) << ReadFile(cluster.client_log(k));
      const std::string log = ReadFile(cluster.client_log(k));
      EXPECT_EQ(log.find("already contributed"), std::string::npos) << run << ": " << log;
    }
    auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
    for (const auto& r : std::move(store->Rounds()).value()) {
      EXPECT_EQ(r.outcome, "committed") << run << ": round " << r.round << ": " << r.outcome_reason;
      EXPECT_EQ(r.participants, 4u) << run << ": round " << r.round;
    }
  }
}

// --dp-noise-multiplier pins the noise a client insists on: a run noised at
// 1 is refused, every round, by a client that asks for 2, with the numbers;
// the clients that ask for 1 carry the rounds.
TEST(DpRepeatTest, AClientPinnedToMoreNoiseRefusesEveryRoundAndTheOthersFinish) {
  Cluster cluster("dp-pin", 6);
  const std::string config = cluster.WriteConfig(
      "run.textproto", 2, "min_clients: 4 start_clients: 6 max_clients_per_round: 6",
      "secagg { aggregation: SECAGG_PLUS }\n"
      "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1.0 clip_norm: 1.0 }");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 6; ++k) {
    cluster.StartClient(k, endpoint, {"--dp-noise-multiplier", k == 5 ? "2" : "1"});
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(cluster.client(k).Wait(), 0) << ReadFile(cluster.client_log(k));
  }
  const std::string log = ReadFile(cluster.client_log(5));
  EXPECT_NE(log.find("is smaller than the 16 survivors this round's noise share assumes"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("this client's noise multiplier 2 needs"), std::string::npos) << log;
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 2u);
  for (const auto& r : rounds) {
    EXPECT_EQ(r.outcome, "committed") << r.outcome_reason;
    EXPECT_EQ(r.participants, 5u);
  }
}

// cohort client --dp-max-rounds 2: each client noises two rounds, then
// leaves every later one as a dropout saying why; the third round aborts.
TEST(DpRepeatTest, ClientsCappedAtTwoNoisedRoundsLeaveTheThird) {
  Cluster cluster("dp-cap", kClients);
  const std::string config = cluster.WriteConfig(
      "run.textproto", 3, "min_clients: 3 start_clients: 4 max_clients_per_round: 4",
      "secagg { aggregation: SECAGG_PLUS }\n"
      "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1.0 clip_norm: 1.0 }");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < kClients; ++k) {
    cluster.StartClient(
        k, endpoint,
        {"--state-dir", cluster.dir() / ("state-" + std::to_string(k)), "--dp-max-rounds", "2"});
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  const std::string refusal =
      "this client has noised 2 updates, the most --dp-max-rounds allows: refusing round 3 of "
      "run run";
  for (int k = 0; k < kClients; ++k) {
    EXPECT_EQ(cluster.client(k).Wait(), 0) << ReadFile(cluster.client_log(k));
    const std::string log = ReadFile(cluster.client_log(k));
    EXPECT_NE(log.find(refusal), std::string::npos) << log;
  }
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_EQ(rounds[0].participants, 4u);
  EXPECT_EQ(rounds[1].participants, 4u);
  EXPECT_EQ(rounds[2].outcome, "aborted");
  for (const auto& c : std::move(store->ClientRounds(3)).value()) {
    EXPECT_NE(c.reason.find(refusal), std::string::npos) << c.reason;
  }
}

// The cap counts in --state-dir's ledger: without one it would start
// again at every restart, so the flag needs it.
TEST(DpRepeatTest, AMaxRoundsCapWithoutAStateDirectoryIsAFlagError) {
  Cluster cluster("dp-cap-flag", 1);
  cluster.StartClient(0, "tcp://127.0.0.1:1", {"--dp-max-rounds", "2"});
  EXPECT_NE(cluster.client(0).Wait(), 0);
  EXPECT_NE(ReadFile(cluster.client_log(0)).find("--dp-max-rounds requires --state-dir"),
            std::string::npos)
      << ReadFile(cluster.client_log(0));
}

TEST(DpRepeatTest, ANegativeNoiseMultiplierIsAFlagError) {
  Cluster cluster("dp-pin-flag", 1);
  cluster.StartClient(0, "tcp://127.0.0.1:1", {"--dp-noise-multiplier", "-1"});
  EXPECT_NE(cluster.client(0).Wait(), 0);
  EXPECT_NE(ReadFile(cluster.client_log(0)).find("--dp-noise-multiplier"), std::string::npos)
      << ReadFile(cluster.client_log(0));
}

// Label counts go to the coordinator in the clear; a client pinned to
// distributed DP does not trust it with them.
TEST(DpRepeatTest, LabelCountsWithAPinnedNoiseMultiplierIsAFlagError) {
  Cluster cluster("dp-labels-flag", 1);
  cluster.StartClient(0, "tcp://127.0.0.1:1",
                      {"--dp-noise-multiplier", "1", "--share-label-counts"});
  EXPECT_NE(cluster.client(0).Wait(), 0);
  EXPECT_NE(ReadFile(cluster.client_log(0))
                .find("--share-label-counts with --dp-noise-multiplier: the label counts would "
                      "reach the coordinator in the clear, and distributed DP does not trust it "
                      "with this client's data"),
            std::string::npos)
      << ReadFile(cluster.client_log(0));
}

}  // namespace
}  // namespace cohort::testing
