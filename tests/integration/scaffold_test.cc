// SCAFFOLD (issue 34, item 2) over real processes: a coordinator and four
// `cohort client`s with --state-dir commit, bit for bit, the model and the
// server control variate that `cohort simulate` commits, with plain and
// with SecAgg+ aggregation; in the plain run one client is killed after
// round 2 and restarted on its state directory, so it goes on with the c_i
// it had (from zeros it would train another model). A simulated SCAFFOLD
// run is not resumed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "client/control_variate.h"
#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kClients = 4, kRounds = 4;

store::Checkpoint FinalCheckpoint(const std::string& run_dir) {
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  return std::move(store->LatestCheckpoint()).value();
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The cluster's config with train.scaffold and momentum (NIID-Bench's rho).
std::string ScaffoldConfig(Cluster& c, const std::string& name, int rounds,
                           const std::string& aggregation) {
  const std::string path =
      c.WriteConfig(name, rounds, "min_clients: 4 start_clients: 4 round_deadline_s: 20",
                    "secagg { aggregation: " + aggregation + " }");
  std::string text = ReadFile(path);
  const std::string train = "train { batch_size: 16 learning_rate: 0.05 }";
  const size_t at = text.find(train);
  if (at == std::string::npos) throw std::runtime_error("the cluster's config changed");
  text.replace(at, train.size(),
               "train { batch_size: 16 learning_rate: 0.05 momentum: 0.5 scaffold: true }");
  WriteFile(path, text);
  return path;
}

class ScaffoldRunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ScaffoldRunTest, DaemonsWithARestartedClientCommitTheSimulatorsModelAndVariate) {
  const bool plain = GetParam() == "PLAIN";
  Cluster c("scaffold", kClients);
  const std::string config = ScaffoldConfig(c, "run.textproto", kRounds, GetParam());
  auto state = [&](int k) { return std::string(c.dir() / ("state-" + std::to_string(k))); };
  const std::string endpoint = c.StartCoordinator(config, c.dir() / "daemons");
  for (int k = 0; k < kClients; ++k) c.StartClient(k, endpoint, {"--state-dir", state(k)});
  if (plain) {
    // Killed once round 2 is committed (its update, and c_i after it, are
    // in), restarted on the same state directory: it gets its task again.
    ASSERT_TRUE(c.coordinator().WaitForLine("round   2/4"));
    c.client(0).Signal(SIGKILL);
    EXPECT_EQ(c.client(0).Wait(), 128 + SIGKILL);
    c.StartClient(0, endpoint, {"--state-dir", state(0)});
  }
  ASSERT_EQ(c.coordinator().Wait(std::chrono::seconds(240)), 0) << ReadFile(c.coordinator_log());
  for (int k = 0; k < kClients; ++k) EXPECT_EQ(c.client(k).Wait(), 0) << "client " << k;
  if (plain) {
    EXPECT_NE(ReadFile(c.client_log(0)).find("SCAFFOLD: control variate c_i from " + state(0)),
              std::string::npos)
        << ReadFile(c.client_log(0));
  }

  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "sim", "--shards",
                       c.dir() / "shards", "--devices", "cpu"},
                      &out, c.dir() / "simulate.log"),
            0)
      << ReadFile(c.dir() / "simulate.log");
  const store::Checkpoint daemons = FinalCheckpoint(c.dir() / "daemons");
  const store::Checkpoint sim = FinalCheckpoint(c.dir() / "sim");
  ASSERT_EQ(daemons.round, uint32_t{kRounds});
  ASSERT_EQ(sim.round, uint32_t{kRounds});
  EXPECT_TRUE(SameBits(daemons.model, sim.model)) << "the daemons' model is not the simulator's";
  // FedAvg keeps no velocity: the checkpoint's is c, one value a parameter.
  ASSERT_EQ(daemons.velocity.size(), daemons.model.size());
  EXPECT_TRUE(SameBits(daemons.velocity, sim.velocity)) << "the daemons' c is not the simulator's";
  double norm = 0;
  for (float v : daemons.velocity) norm += double{v} * v;
  EXPECT_GT(norm, 0) << "c never moved";
  for (int k = 0; k < kClients; ++k) {
    auto ci =
        client::LoadControlVariate(client::ControlVariatePath(state(k)), daemons.model.size());
    ASSERT_TRUE(ci.ok()) << ci.status().message();
    EXPECT_EQ(ci->round, uint32_t{kRounds}) << "client " << k;
    double ci_norm = 0;
    for (float v : ci->after) ci_norm += double{v} * v;
    EXPECT_GT(ci_norm, 0) << "client " << k << "'s c_i never moved";
  }

  // `cohort status` says what divides c's step, and --json has it per round.
  ASSERT_EQ(RunCohort({"status", "--run-dir", c.dir() / "daemons"}, &out, c.dir() / "status.log"),
            0);
  EXPECT_NE(out.find("SCAFFOLD: c steps by the sum of the counted clients' c_i changes / N, "
                     "N = 4 after round 4 (the most clients registered in the run; it never "
                     "falls)\n"),
            std::string::npos)
      << out;
  ASSERT_EQ(RunCohort({"status", "--run-dir", c.dir() / "daemons", "--json"}, &out,
                      c.dir() / "status.log"),
            0);
  EXPECT_NE(out.find("\"scaffold_population\":4"), std::string::npos) << out;
  // A store from before N was kept (the column reads 0) shows no N.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((c.dir() / "daemons/run.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "UPDATE rounds SET scaffold_population = 0", nullptr, nullptr, nullptr),
      SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  ASSERT_EQ(RunCohort({"status", "--run-dir", c.dir() / "daemons"}, &out, c.dir() / "status.log"),
            0);
  EXPECT_EQ(out.find("SCAFFOLD:"), std::string::npos) << out;
  ASSERT_EQ(RunCohort({"status", "--run-dir", c.dir() / "daemons", "--json"}, &out,
                      c.dir() / "status.log"),
            0);
  EXPECT_EQ(out.find("scaffold_population"), std::string::npos) << out;

  // The virtual clients' c_i were in memory: no resume.
  const std::string longer = ScaffoldConfig(c, "longer.textproto", kRounds + 1, GetParam());
  EXPECT_NE(RunCohort({"simulate", "--config", longer, "--run-dir", c.dir() / "sim", "--shards",
                       c.dir() / "shards", "--devices", "cpu"},
                      &out, c.dir() / "resume.log"),
            0);
  const std::string log = ReadFile(c.dir() / "resume.log");
  EXPECT_NE(log.find("cohort simulate: " + std::string(c.dir() / "sim") +
                     " holds 4 committed rounds of a train.scaffold run; the virtual clients' "
                     "control variates were kept in memory only, so it cannot be resumed (start "
                     "it in a new --run-dir)"),
            std::string::npos)
      << log;
}

