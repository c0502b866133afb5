// FedBuff (buffered asynchronous aggregation) through the coordinator
// daemon: `cohort coordinator` and six `cohort client` processes on
// 127.0.0.1 run groups of three, each one SecAgg+ session; a coordinator
// SIGKILLed mid-run restarts on its run directory, its clients reconnect by
// themselves, groups in flight re-open from the committed schedule, and the
// run finishes with every committed version kept as it was. (Real time
// decides who forms a group, so the resumed run is not bit-identical to an
// uninterrupted daemon run; `cohort simulate` is, fedbuff_test.cc.) And
// what the daemon refuses with fedbuff.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "proto/checkpoint.pb.h"
#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kClients = 6;

// Groups of 3, two in flight, under SecAgg+.
std::string FedBuffConfig(const Cluster& c, int versions, const std::string& rounds_extra = "") {
  return c.WriteConfig("run.textproto", versions,
                       "min_clients: 3 round_deadline_s: 60 keep_checkpoints: 100 " + rounds_extra,
                       "fedbuff { buffer_size: 3 concurrency: 6 }\n"
                       "server { momentum: 0.5 }\n"
                       "secagg { aggregation: SECAGG_PLUS }");
}

// The coordinator's "round   N/T" lines on stdout, in order.
std::vector<std::string> RoundLines(Process& p) {
  std::vector<std::string> out;
  for (const std::string& line : p.lines()) {
    if (line.rfind("round ", 0) == 0) out.push_back(line);
  }
  return out;
}

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Real time decides who takes part: three fast clients can commit
// versions before the others have even registered, and a client that
// reaches the coordinator only after the run ended retries until stopped
// (as with synchronous rounds). So: every client that registered exits 0
// having heard Finished; the others are stopped by the test.
TEST(FedBuffDaemonTest, SecureGroupsOfClientDaemonsCommitEveryVersion) {
  Cluster c("fedbuff-daemon", kClients);
  constexpr int kVersions = 20;
  const std::string config = FedBuffConfig(c, kVersions);
  const std::string run_dir = c.dir() / "run";
  const std::string endpoint = c.StartCoordinator(config, run_dir);
  for (int k = 0; k < kClients; ++k) c.StartClient(k, endpoint);
  ASSERT_EQ(c.coordinator().Wait(std::chrono::seconds(120)), 0) << ReadFile(c.coordinator_log());
  const std::string log = ReadFile(c.coordinator_log());
  int registered = 0;
  for (int k = 0; k < kClients; ++k) {
    if (log.find("client " + ClientName(k) + " registered") == std::string::npos) {
      c.client(k).Signal(SIGTERM);
      c.client(k).Wait();
      continue;
    }
    ++registered;
    EXPECT_EQ(c.client(k).Wait(), 0) << "client " << k << ": " << ReadFile(c.client_log(k));
    EXPECT_NE(ReadFile(c.client_log(k)).find("run finished after 20 rounds"), std::string::npos)
        << ReadFile(c.client_log(k));
  }
  EXPECT_GE(registered, 3) << log;

  // What the operator sees: one line per version on stdout, one log line
  // per version naming its group and staleness.
  const std::vector<std::string> lines = RoundLines(c.coordinator());
  ASSERT_EQ(lines.size(), size_t{kVersions}) << ReadFile(c.coordinator_log());
  for (int v = 1; v <= kVersions; ++v) {
    char head[32];
    std::snprintf(head, sizeof(head), "round %3d/%d  clients 3/3", v, kVersions);
    EXPECT_EQ(lines[v - 1].rfind(head, 0), 0u) << lines[v - 1];
  }
  EXPECT_EQ(CountOf(log, "fedbuff: version "), kVersions) << log;
  EXPECT_NE(log.find("fedbuff: version 20: group "), std::string::npos) << log;
  EXPECT_NE(log.find("run finished after 20 versions"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming after version 0"), std::string::npos) << log;

  // The store: every version committed by a secure group of three.
  auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open run.db");
  const auto versions = OrThrow(store->Rounds(), "rounds");
  ASSERT_EQ(versions.size(), size_t{kVersions});
  for (const auto& v : versions) {
    EXPECT_EQ(v.outcome, "committed") << "version " << v.round;
    EXPECT_EQ(v.aggregation, "secagg+") << "version " << v.round;
    EXPECT_EQ(v.selected, 3u) << "version " << v.round;
    EXPECT_EQ(v.participants, 3u) << "version " << v.round;
    EXPECT_EQ(OrThrow(store->ClientRounds(v.round), "clients").size(), 3u) << "version " << v.round;
  }
  // `cohort status` shows them with their participants.
  std::string status;
  ASSERT_EQ(RunCohort({"status", "--run-dir", run_dir}, &status, c.dir() / "status.log"), 0)
      << ReadFile(c.dir() / "status.log");
  for (int v = 1; v <= kVersions; ++v) {
    EXPECT_TRUE(
        std::regex_search(status, std::regex("\\n +" + std::to_string(v) + " secagg\\+ +3/3 +0 ")))
        << "version " << v << ":\n"
        << status;
  }
}

TEST(FedBuffDaemonTest, AKilledCoordinatorResumesAndKeepsEveryCommittedVersion) {
  Cluster c("fedbuff-daemon-kill", kClients);
  constexpr int kVersions = 12;
  const std::string config = FedBuffConfig(c, kVersions);
  const std::string run_dir = c.dir() / "run";
  const std::string endpoint = c.StartCoordinator(config, run_dir);
  for (int k = 0; k < kClients; ++k) c.StartClient(k, endpoint);
  ASSERT_TRUE(c.coordinator().WaitForLine("round   3/12")) << ReadFile(c.coordinator_log());
  c.KillCoordinator();
  EXPECT_EQ(c.coordinator().Wait(), 128 + SIGKILL);

  // What was committed before the kill (at least 3 versions, never all).
  std::vector<store::RoundRecord> before;
  std::map<uint32_t, std::vector<float>> models;
  {
    auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open run.db");
    before = OrThrow(store->Rounds(), "rounds");
    for (const auto& v : before)
      models[v.round] = OrThrow(store->CheckpointAt(v.round), "cp").model;
  }
  ASSERT_GE(before.size(), 3u);
  ASSERT_LT(before.size(), size_t{kVersions});

  // Restarted on the same endpoint: the clients reconnect by themselves.
  c.StartCoordinator(config, run_dir, endpoint);
  ASSERT_EQ(c.coordinator().Wait(std::chrono::seconds(120)), 0) << ReadFile(c.coordinator_log());
  for (int k = 0; k < kClients; ++k) {
    EXPECT_EQ(c.client(k).Wait(), 0) << "client " << k << ": " << ReadFile(c.client_log(k));
  }
  const std::string log = ReadFile(c.coordinator_log());
  EXPECT_NE(log.find("fedbuff: resuming after committed version " + std::to_string(before.size())),
            std::string::npos)
      << log;
  // The engine's times run from the run's start (the first daemon's), not
  // from the machine's steady clock: the restarted daemon goes on from the
  // earliest group in flight, a second or so into the run.
  std::smatch from, caught_up;
  ASSERT_TRUE(std::regex_search(log, from, std::regex("the clock goes on from ([0-9.]+) s")))
      << log;
  ASSERT_TRUE(std::regex_search(
      log, caught_up, std::regex("fedbuff: the resumed schedule has caught up at ([0-9.]+) s")))
      << log;
  EXPECT_LT(std::stod(from[1]), 60.0) << log;
  EXPECT_GE(std::stod(caught_up[1]), std::stod(from[1])) << log;
  EXPECT_LT(std::stod(caught_up[1]), 60.0) << log;
  // The restarted daemon prints the versions it commits, up to the last.
  const std::vector<std::string> lines = RoundLines(c.coordinator());
  ASSERT_EQ(lines.size(), kVersions - before.size()) << log;
  EXPECT_EQ(lines.back().rfind("round  12/12  clients 3/3", 0), 0u) << lines.back();

  auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open run.db");
  const auto after = OrThrow(store->Rounds(), "rounds");
  ASSERT_EQ(after.size(), size_t{kVersions});
  for (const auto& v : after) {
    EXPECT_EQ(v.outcome, "committed") << "version " << v.round;
    EXPECT_EQ(v.participants, 3u) << "version " << v.round;
  }
  // Nothing committed before the kill changed: records and model bits.
  for (const auto& v : before) {
    const auto& now = after[v.round - 1];
    EXPECT_EQ(now.participants, v.participants) << "version " << v.round;
    EXPECT_EQ(now.test_loss, v.test_loss) << "version " << v.round;
    const std::vector<float> model = OrThrow(store->CheckpointAt(v.round), "cp").model;
    ASSERT_EQ(model.size(), models[v.round].size());
    EXPECT_EQ(std::memcmp(model.data(), models[v.round].data(), model.size() * sizeof(float)), 0)
        << "version " << v.round << "'s model changed";
  }
}

// A client of the committed schedule that never comes back is named once
// rounds.client_timeout_s has passed since the restart, not before, and the
// resumed daemon completes the run with the others.
TEST(FedBuffDaemonTest, AScheduledClientThatDoesNotReturnIsNamedAndTheRunGoesOn) {
  Cluster c("fedbuff-daemon-gone", kClients);
  const std::string config = FedBuffConfig(c, 40, "client_timeout_s: 3");
  const std::string run_dir = c.dir() / "run";
  const std::string endpoint = c.StartCoordinator(config, run_dir);
  for (int k = 0; k < kClients; ++k) c.StartClient(k, endpoint);
  ASSERT_TRUE(c.coordinator().WaitForLine("round   2/40")) << ReadFile(c.coordinator_log());
  c.KillCoordinator();
  // The last of the schedule's clients (the committed one names them all).
  checkpoint::FedBuffSchedule schedule;
  {
    auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open run.db");
    ASSERT_TRUE(schedule.ParseFromString(OrThrow(store->LatestCheckpoint(), "cp").schedule));
  }
  // A member of a group in flight when there is one (its group is then
  // abandoned), else the last free client.
  std::string gone = schedule.groups_size() > 0 ? schedule.groups(0).members(0) : "";
  if (gone.empty() && schedule.free_size() > 0) gone = schedule.free(schedule.free_size() - 1);
  ASSERT_EQ(gone.rfind("client-", 0), 0u) << schedule.DebugString();
  const int k = std::atoi(gone.c_str() + std::strlen("client-"));
  c.client(k).Signal(SIGKILL);
  c.client(k).Wait();
  const auto restarted = std::chrono::steady_clock::now();
  c.StartCoordinator(config, run_dir, endpoint);
  ASSERT_TRUE(
      WaitForText(c.coordinator_log(), "has not registered within 3 s", std::chrono::seconds(60)))
      << ReadFile(c.coordinator_log());
  // Not before the grace: the others had all that time to come back.
  EXPECT_GE(std::chrono::steady_clock::now() - restarted, std::chrono::seconds(3));
  EXPECT_EQ(c.coordinator().Wait(std::chrono::seconds(120)), 0) << ReadFile(c.coordinator_log());
  const std::string log = ReadFile(c.coordinator_log());
  EXPECT_TRUE(std::regex_search(
      log, std::regex("fedbuff: resuming after version [0-9]+: client " + gone +
                      " of the committed schedule has not registered within 3 s of the restart; "
                      "the run goes on without it, and it is drawn into no group until it "
                      "registers" +
                      std::string(schedule.groups_size() > 0
                                      ? "; group [0-9]+ \\(from version [0-9]+\\), which it "
                                        "was in, is abandoned"
                                      : ""))))
      << log;
  auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open run.db");
  const auto rounds = OrThrow(store->Rounds(), "rounds");
  ASSERT_EQ(rounds.size(), 40u) << log;
  EXPECT_EQ(rounds.back().outcome, "committed") << log;
}

// SIGHUP with a client's key gone from the allowlist (CURVE): the client is
// rejected, leaves its group, is drawn into no later group, and the run
// completes with the six others.
TEST(FedBuffDaemonTest, ARevokedClientLeavesAndJoinsNoLaterGroup) {
  constexpr int kWithRevoked = kClients + 1;
  Cluster c("fedbuff-daemon-revoke", kWithRevoked);
  std::vector<int> all;
  for (int k = 0; k < kWithRevoked; ++k) all.push_back(k);
  c.EnableCurve(all);
  constexpr int kVersions = 100;
  const std::string config = FedBuffConfig(c, kVersions);
  const std::string run_dir = c.dir() / "run";
  const std::string endpoint = c.StartCoordinator(config, run_dir);
  for (int k = 0; k < kWithRevoked; ++k) c.StartClient(k, endpoint);
  const std::string revoked = ClientName(kClients);
  ASSERT_TRUE(WaitForText(c.coordinator_log(), "client " + revoked + " registered",
                          std::chrono::seconds(60)))
      << ReadFile(c.coordinator_log());
  ASSERT_TRUE(c.coordinator().WaitForLine("round ")) << ReadFile(c.coordinator_log());
  std::filesystem::remove(c.dir() / ("allow/" + revoked + ".pub"));
  c.coordinator().Signal(SIGHUP);
  ASSERT_EQ(c.coordinator().Wait(std::chrono::seconds(120)), 0) << ReadFile(c.coordinator_log());
  for (int k = 0; k < kClients; ++k) {
    EXPECT_EQ(c.client(k).Wait(), 0) << "client " << k << ": " << ReadFile(c.client_log(k));
  }
  EXPECT_EQ(c.client(kClients).Wait(), 1) << ReadFile(c.client_log(kClients));
  EXPECT_NE(ReadFile(c.client_log(kClients)).find("coordinator rejected this client: key revoked"),
            std::string::npos)
      << ReadFile(c.client_log(kClients));

  // The versions committed before the revocation took effect; the (at most
  // two) groups in flight then commit next; no group opened later has it.
  const std::string log = ReadFile(c.coordinator_log());
  const size_t at = log.find("client " + revoked + ": key revoked");
  ASSERT_NE(at, std::string::npos) << log;
  const int before = CountOf(log.substr(0, at), "fedbuff: version ");
  EXPECT_EQ(CountOf(log, "fedbuff: version "), kVersions) << log;
  auto store = OrThrow(store::OpenSqliteRunStore(run_dir + "/run.db"), "open run.db");
  for (int v = before + 3; v <= kVersions; ++v) {
    for (const auto& r : OrThrow(store->ClientRounds(v), "clients")) {
      EXPECT_NE(r.client, revoked) << "version " << v << " (revoked after " << before << ")";
    }
  }
}

// What the daemon does not run with fedbuff, each refusal naming both.
TEST(FedBuffDaemonTest, RefusalsNameBothSettings) {
  Cluster c("fedbuff-daemon-refusal", 3);
  std::string out;
  const std::string config = FedBuffConfig(c, 2);
  EXPECT_EQ(RunCohort({"coordinator", "--config", config, "--run-dir", c.dir() / "dump", "--bind",
                       "tcp://127.0.0.1:0", "--insecure", "--dump-sums", c.dir() / "sums"},
                      &out, c.dir() / "dump.log"),
            1);
  EXPECT_NE(ReadFile(c.dir() / "dump.log")
                .find("--dump-sums and fedbuff: the daemon dumps the unmasked sums of synchronous "
                      "rounds"),
            std::string::npos)
      << ReadFile(c.dir() / "dump.log");
  const std::string dp = c.WriteConfig("dp.textproto", 2, "min_clients: 3",
                                       "fedbuff { buffer_size: 3 concurrency: 3 }\n"
                                       "privacy { noise_multiplier: 1 clip_norm: 1 }");
  EXPECT_EQ(RunCohort({"coordinator", "--config", dp, "--run-dir", c.dir() / "dp", "--bind",
                       "tcp://127.0.0.1:0", "--insecure"},
                      &out, c.dir() / "dp.log"),
            1);
  EXPECT_NE(ReadFile(c.dir() / "dp.log").find("fedbuff and privacy do not compose"),
            std::string::npos)
      << ReadFile(c.dir() / "dp.log");
}

}  // namespace
}  // namespace cohort::testing
