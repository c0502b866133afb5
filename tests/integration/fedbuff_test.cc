// FedBuff (issue 34, item 5) in `cohort simulate`: groups of
// fedbuff.buffer_size clients, each one SecAgg+ session, overlap on the
// virtual clock with stragglers (--speed-sigma), stale groups are folded in
// with their weight, and a run SIGKILLed mid-run resumes bit for bit as
// the uninterrupted run (the schedule commits with each version).
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
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
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Writes `schedule` over version `v`'s stored one, leaving its checksum,
// as a disk error or an outside writer would.
void SetSchedule(const std::string& db_path, uint32_t v, const std::string& schedule) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE checkpoints SET fedbuff_schedule = ? WHERE round = ?",
                               -1, &stmt, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_bind_blob(stmt, 1, schedule.data(), static_cast<int>(schedule.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, v);
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE) << sqlite3_errmsg(db);
  EXPECT_EQ(sqlite3_changes(db), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

// Groups of 5, two in flight; a straggler is cut at the 25 s deadline, and
// the SecAgg+ graph is planned for a fifth of each group dropping out
// (with groups of 4 and the default plan, one straggler aborts its group).
std::string FedBuffConfig(const Cluster& c,
                          const std::string& fedbuff = "buffer_size: 5 concurrency: 10") {
  return c.WriteConfig("run.textproto", kVersions,
                       "min_clients: 3 round_deadline_s: 25 keep_checkpoints: 100",
                       "fedbuff { " + fedbuff +
                           " }\nserver { momentum: 0.5 }\n"
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
  // The virtual clock at each commit goes forward, one time per version.
  std::vector<double> times;
  const std::regex at("\"virtual_time_s\":([0-9.]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), at); it != std::sregex_iterator();
       ++it) {
    times.push_back(std::stod((*it)[1]));
  }
  ASSERT_EQ(times.size(), size_t{kVersions}) << out;
  EXPECT_GT(times[0], 0) << out;
  for (size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i], times[i - 1]) << out;
  EXPECT_GT(times.back(), times.front()) << out;
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

// Every committed version's model and server velocity of two runs (keep_
// checkpoints covers them all), compared bit for bit.
void ExpectSameVersions(const std::string& ref_db, const std::string& run_db) {
  auto ref = OrThrow(store::OpenSqliteRunStore(ref_db), "open " + ref_db);
  auto run = OrThrow(store::OpenSqliteRunStore(run_db), "open " + run_db);
  const auto ref_rounds = OrThrow(ref->Rounds(), "rounds");
  const auto run_rounds = OrThrow(run->Rounds(), "rounds");
  ASSERT_EQ(ref_rounds.size(), size_t{kVersions});
  ASSERT_EQ(run_rounds.size(), ref_rounds.size());
  for (uint32_t v = 1; v <= kVersions; ++v) {
    const auto a = OrThrow(ref->CheckpointAt(v), "ref"), b = OrThrow(run->CheckpointAt(v), "run");
    EXPECT_TRUE(SameBits(a.model, b.model)) << run_db << ": version " << v << "'s model differs";
    EXPECT_TRUE(SameBits(a.velocity, b.velocity)) << run_db << ": version " << v << "'s velocity";
    EXPECT_EQ(ref_rounds[v - 1].participants, run_rounds[v - 1].participants) << "version " << v;
    EXPECT_EQ(ref_rounds[v - 1].dropped, run_rounds[v - 1].dropped) << "version " << v;
  }
}

// "N groups in flight" of the resume's log line, or -1.
int GroupsResumed(const std::string& log, uint32_t after) {
  const std::regex line("fedbuff: resuming after committed version " + std::to_string(after) +
                        ": ([0-9]+) groups in flight re-open");
  std::smatch m;
  return std::regex_search(log, m, line) ? std::stoi(m[1]) : -1;
}

struct Shape {
  std::string name;
  std::string fedbuff;  // The fedbuff section's fields.
  int in_flight;        // Groups in flight after each commit.
};

class FedBuffResumeTest : public ::testing::TestWithParam<Shape> {};

// Acceptance: a FedBuff simulation (SecAgg+, stragglers cut by the
// deadline, server momentum) SIGKILLed mid-run and resumed ends bit for bit
// as the uninterrupted run, every version alike, killed at two points:
// inside version 4's commit (the store's test hook: the rows are in the
// WAL, no COMMIT), and at whatever point the run has reached once version
// 7 is committed (SIGKILL from outside); with one, two and three groups at
// a time (none, one and two left in flight at each commit).
TEST_P(FedBuffResumeTest, AKilledRunResumesBitIdentical) {
  Cluster c("fedbuff-resume", kClients);
  const std::string config = FedBuffConfig(c, GetParam().fedbuff);
  std::string out;
  ASSERT_EQ(Simulate(c, config, "ref", &out), 0) << ReadFile(c.dir() / "ref.log");

  setenv("COHORT_FAULT_KILL_IN_COMMIT", "4", 1);
  const int killed = Simulate(c, config, "hook", &out);
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  ASSERT_EQ(killed, 128 + SIGKILL) << ReadFile(c.dir() / "hook.log");
  ASSERT_EQ(Simulate(c, config, "hook", &out), 0) << ReadFile(c.dir() / "hook.log");
  const std::string hook_log = ReadFile(c.dir() / "hook.log");
  EXPECT_EQ(GroupsResumed(hook_log, 3), GetParam().in_flight) << hook_log;
  EXPECT_NE(hook_log.find("fedbuff: the resumed schedule has caught up"), std::string::npos)
      << hook_log;
  ExpectSameVersions(c.dir() / "ref/run.db", c.dir() / "hook/run.db");

  {
    Process p({CohortBin(), "simulate", "--config", config, "--run-dir", c.dir() / "kill",
               "--shards", c.dir() / "shards", "--sample-ms", "100", "--speed-sigma", "1.0",
               "--latency-ms", "20", "--json"},
              c.dir() / "kill.log");
    ASSERT_TRUE(p.WaitForLine("{\"round\":7,")) << ReadFile(c.dir() / "kill.log");
    p.Signal(SIGKILL);
    ASSERT_EQ(p.Wait(), 128 + SIGKILL) << "the run ended before the kill";
  }
  auto killed_store = OrThrow(store::OpenSqliteRunStore(c.dir() / "kill/run.db"), "open kill");
  const uint32_t at = OrThrow(killed_store->LoadRun(), "load")->last_round;
  killed_store.reset();
  EXPECT_GE(at, 7u);
  ASSERT_EQ(Simulate(c, config, "kill", &out), 0) << ReadFile(c.dir() / "kill.log");
  if (at < kVersions) {
    EXPECT_GE(GroupsResumed(ReadFile(c.dir() / "kill.log"), at), 0)
        << ReadFile(c.dir() / "kill.log");
  }
  ExpectSameVersions(c.dir() / "ref/run.db", c.dir() / "kill/run.db");
}

INSTANTIATE_TEST_SUITE_P(Shapes, FedBuffResumeTest,
                         ::testing::Values(Shape{"OneGroup", "buffer_size: 5 concurrency: 5", 0},
                                           Shape{"TwoGroups", "buffer_size: 5 concurrency: 10", 1},
                                           Shape{"ThreeGroups", "buffer_size: 4 concurrency: 12",
                                                 2}),
                         [](const auto& info) { return info.param.name; });

// A stored schedule that fails its checksum stops the resume with an error
// naming it; the committed versions stay, and with the byte put back the
// run resumes to the uninterrupted run's model.
TEST(FedBuffCorruptResumeTest, ACorruptedScheduleIsNamedAndLosesNoVersion) {
  Cluster c("fedbuff-corrupt", kClients);
  const std::string config = FedBuffConfig(c);
  std::string out;
  setenv("COHORT_FAULT_KILL_IN_COMMIT", "4", 1);
  const int killed = Simulate(c, config, "crash", &out);
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  ASSERT_EQ(killed, 128 + SIGKILL) << ReadFile(c.dir() / "crash.log");
  const std::string db = c.dir() / "crash/run.db";
  const std::string schedule =
      OrThrow(OrThrow(store::OpenSqliteRunStore(db), "open")->CheckpointAt(3), "version 3")
          .schedule;
  ASSERT_FALSE(schedule.empty()) << "version 3 was committed without a schedule";
  std::string flipped = schedule;
  flipped[flipped.size() / 2] ^= 0x20;
  SetSchedule(db, 3, flipped);

  EXPECT_NE(Simulate(c, config, "crash", &out), 0);
  const std::string log = ReadFile(c.dir() / "crash.log");
  EXPECT_NE(log.find("run store: checkpoint of round 3: fedbuff schedule fails its CRC-32"),
            std::string::npos)
      << log;
  {
    auto store = OrThrow(store::OpenSqliteRunStore(db), "open");
    EXPECT_EQ(OrThrow(store->LoadRun(), "load")->last_round, 3u);
    EXPECT_EQ(OrThrow(store->Rounds(), "rounds").size(), 3u);
    for (uint32_t v = 1; v <= 2; ++v) EXPECT_TRUE(store->CheckpointAt(v).ok()) << v;
  }
  SetSchedule(db, 3, schedule);
  ASSERT_EQ(Simulate(c, config, "ref", &out), 0) << ReadFile(c.dir() / "ref.log");
  ASSERT_EQ(Simulate(c, config, "crash", &out), 0) << ReadFile(c.dir() / "crash.log");
  ExpectSameVersions(c.dir() / "ref/run.db", db);
}

// What a user sees for a fedbuff config the simulator does not run (the
// daemon's refusals: fedbuff_daemon_test.cc).
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
}

// Groups that all abort (here a round deadline of 0.1 s against training of
// seconds) commit no version, which alone would end the run: after 50 in a
// row the run stops, saying why, and the store keeps what it had.
TEST(FedBuffSimulateTest, GroupsThatAllAbortStopTheRunSayingWhy) {
  Cluster c("fedbuff-all-abort", kClients);
  const std::string config =
      c.WriteConfig("abort.textproto", kVersions, "min_clients: 3 round_deadline_s: 0.1",
                    "fedbuff { buffer_size: 5 concurrency: 10 }\nsecagg { expected_dropout: 0.3 }");
  std::string out;
  EXPECT_EQ(Simulate(c, config, "run", &out), 1);
  const std::string log = ReadFile(c.dir() / "run.log");
  EXPECT_NE(log.find("fedbuff: 50 groups in a row closed without a new version after version 0 "
                     "(the last: secure aggregation aborted: "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("check rounds.round_deadline_s (0.1 s) against the clients' training time"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("fedbuff: group 51 "), std::string::npos) << "it went on";
  auto store = OrThrow(store::OpenSqliteRunStore(c.dir() / "run/run.db"), "open run.db");
  EXPECT_TRUE(OrThrow(store->Rounds(), "rounds").empty());
}

// Groups that abort now and then do not stop the run, however many abort in
// all: only 50 in a row without a version do. Here (40 synthetic clients,
// stragglers at --speed-sigma 1.5 against a 12 s deadline) some 100 groups
// abort over 60 versions, at most 4 of them in a row.
TEST(FedBuffSimulateTest, GroupsThatAbortNowAndThenDoNotStopTheRun) {
  TempDir dir("fedbuff-some-abort");
  const std::string config = dir / "some.textproto";
  WriteFile(config,
            "name: \"fedbuff-some-abort\"\n"
            "seed: 7\n"
            "data { partition { format: \"synthetic\" samples: 4000 test_samples: 500 "
            "features: 20 classes: 4 clients: 40 scheme: \"iid\" seed: 3 } }\n"
            "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
            "train { batch_size: 16 learning_rate: 0.05 }\n"
            "rounds { num_rounds: 60 min_clients: 3 round_deadline_s: 12 }\n"
            "fedbuff { buffer_size: 5 concurrency: 10 }\n"
            "secagg { expected_dropout: 0.3 }\n");
  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", dir / "run", "--sample-ms",
                       "150", "--speed-sigma", "1.5", "--latency-ms", "20"},
                      &out, dir / "run.log"),
            0)
      << ReadFile(dir / "run.log");
  const std::string log = ReadFile(dir / "run.log");
  const std::regex aborted("fedbuff: group [0-9]+ \\(from version [0-9]+\\) aborted");
  const auto n =
      std::distance(std::sregex_iterator(log.begin(), log.end(), aborted), std::sregex_iterator());
  EXPECT_GT(n, 50) << "fewer than 50 groups aborted: the test shows nothing";
  auto store = OrThrow(store::OpenSqliteRunStore(dir / "run/run.db"), "open run.db");
  EXPECT_EQ(OrThrow(store->Rounds(), "rounds").size(), 60u);
}

}  // namespace
}  // namespace cohort::testing
