// Adaptive clipping end to end (privacy.adaptive_clip with central DP):
// `cohort simulate` runs DP-FedAvg whose clip norm C follows the target
// quantile of the update norms; the store keeps each round's C and the
// next, and `cohort status` shows each round's C in its clip_norm column; a
// simulation SIGKILLed inside round 3's commit resumes to the same model
// and C as one that never stopped.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "store/run_store.h"
#include "tests/integration/harness.h"

namespace cohort::testing {
namespace {

constexpr char kConfig[] =
    "seed: 5\n"
    "data { partition { format: \"synthetic\" samples: 1200 test_samples: 400 "
    "features: 20 classes: 4 clients: 10 scheme: \"iid\" seed: 3 } }\n"
    "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
    "train { batch_size: 16 learning_rate: 0.05 }\n"
    "net { heartbeat_s: 0.5 }\n"
    "rounds { num_rounds: 4 min_clients: 2 start_clients: 10 fraction: 0.5 }\n"
    "secagg { aggregation: PLAIN }\n"
    "privacy { noise_multiplier: 1.0 clip_norm: 0.01 target_delta: 1e-5\n"
    "  adaptive_clip { target_quantile: 0.5 learning_rate: 0.5 clipped_count_stddev: 0.6 } }\n";

TEST(AdaptiveClipRunTest, SimulateMovesTheClipAndStatusShowsIt) {
  TempDir dir("adaptive_clip");
  const std::string config = dir / "dp.textproto";
  WriteFile(config, kConfig);
  std::string out;
  ASSERT_EQ(
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "run"}, &out, dir / "sim.log"),
      0)
      << ReadFile(dir / "sim.log");
  const std::string log = ReadFile(dir / "sim.log");
  EXPECT_NE(log.find("round 1: privacy: clipped at C 0.01; the next round clips at "),
            std::string::npos)
      << log;
  std::vector<store::RoundRecord> rounds;
  {
    auto store = std::move(store::OpenSqliteRunStore(dir / "run/run.db")).value();
    rounds = std::move(store->Rounds()).value();
  }
  ASSERT_EQ(rounds.size(), 4u);
  // A clip of 0.01 cuts every update of a fresh MLP's epoch (b̄ near 0):
  // C grows each round, from where the last round left it.
  EXPECT_EQ(rounds[0].dp_clip_norm, 0.01);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_GT(rounds[r].dp_next_clip_norm, rounds[r].dp_clip_norm) << "round " << r + 1;
    if (r > 0) EXPECT_EQ(rounds[r].dp_clip_norm, rounds[r - 1].dp_next_clip_norm);
  }

  ASSERT_EQ(RunCohort({"status", "--run-dir", dir / "run"}, &out, dir / "status.log"), 0);
  EXPECT_NE(out.find("  epsilon clip_norm\n"), std::string::npos) << out;
  for (const auto& r : rounds) {
    char cell[32];
    std::snprintf(cell, sizeof(cell), " %9.4g\n", r.dp_clip_norm);
    EXPECT_NE(out.find(cell), std::string::npos) << "round " << r.round << ": " << cell << out;
  }
}

std::vector<store::RoundRecord> RoundsOf(const std::string& run_dir) {
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  return std::move(store->Rounds()).value();
}

std::vector<float> ModelOf(const std::string& run_dir) {
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  return std::move(store->LatestCheckpoint()).value().model;
}

// The run store's COHORT_FAULT_KILL_IN_COMMIT hook kills `cohort simulate`
// with round 3's rows in the WAL but no commit; started again on the same
// run directory it resumes after round 2 (C from round 2's record) and ends
// where a run that was never killed ends, bit for bit. Both runs share the
// noise key (copied before the first start), so the noise and the secret
// cohorts are the same.
TEST(AdaptiveClipRunTest, AKilledSimulationResumesToTheSameModelAndClip) {
  TempDir dir("adaptive_clip_kill");
  const std::string config = dir / "dp.textproto";
  WriteFile(config, kConfig);
  std::string out;
  ASSERT_EQ(
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "ref"}, &out, dir / "ref.log"),
      0)
      << ReadFile(dir / "ref.log");
  std::filesystem::create_directories(dir / "crash");
  std::filesystem::copy_file(dir / "ref/privacy_noise.key", dir / "crash/privacy_noise.key");
  std::filesystem::permissions(
      dir / "crash/privacy_noise.key",
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  setenv("COHORT_FAULT_KILL_IN_COMMIT", "3", 1);
  const int killed = RunCohort({"simulate", "--config", config, "--run-dir", dir / "crash"}, &out,
                               dir / "kill.log");
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  ASSERT_EQ(killed, 128 + SIGKILL) << ReadFile(dir / "kill.log");
  ASSERT_EQ(RoundsOf(dir / "crash").size(), 2u);
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", dir / "crash"}, &out,
                      dir / "resume.log"),
            0)
      << ReadFile(dir / "resume.log");
  const std::vector<store::RoundRecord> ref = RoundsOf(dir / "ref"),
                                        resumed = RoundsOf(dir / "crash");
  ASSERT_EQ(ref.size(), 4u);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(resumed[r].dp_clip_norm, ref[r].dp_clip_norm) << "round " << r + 1;
    EXPECT_EQ(resumed[r].dp_next_clip_norm, ref[r].dp_next_clip_norm) << "round " << r + 1;
    EXPECT_EQ(resumed[r].dp_epsilon, ref[r].dp_epsilon) << "round " << r + 1;
  }
  const std::vector<float> a = ModelOf(dir / "ref"), b = ModelOf(dir / "crash");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace cohort::testing
