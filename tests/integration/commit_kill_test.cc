// Acceptance: a coordinator killed inside a round's commit transaction (the
// run store's COHORT_FAULT_KILL_IN_COMMIT hook: rows written and flushed to
// the WAL, no COMMIT) loses that round as a whole. Restarted, it resumes
// after the previous round, replays the lost one, and ends with the model
// and server velocity of an uninterrupted run, bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kClients = 3;
constexpr uint32_t kRounds = 5;
constexpr uint32_t kKilledRound = 3;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CommitKillTest, KillInsideTheCommitReplaysTheRoundToTheBitIdenticalModel) {
  Cluster cluster("commit-kill", kClients);
  // Server momentum on, so the velocity must survive the crash as well.
  const std::string config =
      cluster.WriteConfig("run.textproto", kRounds, "min_clients: 3 start_clients: 3",
                          "secagg { aggregation: PLAIN }\nserver { momentum: 0.5 }");

  const std::string ref_dir = cluster.dir() / "ref";
  std::string endpoint = cluster.StartCoordinator(config, ref_dir);
  for (int k = 0; k < kClients; ++k) cluster.StartClient(k, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < kClients; ++k) ASSERT_EQ(cluster.client(k).Wait(), 0) << "client " << k;

  // Only the coordinator gets the hook: the environment is copied at spawn.
  const std::string run_dir = cluster.dir() / "crash";
  setenv("COHORT_FAULT_KILL_IN_COMMIT", std::to_string(kKilledRound).c_str(), 1);
  endpoint = cluster.StartCoordinator(config, run_dir);
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  for (int k = 0; k < kClients; ++k) cluster.StartClient(k, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 128 + SIGKILL) << ReadFile(cluster.coordinator_log());
  ASSERT_NE(ReadFile(cluster.coordinator_log()).find("SIGKILL before the commit of round 3"),
            std::string::npos)
      << ReadFile(cluster.coordinator_log());
  bool printed_2 = false, printed_3 = false;
  for (const auto& line : cluster.coordinator().lines()) {
    printed_2 |= line.find("round   2/5") != std::string::npos;
    printed_3 |= line.find("round   3/5") != std::string::npos;
  }
  EXPECT_TRUE(printed_2);
  EXPECT_FALSE(printed_3) << "round 3 was reported although its commit never finished";
  {
    // What survived the kill: rounds 1 and 2, nothing of round 3.
    auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"),
                         "open " + run_dir + "/run.db");
    EXPECT_EQ((*store->LoadRun())->last_round, kKilledRound - 1);
    EXPECT_EQ(store->Rounds()->size(), kKilledRound - 1);
    EXPECT_TRUE(store->ClientRounds(kKilledRound)->empty());
    auto cp = store->LatestCheckpoint();
    ASSERT_TRUE(cp.ok()) << cp.status();
    EXPECT_EQ(cp->round, kKilledRound - 1);
  }

  // Restart on the same endpoint: the clients reconnect by themselves.
  cluster.StartCoordinator(config, run_dir, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < kClients; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
  EXPECT_NE(ReadFile(cluster.coordinator_log()).find("resuming run after committed round 2"),
            std::string::npos);

  auto ref_store =
      OrThrow(store::OpenSqliteRunStore(ref_dir + "/run.db"), "open " + ref_dir + "/run.db");
  auto store =
      OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open " + run_dir + "/run.db");
  const auto reference = OrThrow(ref_store->LatestCheckpoint(), "ref_store LatestCheckpoint");
  const auto resumed = OrThrow(store->LatestCheckpoint(), "store LatestCheckpoint");
  EXPECT_EQ(reference.round, kRounds);
  EXPECT_EQ(resumed.round, kRounds);
  ASSERT_FALSE(reference.model.empty());
  ASSERT_EQ(reference.velocity.size(), reference.model.size());
  for (float x : reference.model) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(SameBits(reference.model, resumed.model))
      << "resumed model differs from the uninterrupted one";
  EXPECT_TRUE(SameBits(reference.velocity, resumed.velocity))
      << "resumed server velocity differs from the uninterrupted one";
  const auto rounds = OrThrow(store->Rounds(), "store Rounds");
  ASSERT_EQ(rounds.size(), kRounds);
  for (uint32_t i = 0; i < kRounds; ++i) {
    EXPECT_EQ(rounds[i].round, i + 1);
    EXPECT_EQ(rounds[i].participants, 3u) << "round " << i + 1;
  }
  // The replayed round evaluates to what the uninterrupted run recorded.
  const auto ref_rounds = OrThrow(ref_store->Rounds(), "ref_store Rounds");
  ASSERT_EQ(ref_rounds.size(), kRounds);
  EXPECT_EQ(rounds[kKilledRound - 1].test_loss, ref_rounds[kKilledRound - 1].test_loss);
}

}  // namespace
}  // namespace cohort::testing
