// `cohort launch` across nodes, in torchrun's shape (issue 35): two
// launchers on 127.0.0.1, each a "node" of two workers, meet at one
// --master over tcp. Their run is `cohort launch --nproc 4`'s bit for bit
// (exact mode), also when a worker of node 1 is killed mid-run and both
// nodes restart from the last checkpoint. Every bad flag is an error that
// names it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>

#include "crypto/digest.h"
#include "store/run_store.h"
#include "tests/integration/harness.h"

namespace cohort::testing {
namespace {

// A TCP port that was free on 127.0.0.1 a moment ago (bound with port 0):
// both launchers must be told rank 0's port before it binds it.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("no free port on 127.0.0.1");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

class LaunchNodesTest : public ::testing::Test {
 protected:
  LaunchNodesTest() : dir_("nodes") {
    std::string out;
    const int code = RunCohort({"partition", "--format", "synthetic", "--samples", "20000",
                                "--test-samples", "200", "--features", "20", "--classes", "4",
                                "--clients", "1", "--seed", "4", "--out", dir_ / "shards"},
                               &out, dir_ / "partition.log");
    if (code != 0) throw std::runtime_error(ReadFile(dir_ / "partition.log"));
    config_ = dir_ / "exact.textproto";
    WriteFile(config_, "seed: 7\nmode: DATA_PARALLEL\ndata { train_shard: \"" +
                           (dir_ / "shards/client-000.shard") + "\" test_shard: \"" +
                           (dir_ / "shards/test.shard") +
                           "\" }\n"
                           "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
                           "train { batch_size: 4 learning_rate: 0.05 momentum: 0.5 }\n"
                           "data_parallel { epochs: " +
                           std::to_string(kEpochs) + " timeout_s: 20 exact: true }\n");
  }
  // 1250 steps an epoch (global batch 16): long enough (about 0.5 s here)
  // that a kill once epoch 1 is printed lands in the middle of the run.
  static constexpr int kEpochs = 4;

