// Acceptance: a coordinator SIGKILLed after round 3 of 6 restarts from its
// run directory, the run completes, and the final model is bit-identical to
// an uninterrupted run with the same seed, with plain and with secure
// aggregation (masks cancel exactly and the fixed-point rounding is seeded),
// with server momentum (the velocity is checkpointed and restored), with
// the adaptive server optimizers (m and v, twice the model's size), and with
// a robust rule.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

store::Checkpoint FinalCheckpoint(const std::string& run_dir) {
  auto store = store::OpenSqliteRunStore(run_dir + "/run.db");
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return {};
  auto cp = (*store)->LatestCheckpoint();
  EXPECT_TRUE(cp.ok()) << cp.status();
  return cp.ok() ? *std::move(cp) : store::Checkpoint{};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // Empty vectors (no momentum, no velocity) have no data() to compare.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Variant {
  std::string name;
  std::string aggregation;  // secagg.aggregation
  std::string server;       // The server section's fields.
  size_t state_models;      // The server state's size, in model sizes.
};

class ResumeTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ResumeTest, KilledCoordinatorResumesToTheBitIdenticalModel) {
  Cluster cluster("resume", 3);
  const Variant& v = GetParam();
  const std::string config = cluster.WriteConfig(
      "run.textproto", 6, "min_clients: 3 start_clients: 3",
      "secagg { aggregation: " + v.aggregation + " }\nserver { " + v.server + " }");

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
  // Round 3 was committed before the kill; a later one may have been too
  // (the kill races the next commit), never all six.
  const std::string log = ReadFile(cluster.coordinator_log());
  const std::string resuming = "resuming run after committed round ";
  const size_t at = log.find(resuming);
  ASSERT_NE(at, std::string::npos) << log;
  const int committed = std::atoi(log.c_str() + at + resuming.size());
  EXPECT_GE(committed, 3) << log;
  EXPECT_LT(committed, 6) << log;

  const store::Checkpoint reference = FinalCheckpoint(ref_dir);
  const store::Checkpoint resumed = FinalCheckpoint(run_dir);
  EXPECT_EQ(reference.round, 6u);
  EXPECT_EQ(resumed.round, 6u);
  ASSERT_FALSE(reference.model.empty());
  for (float x : reference.model) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(SameBits(reference.model, resumed.model))
      << "resumed model differs from the uninterrupted one";
  // With momentum or an adaptive optimizer the server state is part of
  // the checkpoint too.
  EXPECT_EQ(reference.velocity.size(), v.state_models * reference.model.size());
  EXPECT_TRUE(SameBits(reference.velocity, resumed.velocity))
      << "resumed server velocity differs from the uninterrupted one";
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  const auto rounds = std::move(store->Rounds()).value();
  EXPECT_EQ(rounds.size(), 6u);
  EXPECT_EQ(rounds.back().aggregation, v.aggregation == "PLAIN" ? "plain" : "secagg+");
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ResumeTest,
    ::testing::Values(Variant{"Plain", "PLAIN", "", 0}, Variant{"SecAggPlus", "SECAGG_PLUS", "", 0},
                      Variant{"PlainWithServerMomentum", "PLAIN", "momentum: 0.9", 1},
                      Variant{"PlainWithFedAdam", "PLAIN", "optimizer: FEDADAM learning_rate: 0.05",
                              2},
                      Variant{"SecAggPlusWithFedYogi", "SECAGG_PLUS",
                              "optimizer: FEDYOGI learning_rate: 0.01", 2},
                      Variant{"PlainWithTheMedian", "PLAIN", "robust { rule: MEDIAN }", 0}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cohort::testing
