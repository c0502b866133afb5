// A whole federated run through the real binaries, and the errors a user
// sees for broken inputs.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

TEST(FederatedRunTest, RunCompletesAndStatusReportsEveryRound) {
  Cluster cluster("e2e", 4);
  const std::string config =
      cluster.WriteConfig("run.textproto", 4, "min_clients: 4 start_clients: 4");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 4; ++k) cluster.StartClient(k, endpoint);

  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 4; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
  // One line per round on the coordinator's stdout.
  int round_lines = 0;
  for (const auto& l : cluster.coordinator().lines()) round_lines += l.rfind("round ", 0) == 0;
  EXPECT_EQ(round_lines, 4);

  std::string json;
  ASSERT_EQ(RunCohort({"status", "--run-dir", run_dir, "--json"}, &json, cluster.dir() / "s.log"),
            0);
  std::istringstream lines(json);
  std::string line;
  int n = 0;
  double last_accuracy = 0;
  while (std::getline(lines, line)) {
    ++n;
    for (const char* key : {"\"round\":", "\"participants\":4", "\"dropped\":0", "\"train_loss\":",
                            "\"test_accuracy\":", "\"test_loss\":", "\"seconds\":"}) {
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    }
    last_accuracy = std::stod(line.substr(line.find("\"test_accuracy\":") + 16));
  }
  EXPECT_EQ(n, 4);
  EXPECT_GT(last_accuracy, 0.9);  // Separable synthetic data.
  std::string table;
  ASSERT_EQ(RunCohort({"status", "--run-dir", run_dir}, &table, cluster.dir() / "s.log"), 0);
  EXPECT_NE(table.find("participants"), std::string::npos);

  // Starting the finished run again changes nothing and exits 0.
  std::string out;
  EXPECT_EQ(RunCohort({"coordinator", "--config", config, "--run-dir", run_dir, "--bind",
                       "tcp://127.0.0.1:0"},
                      &out, cluster.dir() / "again.log"),
            0);
}

// A client that requires secure aggregation never sends its update in a
// plain round: it says why, the round goes on without it at the deadline,
// and it still hears when the run is over.
TEST(FederatedRunTest, AClientThatRequiresSecureAggregationSitsOutPlainRounds) {
  Cluster cluster("require-secure", 3);
  const std::string config = cluster.WriteConfig(
      "run.textproto", 2, "min_clients: 2 start_clients: 3 round_deadline_s: 2");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 3; ++k) {
    cluster.StartClient(
        k, endpoint,
        k == 2 ? std::vector<std::string>{"--require-secure"} : std::vector<std::string>{});
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
  std::string said;
  for (const auto& l : cluster.client(2).lines()) said += l + "\n";
  EXPECT_NE(said.find("requires secure aggregation"), std::string::npos) << said;
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 2u);
  for (const auto& r : rounds) {
    EXPECT_EQ(r.outcome, "committed");
    EXPECT_EQ(r.participants, 2u) << "round " << r.round;
  }
}

TEST(FederatedRunTest, SigtermStopsDaemonsCleanlyAndKeepsCommittedRounds) {
  Cluster cluster("sigterm", 2);
  const std::string config = cluster.WriteConfig("run.textproto", 100000, "min_clients: 2");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 2; ++k) cluster.StartClient(k, endpoint);
  ASSERT_TRUE(cluster.coordinator().WaitForLine("round   2/"));
  cluster.coordinator().Signal(SIGTERM);
  EXPECT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  cluster.client(0).Signal(SIGTERM);
  cluster.client(1).Signal(SIGINT);
  EXPECT_EQ(cluster.client(0).Wait(), 0);
  EXPECT_EQ(cluster.client(1).Wait(), 0);
  std::string json;
  ASSERT_EQ(RunCohort({"status", "--run-dir", run_dir, "--json"}, &json, cluster.dir() / "s.log"),
            0);
  EXPECT_NE(json.find("\"round\":2,"), std::string::npos) << json;
}

// A --fault-stop-before that names no stage is refused with every stage's
// name (aggregation/secagg_stage.h's list), before anything connects.
TEST(FederatedRunTest, AnUnknownFaultStageIsRefusedNamingTheStages) {
  Cluster cluster("fault-stage", 1);
  const std::string log = cluster.dir() / "client.log";
  EXPECT_EQ(RunCohort({"client", "--coordinator", "tcp://127.0.0.1:9", "--data", cluster.Shard(0),
                       "--fault-stop-before", "masked_inputs:2"},
                      nullptr, log),
            2);
  const std::string err = ReadFile(log);
  EXPECT_NE(err.find("client: --fault-stop-before: expected STAGE:ROUND with STAGE one of "
                     "commit_seed, advertise_keys, share_keys, check_shares, confirm_checked, "
                     "masked_input, consistency, unmasking; got \"masked_inputs:2\""),
            std::string::npos)
      << err;
}