  // Node `node` of two, two workers each, meeting at 127.0.0.1:`port`.
  std::unique_ptr<Process> Node(int node, int port, const std::string& run,
                                std::vector<std::string> extra) {
    std::vector<std::string> argv = {CohortBin(),        "launch",
                                     "--nnodes",         "2",
                                     "--node-rank",      std::to_string(node),
                                     "--master",         "127.0.0.1:" + std::to_string(port),
                                     "--nproc-per-node", "2",
                                     "--config",         config_,
                                     "--run-dir",        dir_ / run};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(argv, NodeLog(run, node));
  }
  std::string NodeLog(const std::string& run, int node) {
    return dir_ / (run + "-node" + std::to_string(node) + ".log");
  }
  // The reference: four workers of one launcher, over shared memory.
  std::vector<float> OneHostModel() {
    std::string out;
    EXPECT_EQ(RunCohort({"launch", "--nproc", "4", "--config", config_, "--run-dir", dir_ / "one"},
                        &out, dir_ / "one.log"),
              0)
        << ReadFile(dir_ / "one.log");
    return FinalModel("one");
  }
  std::vector<float> FinalModel(const std::string& run) {
    auto store = OrThrow(store::OpenSqliteRunStore(dir_ / (run + "/run.db")), run);
    store::Checkpoint cp = OrThrow(store->LatestCheckpoint(), run);
    EXPECT_EQ(cp.round, uint32_t(kEpochs)) << run;
    return cp.model;
  }
  static std::string Hash(const std::vector<float>& model) {
    return crypto::Sha256Hex(
        std::string(reinterpret_cast<const char*>(model.data()), model.size() * sizeof(float)));
  }
  // Runs `cohort launch` with `flags` (and a config and run directory); its
  // exit code and stderr.
  std::pair<int, std::string> LaunchError(std::vector<std::string> flags) {
    std::vector<std::string> args = {"launch", "--config", config_, "--run-dir", dir_ / "bad"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::string out;
    std::filesystem::remove(dir_ / "bad.log");
    const int code = RunCohort(args, &out, dir_ / "bad.log");
    return {code, ReadFile(dir_ / "bad.log")};
  }
  TempDir dir_;
  std::string config_;
};

TEST_F(LaunchNodesTest, TwoNodesTrainWhatOneHostTrainsBitForBit) {
  // Every rank has its own key; all share the allowlist and pin rank 0's.
  std::string out;
  std::filesystem::create_directories(dir_ / "allow");
  for (int r = 0; r < 4; ++r) {
    const std::string name = "rank-" + std::to_string(r);
    ASSERT_EQ(
        RunCohort({"keygen", "--out", dir_ / "keys", "--name", name}, &out, dir_ / "keygen.log"), 0)
        << ReadFile(dir_ / "keygen.log");
    std::filesystem::copy_file(dir_ / ("keys/" + name + ".pub"), dir_ / ("allow/" + name + ".pub"));
  }
  const int port = FreePort();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Process>> nodes;
  for (int node : {1, 0}) {  // Node 1 first: its ranks wait for rank 0.
    nodes.push_back(Node(node, port, "two",
                         {"--keys", dir_ / "keys", "--allow", dir_ / "allow", "--master-key",
                          dir_ / "keys/rank-0.pub"}));
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(nodes[i]->Wait(std::chrono::seconds(120)), 0) << ReadFile(NodeLog("two", 1 - i));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string log0 = ReadFile(NodeLog("two", 0)), log1 = ReadFile(NodeLog("two", 1));
  EXPECT_NE(log1.find("node 1 of 2: ranks 2 to 3 of 4, meeting at tcp://127.0.0.1:" +
                      std::to_string(port) + " (127.0.0.1 here)"),
            std::string::npos)
      << log1;
  EXPECT_NE(log0.find("rank 0 of 4 ready (cpu (OpenBLAS), tcp, ZeroMQ CURVE"), std::string::npos)
      << log0;
  // Rank 0 (node 0's) printed every epoch on its launcher's stdout; node
  // 1's launcher printed none.
  EXPECT_EQ(nodes[1]->lines().size(), size_t(kEpochs));
  EXPECT_TRUE(nodes[0]->lines().empty());
  const std::vector<float> two = FinalModel("two");
  const std::vector<float> one = OneHostModel();
  std::printf("two nodes x 2 workers: model %s (%.1f s); one host x 4: model %s\n",
              Hash(two).c_str(), seconds, Hash(one).c_str());
  EXPECT_EQ(two, one);
}

// A worker of node 1 killed (SIGKILL) once rank 0 has committed epoch 1:
// node 1's launcher restarts its workers; node 0's workers lose their peer
// and fail, so its launcher restarts too; all four ranks meet again and
// resume from the last checkpoint, ending with the unkilled run's model.
TEST_F(LaunchNodesTest, AWorkerKilledOnOneNodeRestartsBothAndTheModelIsTheSame) {
  const int port = FreePort();
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Process> node1 = Node(1, port, "kill", {"--insecure", "--max-restarts", "2"});
  std::unique_ptr<Process> node0 = Node(0, port, "kill", {"--insecure", "--max-restarts", "2"});
  const std::string started = "node 1: rank 2 (local rank 0) started, pid ";
  ASSERT_TRUE(WaitForText(NodeLog("kill", 1), started)) << ReadFile(NodeLog("kill", 1));
  std::smatch pid;
  const std::string log1 = ReadFile(NodeLog("kill", 1));
  ASSERT_TRUE(
      std::regex_search(log1, pid, std::regex("rank 2 \\(local rank 0\\) started, pid ([0-9]+)\n")))
      << log1;
  ASSERT_TRUE(node0->WaitForLine("epoch   1/").has_value()) << ReadFile(NodeLog("kill", 0));
  ASSERT_EQ(kill(std::stoi(pid[1].str()), SIGKILL), 0);
  ASSERT_EQ(node1->Wait(std::chrono::seconds(120)), 0) << ReadFile(NodeLog("kill", 1));
  ASSERT_EQ(node0->Wait(std::chrono::seconds(120)), 0) << ReadFile(NodeLog("kill", 0));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // What the operator reads: which rank died, and each node's restart.
  const std::string after1 = ReadFile(NodeLog("kill", 1)), after0 = ReadFile(NodeLog("kill", 0));
  EXPECT_NE(after1.find("node 1: rank 2 was killed by signal 9; stopping the other workers"),
            std::string::npos)
      << after1;
  EXPECT_NE(after1.find("node 1: restart 1 of 2 (rank 2 was killed by signal 9): starting ranks "
                        "2-3 again from the last checkpoint"),
            std::string::npos)
      << after1;
  EXPECT_NE(after0.find("node 0: restart 1 of 2 (rank "), std::string::npos) << after0;
  EXPECT_NE(after0.find("resuming after epoch "), std::string::npos) << after0;
  const std::vector<float> killed = FinalModel("kill");
  const std::vector<float> one = OneHostModel();
  std::printf("killed and restarted: model %s (%.1f s); one host x 4: model %s\n",
              Hash(killed).c_str(), seconds, Hash(one).c_str());
  EXPECT_EQ(killed, one);
}

// A program after -- gets torchrun's variables for its global rank on its
// node, and the cohort backend's for tcp between hosts.
TEST_F(LaunchNodesTest, AProgramGetsTorchrunsVariablesOnEveryNode) {
  Process node(
      {CohortBin(), "launch", "--nnodes", "3", "--node-rank", "2", "--master", "127.0.0.1:29555",
       "--nproc-per-node", "2", "--insecure", "--", "/bin/sh", "-c",
       "echo \"rank $RANK local $LOCAL_RANK node $GROUP_RANK world $WORLD_SIZE local_world "
       "$LOCAL_WORLD_SIZE master $MASTER_ADDR:$MASTER_PORT host $COHORT_HOST insecure "
       "$COHORT_INSECURE\""},
      dir_ / "program.log");
  ASSERT_EQ(node.Wait(), 0) << ReadFile(dir_ / "program.log");
  std::vector<std::string> lines = node.lines();
  std::sort(lines.begin(), lines.end());
  ASSERT_EQ(lines.size(), 2u) << ReadFile(dir_ / "program.log");
  for (int local = 0; local < 2; ++local) {
    EXPECT_EQ(lines[local], "rank " + std::to_string(4 + local) + " local " +
                                std::to_string(local) +
                                " node 2 world 6 local_world 2 master 127.0.0.1:29555 host "
                                "127.0.0.1 insecure 1");
  }
}

TEST_F(LaunchNodesTest, BadFlagsAreErrorsNamingTheFlag) {
  const std::vector<std::string> two = {"--nnodes", "2", "--nproc-per-node", "1"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> flags = two;
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nnodes", "0"}, "--nnodes must be in [1, 1024], not 0"},
      {with({"--node-rank", "2", "--master", "127.0.0.1:29500"}),
       "--node-rank 2 is out of range: --nnodes 2 has nodes 0 to 1"},
      {with({"--node-rank", "-3", "--master", "127.0.0.1:29500"}),
       "--node-rank -3 is out of range: --nnodes 2 has nodes 0 to 1"},
      {with({"--master", "127.0.0.1:29500"}), "--node-rank is required with --nnodes 2"},
      {with({"--node-rank", "1"}), "--master HOST:PORT is required with --nnodes 2"},
      {with({"--node-rank", "1", "--master", "127.0.0.1"}),
       "--master \"127.0.0.1\": expected HOST:PORT"},
      {with({"--node-rank", "1", "--master", "127.0.0.1:70000"}),
       "--master \"127.0.0.1:70000\": the port must be a number in [1, 65535]"},
      {with({"--node-rank", "1", "--master", "tcp://127.0.0.1:x1"}),
       "the port must be a number in [1, 65535]"},
      {with({"--node-rank", "1", "--master", ":29500"}), "expected HOST:PORT"},
      {with({"--node-rank", "1", "--master", "[::1]:29500"}), "IPv6 addresses are not supported"},
      {with({"--node-rank", "1", "--master", "no-such-host.invalid:29500", "--insecure"}),
       "--master: host \"no-such-host.invalid\" does not resolve to an IPv4 address"},
      {with({"--node-rank", "1", "--master", "127.0.0.1:29500"}),
       "--master: the ranks meet over tcp and authenticate each other: give --keys DIR"},
      {with({"--node-rank", "1", "--master", "127.0.0.1:29500", "--keys", dir_.path()}),
       "--keys, --allow and --master-key go together"},
      {with({"--node-rank", "1", "--master", "127.0.0.1:29500", "--keys", dir_.path(), "--allow",
             dir_.path(), "--master-key", config_}),
       "no rank-1.key for rank 1"},
      {with(
           {"--node-rank", "1", "--master", "127.0.0.1:29500", "--insecure", "--transport", "shm"}),
       "--transport shm: ranks that meet at a --master run over tcp"},
      {{"--nnodes", "2", "--nproc", "2"}, "--nproc is one node's workers; with --nnodes 2 give "},
      {{"--nproc", "2", "--nproc-per-node", "2"}, "--nproc and --nproc-per-node: give one"},
      {{"--nproc-per-node", "0"}, "--nproc-per-node must be in [1, 256], not 0"},
      {{"--nproc", "300"}, "--nproc must be in [1, 256], not 300"},
      {{"--nproc", "2", "--host", "127.0.0.1"}, "--host: only with --master"},
      {{"--nproc", "2", "--insecure"}, "--keys and --insecure are for ranks that meet at a "},
  };
  for (const auto& [flags, message] : cases) {
    const auto [code, err] = LaunchError(flags);
    std::string line;
    for (const std::string& f : flags) line += f + " ";
    EXPECT_EQ(code, 1) << line << err;
    EXPECT_NE(err.find(message), std::string::npos) << line << "\n" << err;
    // Nothing started: no worker wrote a store.
    EXPECT_FALSE(std::filesystem::exists(dir_ / "bad/run.db")) << line;
  }
}

}  // namespace
}  // namespace cohort::testing