INSTANTIATE_TEST_SUITE_P(Aggregation, ScaffoldRunTest, ::testing::Values("PLAIN", "SECAGG_PLUS"));

// A coordinator SIGKILLed after round 2 resumes with the c of its last
// checkpoint; the clients, whose c_i may have moved in a round that was
// then not committed, train that round again from the c_i before it: the
// run ends with the simulator's model and c, bit for bit.
TEST(ScaffoldResumeTest, AKilledCoordinatorResumesToTheSimulatorsModelAndVariate) {
  Cluster c("scaffold-resume", kClients);
  const std::string config = ScaffoldConfig(c, "run.textproto", kRounds, "PLAIN");
  const std::string run_dir = c.dir() / "daemons";
  const std::string endpoint = c.StartCoordinator(config, run_dir);
  for (int k = 0; k < kClients; ++k) {
    c.StartClient(k, endpoint, {"--state-dir", c.dir() / ("state-" + std::to_string(k))});
  }
  ASSERT_TRUE(c.coordinator().WaitForLine("round   2/4"));
  c.KillCoordinator();
  c.StartCoordinator(config, run_dir, endpoint);
  ASSERT_EQ(c.coordinator().Wait(std::chrono::seconds(240)), 0) << ReadFile(c.coordinator_log());
  for (int k = 0; k < kClients; ++k) EXPECT_EQ(c.client(k).Wait(), 0) << "client " << k;
  EXPECT_NE(ReadFile(c.coordinator_log()).find("resuming run after committed round "),
            std::string::npos);

  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", c.dir() / "sim", "--shards",
                       c.dir() / "shards", "--devices", "cpu"},
                      &out, c.dir() / "simulate.log"),
            0)
      << ReadFile(c.dir() / "simulate.log");
  const store::Checkpoint daemons = FinalCheckpoint(run_dir);
  const store::Checkpoint sim = FinalCheckpoint(c.dir() / "sim");
  ASSERT_EQ(daemons.round, uint32_t{kRounds});
  EXPECT_TRUE(SameBits(daemons.model, sim.model)) << "the resumed model is not the simulator's";
  EXPECT_TRUE(SameBits(daemons.velocity, sim.velocity)) << "the resumed c is not the simulator's";
}

// --state-dir must be a directory (created if missing): a file is refused
// by name before the client connects.
TEST(ScaffoldClientTest, AStateDirThatIsAFileIsRefusedByName) {
  Cluster c("scaffold-state-dir", 1);
  const std::string file = c.dir() / "not-a-directory";
  WriteFile(file, "x");
  std::string out;
  EXPECT_NE(RunCohort({"client", "--coordinator", "tcp://127.0.0.1:1", "--data", c.Shard(0),
                       "--insecure", "--state-dir", file},
                      &out, c.dir() / "client.log"),
            0);
  const std::string log = ReadFile(c.dir() / "client.log");
  EXPECT_NE(log.find("--state-dir " + file + ": not a directory"), std::string::npos) << log;
}

}  // namespace
}  // namespace cohort::testing
