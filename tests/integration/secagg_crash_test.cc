// Acceptance: the coordinator is SIGKILLed in the middle of a secure round
// while one client has gone silent at a SecAgg stage. Restarted, it replays
// the round with the same cohort; the client goes silent at the same stage
// again (its fault plan is by round), the round completes without it at
// that stage, and the final model is bit-identical to an uninterrupted run
// with the same fault: the masks differ between the two tries but cancel,
// and each input's fixed-point rounding is seeded by round and client.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kClients = 5;
constexpr int kSilent = 4;  // client-004
// One round: the fault is in the last round, so no later cohort depends on
// when the silent client is heard from again; and the replay is the first
// task of each coordinator lifetime, so task ids that repeated across
// restarts would make the clients ignore it as a duplicate.
constexpr uint32_t kRounds = 1;

struct StageCase {
  std::string stage;
  bool counted;  // Its masked input is in the sum.
};

class SecAggCrashTest : public ::testing::TestWithParam<StageCase> {};

// Runs the cluster to the end; if `kill`, SIGKILLs the coordinator once the
// silent client has paused, and restarts it. Returns the run directory.
std::string RunToTheEnd(Cluster& cluster, const std::string& config, const StageCase& c,
                        const std::string& tag, bool kill) {
  const std::string run_dir = cluster.dir() / tag;
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  const std::string paused = "paused before " + c.stage + " of round " + std::to_string(kRounds);
  for (int k = 0; k < kClients; ++k) {
    cluster.StartClient(k, endpoint,
                        k == kSilent
                            ? std::vector<std::string>{"--fault-stop-before",
                                                       c.stage + ":" + std::to_string(kRounds)}
                            : std::vector<std::string>{});
  }
  // The coordinator is now inside that stage, waiting for this client.
  EXPECT_TRUE(cluster.client(kSilent).WaitForLine(paused));
  if (kill) {
    cluster.KillCoordinator();
    EXPECT_EQ(cluster.coordinator().Wait(), 128 + SIGKILL);
    cluster.StartCoordinator(config, run_dir, endpoint);
    // The replayed round (same cohort: start_clients is all five) meets the
    // same fault: the client pauses a second time.
    EXPECT_TRUE(cluster.client(kSilent).WaitForLine(paused));
  }
  EXPECT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  // Every client, the silent one too (dropped from the last round but
  // alive), hears Finished and exits cleanly.
  for (int k = 0; k < kClients; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
  if (kill) {
    EXPECT_NE(ReadFile(cluster.coordinator_log())
                  .find("resuming run after committed round " + std::to_string(kRounds - 1)),
              std::string::npos);
  }
  return run_dir;
}

TEST_P(SecAggCrashTest, KilledDuringAStageWithADropoutResumesToTheBitIdenticalModel) {
  const StageCase& c = GetParam();
  Cluster cluster("secagg-crash", kClients);
  // SecAgg+ (complete graph at n = 5, t = 3).
  const std::string config = cluster.WriteConfig(
      "run.textproto", kRounds, "min_clients: 3 start_clients: 5 round_deadline_s: 3",
      "secagg { stage_timeout_s: 1.5 }");
  const std::string ref_dir = RunToTheEnd(cluster, config, c, "ref", false);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string run_dir = RunToTheEnd(cluster, config, c, "crash", true);

  auto ref_store =
      OrThrow(store::OpenSqliteRunStore(ref_dir + "/run.db"), "open " + ref_dir + "/run.db");
  auto store =
      OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open " + run_dir + "/run.db");
  const auto reference = OrThrow(ref_store->LatestCheckpoint(), "ref_store LatestCheckpoint");
  const auto resumed = OrThrow(store->LatestCheckpoint(), "store LatestCheckpoint");
  EXPECT_EQ(resumed.round, kRounds);
  ASSERT_EQ(reference.model.size(), resumed.model.size());
  for (float v : resumed.model) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(std::memcmp(reference.model.data(), resumed.model.data(),
                        reference.model.size() * sizeof(float)),
            0)
      << "resumed model differs from the uninterrupted one";

  const auto rounds = OrThrow(store->Rounds(), "store Rounds");
  ASSERT_EQ(rounds.size(), kRounds);
  for (const auto& r : rounds) {
    EXPECT_EQ(r.aggregation, "secagg+");
    EXPECT_EQ(r.outcome, "committed") << "round " << r.round;
  }
  EXPECT_EQ(rounds.back().participants, c.counted ? 5u : 4u);
  bool found = false;
  for (const auto& cr : OrThrow(store->ClientRounds(kRounds), "store ClientRounds")) {
    if (cr.client != ClientName(kSilent)) {
      EXPECT_EQ(cr.stage, "") << cr.client;
      continue;
    }
    found = true;
    EXPECT_EQ(cr.stage, c.stage);
    EXPECT_EQ(cr.status, c.counted ? "ok" : "dropped");
  }
  EXPECT_TRUE(found);
  // `cohort status --json` names the client under its stage: a dropout in
  // dropped_by_stage, a client whose input counted in left_after_input.
  std::string out;
  ASSERT_EQ(
      RunCohort({"status", "--run-dir", run_dir, "--json"}, &out, cluster.dir() / "status.log"), 0);
  const std::string named = c.counted
                                ? "\"left_after_input\":[{\"client\":\"" + ClientName(kSilent) +
                                      "\",\"stage\":\"" + c.stage + "\"}]"
                                : "\"" + c.stage + "\":[\"" + ClientName(kSilent) + "\"]";
  EXPECT_NE(out.find(named), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Stages, SecAggCrashTest,
                         ::testing::Values(StageCase{"masked_input", false},
                                           StageCase{"unmasking", true}),
                         [](const auto& info) { return info.param.stage; });

}  // namespace
}  // namespace cohort::testing
