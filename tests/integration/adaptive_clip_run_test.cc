// Adaptive clipping end to end (privacy.adaptive_clip with central DP):
// `cohort simulate` runs DP-FedAvg whose clip norm C follows the target
// quantile of the update norms; the store keeps each round's C and the
// next, and `cohort status` shows each round's C in its clip_norm column; a
// simulation SIGKILLed inside round 3's commit resumes to the same model
// and C as one that never stopped. Under distributed DP (Skellam, SecAgg+,
// 20% dropouts) the clients' noised bits move C the same way, and a killed
// simulation resumes with the C and the accountant of its stored rounds.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "coordinator/adaptive_clip.h"
#include "coordinator/secagg_plan.h"
#include "privacy/skellam.h"
#include "proto/config_io.h"
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
    if (r > 0) {
      EXPECT_EQ(rounds[r].dp_clip_norm, rounds[r - 1].dp_next_clip_norm);
    }
  }

  ASSERT_EQ(RunCohort({"status", "--run-dir", dir / "run"}, &out, dir / "status.log"), 0);
  EXPECT_NE(out.find("  epsilon clip_norm\n"), std::string::npos) << out;
  char line[160];
  std::snprintf(line, sizeof(line),
                "privacy: DP-FedAvg, noise multiplier 1, adaptive clip norm from 0.01 (target "
                "quantile 0.5), %.6g for round 5; epsilon ",
                rounds[3].dp_next_clip_norm);
  EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
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

constexpr char kDistributedConfig[] =
    "seed: 5\n"
    "data { partition { format: \"synthetic\" samples: 1200 test_samples: 400 "
    "features: 20 classes: 4 clients: 10 scheme: \"iid\" seed: 3 } }\n"
    "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
    "train { batch_size: 16 learning_rate: 0.05 }\n"
    "net { heartbeat_s: 0.5 }\n"
    "rounds { num_rounds: 5 min_clients: 6 start_clients: 10 fraction: 1.0 "
    "max_clients_per_round: 10 }\n"
    "secagg { aggregation: SECAGG_PLUS }\n"
    "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1.0 clip_norm: 0.01 "
    "target_delta: 1e-5\n"
    "  adaptive_clip { target_quantile: 0.5 learning_rate: 0.5 clipped_count_stddev: 0.6 } }\n";

// Each record's ε against the coordinator recomputed from the records: the
// update at the grid of its round's C and z_Δ, with the count word, charged
// in round order (what the coordinator must have charged, live or resumed).
std::vector<double> RecomputedEpsilons(const std::vector<store::RoundRecord>& rounds) {
  auto parsed = config::ParseRunConfig(kDistributedConfig, "ddp.textproto");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  const uint32_t m = coordinator::MinRoundClients(*parsed);
  const double z_delta = *coordinator::AdaptiveUpdateNoiseMultiplier(1.0, 0.6);
  auto count = privacy::ChooseClipCountParams(0.6, 10, m);
  privacy::RdpAccountant accountant;
  std::vector<double> out;
  for (const store::RoundRecord& r : rounds) {
    if (r.dp_sampling_rate > 0) {
      auto grid = privacy::ChooseSkellamParams(r.dp_clip_norm, z_delta, 10, m, 404);
      EXPECT_TRUE(privacy::ChargeAdaptiveSkellamRounds(accountant, *grid, *count).ok());
    }
    out.push_back(accountant.rdp()[0] > 0 ? accountant.Spent(1e-5)->epsilon : 0);
  }
  return out;
}

