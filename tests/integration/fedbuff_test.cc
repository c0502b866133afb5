// FedBuff (issue 34, item 5) in `cohort simulate`: groups of
// fedbuff.buffer_size clients, each one SecAgg+ session, overlap on the
// virtual clock with stragglers (--speed-sigma), stale groups are folded in
// with their weight, and a run SIGKILLed inside a version's commit resumes
// from the last committed version.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kClients = 12;
constexpr int kVersions = 10;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Groups of 5, two in flight; a straggler is cut at the 25 s deadline, and
// the SecAgg+ graph is planned for a fifth of each group dropping out
// (with groups of 4 and the default plan, one straggler aborts its group).
std::string FedBuffConfig(const Cluster& c) {
  return c.WriteConfig("run.textproto", kVersions,
                       "min_clients: 3 round_deadline_s: 25 keep_checkpoints: 100",
                       "fedbuff { buffer_size: 5 concurrency: 10 }\nserver { momentum: 0.5 }\n"
                       "secagg { expected_dropout: 0.3 }");
}

int Simulate(const Cluster& c, const std::string& config, const std::string& run,
             std::string* out) {
  return RunCohort(
      {"simulate", "--config", config, "--run-dir", c.dir() / run, "--shards", c.dir() / "shards",
       "--sample-ms", "100", "--speed-sigma", "1.0", "--latency-ms", "20", "--json"},
      out, c.dir() / (run + ".log"));
}

// "staleness N" of each version's log line.
std::vector<int> Stalenesses(const std::string& log) {
  std::vector<int> out;
  const std::regex line("fedbuff: version [0-9]+: .* staleness ([0-9]+), weight");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stoi((*it)[1]));
  }
  return out;
}

TEST(FedBuffSimulateTest, SecureGroupsOverlapAndStaleOnesAreFoldedIn) {
  Cluster c("fedbuff-simulate", kClients);
  std::string out;
  ASSERT_EQ(Simulate(c, FedBuffConfig(c), "run", &out), 0) << ReadFile(c.dir() / "run.log");
  auto store = OrThrow(store::OpenSqliteRunStore(c.dir() / "run/run.db"), "open run.db");
  const auto versions = OrThrow(store->Rounds(), "rounds");
  ASSERT_EQ(versions.size(), size_t{kVersions});
  size_t dropped = 0;
  for (const auto& v : versions) {
    EXPECT_EQ(v.aggregation, "secagg+") << "version " << v.round;
    EXPECT_EQ(v.outcome, "committed") << "version " << v.round;
    EXPECT_EQ(v.selected, 5u) << "version " << v.round;
    EXPECT_GE(v.participants, 3u) << "version " << v.round;
    dropped += v.dropped;
  }
  EXPECT_GT(dropped, 0u) << "no straggler was cut: the test shows nothing";
  const std::vector<int> staleness = Stalenesses(ReadFile(c.dir() / "run.log"));
  ASSERT_EQ(staleness.size(), size_t{kVersions}) << ReadFile(c.dir() / "run.log");
  EXPECT_EQ(staleness[0], 0);
  EXPECT_GT(*std::max_element(staleness.begin(), staleness.end()), 0)
      << "no group was stale: the groups did not overlap";
  // The virtual clock at each commit goes forward.
  EXPECT_NE(out.find("\"virtual_time_s\""), std::string::npos) << out;
}

// The per-round rules that compose with FedBuff run inside each group:
// FedNova's normalised mean under SecAgg+, a robust rule on a plain run.
TEST(FedBuffSimulateTest, PerGroupRulesRunInsideEachGroup) {
  Cluster c("fedbuff-rules", kClients);
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"fednova",
       "fedbuff { buffer_size: 5 concurrency: 10 }\nsecagg { expected_dropout: 0.3 }\n"
       "train { batch_size: 16 learning_rate: 0.05 fednova: true }"},
      {"median",
       "fedbuff { buffer_size: 5 concurrency: 10 }\nsecagg { aggregation: PLAIN }\n"
       "server { robust { rule: MEDIAN } }"},
  };
  for (const auto& [name, extra] : runs) {
    // WriteConfig's own train block would repeat the field: drop it.
    std::string text = ReadFile(c.WriteConfig(name + ".textproto", kVersions,
                                              "min_clients: 3 round_deadline_s: 25", extra));
    if (extra.find("train {") != std::string::npos) {
      text.erase(text.find("train { batch_size: 16 learning_rate: 0.05 }\n"),
                 std::string("train { batch_size: 16 learning_rate: 0.05 }\n").size());
    }
    WriteFile(c.dir() / (name + ".textproto"), text);
    std::string out;
    ASSERT_EQ(Simulate(c, c.dir() / (name + ".textproto"), name, &out), 0)
        << ReadFile(c.dir() / (name + ".log"));
    auto store = OrThrow(store::OpenSqliteRunStore(c.dir() / (name + "/run.db")), "open " + name);
    EXPECT_EQ(OrThrow(store->Rounds(), "rounds").size(), size_t{kVersions}) << name;
    EXPECT_EQ(Stalenesses(ReadFile(c.dir() / (name + ".log"))).size(), size_t{kVersions}) << name;
  }
}