TEST(FederatedRunTest, CorruptShardAndConfigFilesGiveClearErrors) {
  Cluster cluster("corrupt", 2);
  // A shard with one flipped byte in its feature section.
  const std::string shard = cluster.Shard(0);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  const std::string log = cluster.dir() / "client.log";
  EXPECT_EQ(
      RunCohort({"client", "--coordinator", "tcp://127.0.0.1:9", "--data", shard}, nullptr, log),
      1);
  std::string err = ReadFile(log);
  EXPECT_NE(err.find(shard), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;

  const std::string bad = cluster.dir() / "bad.textproto";
  WriteFile(bad, "seed: 1\nrounds { num_rounds: 3 min_clientz: 2 }\n");
  const std::string clog = cluster.dir() / "coord.log";
  EXPECT_EQ(
      RunCohort({"coordinator", "--config", bad, "--run-dir", cluster.dir() / "r"}, nullptr, clog),
      1);
  err = ReadFile(clog);
  EXPECT_NE(err.find("bad.textproto"), std::string::npos) << err;
  EXPECT_NE(err.find("line 2"), std::string::npos) << err;
  EXPECT_NE(err.find("min_clientz"), std::string::npos) << err;

  WriteFile(bad, "train { learning_rate: -1 }\n");
  EXPECT_EQ(
      RunCohort({"coordinator", "--config", bad, "--run-dir", cluster.dir() / "r"}, nullptr, clog),
      1);
  EXPECT_NE(ReadFile(clog).find("train.learning_rate"), std::string::npos);

  WriteFile(bad, "data { test_shard: \"/nonexistent/test.shard\" }\n");
  EXPECT_EQ(
      RunCohort({"coordinator", "--config", bad, "--run-dir", cluster.dir() / "r"}, nullptr, clog),
      1);
  EXPECT_NE(ReadFile(clog).find("/nonexistent/test.shard"), std::string::npos);
}

TEST(FederatedRunTest, UnusableDeviceIsAClearErrorAndAutoFallsBackToTheCpu) {
  Cluster cluster("device", 1);
  const std::string log = cluster.dir() / "client.log";
  // A GPU the host does not have: the client says which, and exits.
  EXPECT_EQ(RunCohort({"client", "--coordinator", "tcp://127.0.0.1:9", "--data", cluster.Shard(0),
                       "--device", "cuda:7"},
                      nullptr, log),
            1);
  std::string err = ReadFile(log);
  EXPECT_NE(err.find("--device cuda:7"), std::string::npos) << err;
  EXPECT_EQ(RunCohort({"client", "--coordinator", "tcp://127.0.0.1:9", "--data", cluster.Shard(0),
                       "--device", "tpu"},
                      nullptr, log),
            1);
  err = ReadFile(log);
  EXPECT_NE(err.find("--device tpu: must be cpu, cuda, cuda:N or auto"), std::string::npos) << err;
}

TEST(FederatedRunTest, ShardThatDoesNotFitTheModelStopsOnlyThatClient) {
  Cluster cluster("misfit", 1);
  std::string out;
  ASSERT_EQ(RunCohort({"partition", "--format", "synthetic", "--samples", "100", "--features", "30",
                       "--classes", "4", "--clients", "1", "--out", cluster.dir() / "wide"},
                      &out, cluster.dir() / "wide.log"),
            0);
  // The misfit client registers before it fails: a short client timeout
  // lets the round drop it quickly.
  const std::string config =
      cluster.WriteConfig("run.textproto", 1, "min_clients: 1 client_timeout_s: 2");
  const std::string endpoint = cluster.StartCoordinator(config, cluster.dir() / "run");
  // The coordinator's model takes 20 features; this shard has 30.
  const std::string log = cluster.dir() / "wide-client.log";
  EXPECT_EQ(RunCohort({"client", "--coordinator", endpoint, "--data",
                       cluster.dir() / "wide/client-000.shard", "--name", "wide", "--insecure"},
                      nullptr, log),
            1);
  const std::string err = ReadFile(log);
  EXPECT_NE(err.find("data has 30 features per sample, the model's input_shape 20x1x1 takes 20"),
            std::string::npos)
      << err;
  // The run goes on with a client that fits.
  cluster.StartClient(0, endpoint);
  EXPECT_TRUE(cluster.coordinator().WaitForLine("round   1/1"));
  EXPECT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
}

}  // namespace
}  // namespace cohort::testing