// A clip of 0.01 cuts every update (b̄ near 0 plus the count's noise): C
// grows each committed round, each round clips where the last left it, and
// the accountant charged the pair at each round's C. 20% of the selected
// clients drop (at stages drawn from the seed).
TEST(AdaptiveClipRunTest, DistributedDpMovesTheClipUnderSecAggPlusWithDropouts) {
  TempDir dir("adaptive_clip_ddp");
  const std::string config = dir / "ddp.textproto";
  WriteFile(config, kDistributedConfig);
  std::string out;
  ASSERT_EQ(
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "run", "--dropout", "0.2"},
                &out, dir / "sim.log"),
      0)
      << ReadFile(dir / "sim.log");
  const std::string log = ReadFile(dir / "sim.log");
  EXPECT_NE(log.find("privacy: adaptive clipping's count word (noise std 0.6 in count units): "
                     "scale 2^21 per unit"),
            std::string::npos)
      << log;
  const std::vector<store::RoundRecord> rounds = RoundsOf(dir / "run");
  ASSERT_EQ(rounds.size(), 5u);
  EXPECT_EQ(rounds[0].dp_clip_norm, 0.01);
  int committed = 0, short_rounds = 0;
  const std::vector<double> eps = RecomputedEpsilons(rounds);
  for (size_t r = 0; r < rounds.size(); ++r) {
    if (r > 0) {
      EXPECT_EQ(rounds[r].dp_clip_norm, rounds[r - 1].dp_next_clip_norm);
    }
    std::printf("round %zu: %s, %u of %u, C %.6g -> %.6g, epsilon %.6g\n", r + 1,
                rounds[r].outcome.c_str(), rounds[r].participants, rounds[r].selected,
                rounds[r].dp_clip_norm, rounds[r].dp_next_clip_norm, rounds[r].dp_epsilon);
    EXPECT_NEAR(rounds[r].dp_epsilon, eps[r], 1e-9 * eps[r]) << "round " << r + 1;
    if (rounds[r].outcome != "committed") continue;
    ++committed;
    short_rounds += rounds[r].participants < rounds[r].selected ? 1 : 0;
    EXPECT_GT(rounds[r].dp_next_clip_norm, rounds[r].dp_clip_norm) << "round " << r + 1;
  }
  EXPECT_GE(committed, 3);
  EXPECT_GE(short_rounds, 1);  // Dropouts were in the sums.
  ASSERT_EQ(RunCohort({"status", "--run-dir", dir / "run"}, &out, dir / "status.log"), 0);
  EXPECT_NE(out.find(" clip_norm\n"), std::string::npos) << out;
  EXPECT_NE(out.find("noise multiplier 1, adaptive clip norm from 0.01 (target quantile 0.5), "),
            std::string::npos)
      << out;
}

// SIGKILLed inside round 3's commit and started again: the run resumes
// after round 2 with round 2's next C and its accountant rebuilt from the
// records, each round at its own C's grid. The clients' noise is fresh
// secret randomness (as distributed DP needs), so a resumed run's model
// and later C are not a never-killed run's bits; what must hold is the
// chain of C and the ε of every stored round.
TEST(AdaptiveClipRunTest, AKilledDistributedSimulationResumesFromTheStoredClip) {
  TempDir dir("adaptive_clip_ddp_kill");
  const std::string config = dir / "ddp.textproto";
  WriteFile(config, kDistributedConfig);
  std::string out;
  setenv("COHORT_FAULT_KILL_IN_COMMIT", "3", 1);
  const int killed =
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "run"}, &out, dir / "kill.log");
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  ASSERT_EQ(killed, 128 + SIGKILL) << ReadFile(dir / "kill.log");
  const std::vector<store::RoundRecord> before = RoundsOf(dir / "run");
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", dir / "run"}, &out,
                      dir / "resume.log"),
            0)
      << ReadFile(dir / "resume.log");
  const std::string log = ReadFile(dir / "resume.log");
  char restored[96];
  std::snprintf(restored, sizeof(restored), "privacy: adaptive clip norm %.6g",
                before[1].dp_next_clip_norm);
  EXPECT_NE(log.find(restored), std::string::npos) << log;
  const std::vector<store::RoundRecord> after = RoundsOf(dir / "run");
  ASSERT_EQ(after.size(), 5u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(after[r].dp_next_clip_norm, before[r].dp_next_clip_norm);
    EXPECT_EQ(after[r].dp_epsilon, before[r].dp_epsilon);
  }
  EXPECT_EQ(after[2].dp_clip_norm, before[1].dp_next_clip_norm);
  const std::vector<double> eps = RecomputedEpsilons(after);
  for (size_t r = 0; r < after.size(); ++r) {
    if (r > 0) {
      EXPECT_EQ(after[r].dp_clip_norm, after[r - 1].dp_next_clip_norm);
    }
    EXPECT_NEAR(after[r].dp_epsilon, eps[r], 1e-9 * eps[r]) << "round " << r + 1;
  }
  EXPECT_GT(after[4].dp_next_clip_norm, after[0].dp_clip_norm);
}

}  // namespace
}  // namespace cohort::testing