// A SIGKILL inside version 4's commit (the store's test hook) loses that
// version; the run resumes after version 3 with every client free. The
// groups in flight at the kill are abandoned, so the resumed run does not
// retrace the uninterrupted one after version 3 (see FedBuffEngine); it is
// deterministic: two resumes of the same crashed store end bit for bit
// alike, and versions 1-3 are the uninterrupted run's.
TEST(FedBuffResumeTest, AKilledRunResumesFromItsLastVersionDeterministically) {
  Cluster c("fedbuff-resume", kClients);
  const std::string config = FedBuffConfig(c);
  std::string out;
  ASSERT_EQ(Simulate(c, config, "ref", &out), 0) << ReadFile(c.dir() / "ref.log");

  setenv("COHORT_FAULT_KILL_IN_COMMIT", "4", 1);
  const int killed = Simulate(c, config, "crash", &out);
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  ASSERT_EQ(killed, 128 + SIGKILL) << ReadFile(c.dir() / "crash.log");
  std::filesystem::copy(c.dir() / "crash", c.dir() / "crash2",
                        std::filesystem::copy_options::recursive);
  auto ref = OrThrow(store::OpenSqliteRunStore(c.dir() / "ref/run.db"), "open ref");
  {
    auto crashed = OrThrow(store::OpenSqliteRunStore(c.dir() / "crash/run.db"), "open crash");
    EXPECT_EQ(OrThrow(crashed->LoadRun(), "load")->last_round, 3u);
    for (uint32_t v = 1; v <= 3; ++v) {
      EXPECT_TRUE(SameBits(OrThrow(ref->CheckpointAt(v), "ref").model,
                           OrThrow(crashed->CheckpointAt(v), "crash").model))
          << "version " << v;
    }
  }
  ASSERT_EQ(Simulate(c, config, "crash", &out), 0) << ReadFile(c.dir() / "crash.log");
  EXPECT_NE(ReadFile(c.dir() / "crash.log").find("fedbuff: resuming after committed version 3"),
            std::string::npos)
      << ReadFile(c.dir() / "crash.log");
  ASSERT_EQ(Simulate(c, config, "crash2", &out), 0) << ReadFile(c.dir() / "crash2.log");
  auto a = OrThrow(store::OpenSqliteRunStore(c.dir() / "crash/run.db"), "open crash");
  auto b = OrThrow(store::OpenSqliteRunStore(c.dir() / "crash2/run.db"), "open crash2");
  const auto cp_a = OrThrow(a->LatestCheckpoint(), "crash"),
             cp_b = OrThrow(b->LatestCheckpoint(), "crash2");
  EXPECT_EQ(cp_a.round, uint32_t{kVersions});
  EXPECT_TRUE(SameBits(cp_a.model, cp_b.model));
  EXPECT_TRUE(SameBits(cp_a.velocity, cp_b.velocity));
}

// What a user sees for a fedbuff config the simulator or the daemon does
// not run.
TEST(FedBuffRefusalTest, EachRefusalNamesBothSettings) {
  Cluster c("fedbuff-refusal", 4);
  std::string out;
  const std::string dp =
      c.WriteConfig("dp.textproto", 2, "min_clients: 2",
                    "secagg { aggregation: PLAIN }\nfedbuff { buffer_size: 2 concurrency: 4 }\n"
                    "privacy { noise_multiplier: 1 clip_norm: 1 }");
  EXPECT_NE(RunCohort({"simulate", "--config", dp, "--run-dir", c.dir() / "dp", "--shards",
                       c.dir() / "shards"},
                      &out, c.dir() / "dp.log"),
            0);
  EXPECT_NE(ReadFile(c.dir() / "dp.log").find("fedbuff and privacy do not compose"),
            std::string::npos)
      << ReadFile(c.dir() / "dp.log");
  const std::string ok = c.WriteConfig("ok.textproto", 2, "min_clients: 3",
                                       "fedbuff { buffer_size: 4 concurrency: 4 }");
  EXPECT_NE(RunCohort({"simulate", "--config", ok, "--run-dir", c.dir() / "drop", "--shards",
                       c.dir() / "shards", "--dropout", "0.1"},
                      &out, c.dir() / "drop.log"),
            0);
  EXPECT_NE(ReadFile(c.dir() / "drop.log")
                .find("simulate: --dropout draws each client's dropout per round, and fedbuff's "
                      "groups are not rounds of the run"),
            std::string::npos)
      << ReadFile(c.dir() / "drop.log");
  EXPECT_NE(RunCohort({"coordinator", "--config", ok, "--run-dir", c.dir() / "daemon", "--bind",
                       "tcp://127.0.0.1:0", "--insecure"},
                      &out, c.dir() / "daemon.log"),
            0);
  EXPECT_NE(ReadFile(c.dir() / "daemon.log")
                .find("fedbuff: the coordinator daemon does not run buffered asynchronous "
                      "aggregation yet; `cohort simulate` does"),
            std::string::npos)
      << ReadFile(c.dir() / "daemon.log");
}

}  // namespace
}  // namespace cohort::testing
