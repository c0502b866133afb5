// Acceptance: a coordinator SIGKILLed after round 3 of 6 restarts from its
// run directory, the run completes, and the final model is bit-identical to
// an uninterrupted run with the same seed, with plain and with secure
// aggregation (masks cancel exactly and the fixed-point rounding is seeded).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>

#include "coordinator/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

std::vector<float> FinalModel(const std::string& run_dir, uint32_t* round) {
  auto store = coordinator::OpenSqliteRunStore(run_dir + "/run.db");
  EXPECT_TRUE(store.ok()) << store.status();
  auto cp = (*store)->LatestCheckpoint();
  EXPECT_TRUE(cp.ok()) << cp.status();
  *round = cp->round;
  return cp->model;
}

class ResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeTest, KilledCoordinatorResumesToTheBitIdenticalModel) {
  Cluster cluster("resume", 3);
  const std::string config =
      cluster.WriteConfig("run.textproto", 6, "min_clients: 3 start_clients: 3",
                          "secagg { aggregation: " + GetParam() + " }");

  // Reference: an uninterrupted run.
  const std::string ref_dir = cluster.dir() / "ref";
  std::string endpoint = cluster.StartCoordinator(config, ref_dir);
  for (int k = 0; k < 3; ++k) cluster.StartClient(k, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 3; ++k) ASSERT_EQ(cluster.client(k).Wait(), 0);

  // The same run, killed with SIGKILL once round 3 is committed.
  const std::string run_dir = cluster.dir() / "crash";
  endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 3; ++k) cluster.StartClient(k, endpoint);
  ASSERT_TRUE(cluster.coordinator().WaitForLine("round   3/6"));
  cluster.KillCoordinator();
  EXPECT_EQ(cluster.coordinator().Wait(), 128 + SIGKILL);

  // Restart on the same endpoint: the clients reconnect by themselves.
  cluster.StartCoordinator(config, run_dir, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
  EXPECT_NE(ReadFile(cluster.coordinator_log()).find("resuming run after committed round 3"),
            std::string::npos);

  uint32_t ref_round = 0, round = 0;
  const std::vector<float> reference = FinalModel(ref_dir, &ref_round);
  const std::vector<float> resumed = FinalModel(run_dir, &round);
  EXPECT_EQ(ref_round, 6u);
  EXPECT_EQ(round, 6u);
  ASSERT_EQ(reference.size(), resumed.size());
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(std::memcmp(reference.data(), resumed.data(), reference.size() * sizeof(float)), 0)
      << "resumed model differs from the uninterrupted one";
  auto store = std::move(coordinator::OpenSqliteRunStore(run_dir + "/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  EXPECT_EQ(rounds.size(), 6u);
  EXPECT_EQ(rounds.back().aggregation, GetParam() == "PLAIN" ? "plain" : "secagg+");
}

INSTANTIATE_TEST_SUITE_P(Aggregation, ResumeTest, ::testing::Values("PLAIN", "SECAGG_PLUS"));

}  // namespace
}  // namespace cohort::testing
