// Sites that are data-parallel inside (issue 10, hierarchical mode): each
// federated client is rank 0 of a site whose `cohort site-worker` processes
// hold part of the site's data. Secure aggregation runs between the sites;
// the coordinator never hears of a worker.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <memory>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

std::vector<store::RoundRecord> Rounds(const std::string& run_dir) {
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  return std::move(store->Rounds()).value();
}

constexpr int kShards = 4;
constexpr int kRounds = 3;

// 2 sites x 2 workers against 4 single-process clients holding the same 4
// shards. A secure cohort of two needs both sites to assume the other does
// not collude with the coordinator (corrupt fraction 0, on both sides):
// with one other client, that client is the only possible colluder.
TEST(SiteTest, TwoSitesOfTwoWorkersLearnLikeFourClientsAndOnlySitesAreSeen) {
  Cluster flat("site-flat", kShards);
  std::vector<int> all;
  for (int k = 0; k < kShards; ++k) all.push_back(k);
  flat.EnableCurve(all);
  const std::string flat_config =
      flat.WriteConfig("run.textproto", kRounds, "min_clients: 4 start_clients: 4", "");
  const std::string flat_run = flat.dir() / "run";
  const std::string flat_endpoint = flat.StartCoordinator(flat_config, flat_run);
  for (int k = 0; k < kShards; ++k) flat.StartClient(k, flat_endpoint);
  ASSERT_EQ(flat.coordinator().Wait(), 0) << ReadFile(flat.coordinator_log());

  Cluster sites("site-sites", kShards);  // The same partition: the same shards.
  sites.EnableCurve({0, 2});             // Only the sites' clients are known.
  const std::string config =
      sites.WriteConfig("run.textproto", kRounds, "min_clients: 2 start_clients: 2",
                        "secagg { corrupt_fraction: 0 }");
  const std::string run = sites.dir() / "run";
  const std::string endpoint = sites.StartCoordinator(config, run);
  std::vector<std::unique_ptr<Process>> workers;
  for (int s = 0; s < 2; ++s) {
    const std::string master = "ipc://" + (sites.dir() / ("site-" + std::to_string(s)));
    sites.StartClient(2 * s, endpoint,
                      {"--site-master", master, "--site-size", "2", "--corrupt-fraction", "0"});
    workers.push_back(std::make_unique<Process>(
        std::vector<std::string>{CohortBin(), "site-worker", "--site-master", master, "--rank", "1",
                                 "--site-size", "2", "--data", sites.Shard(2 * s + 1), "--device",
                                 "cpu"},
        sites.dir() / ("worker-" + std::to_string(s) + ".log")));
  }
  ASSERT_EQ(sites.coordinator().Wait(), 0) << ReadFile(sites.coordinator_log());
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(sites.client(2 * s).Wait(), 0) << "site " << s;
    // The worker trained every round with its client, and left when the
    // client said the run was over.
    EXPECT_EQ(workers[s]->Wait(), 0) << "worker of site " << s;
    const std::string log = ReadFile(sites.dir() / ("worker-" + std::to_string(s) + ".log"));
    size_t trained = 0;
    for (size_t at = log.find("task done (trained)"); at != std::string::npos;
         at = log.find("task done (trained)", at + 1)) {
      ++trained;
    }
    EXPECT_EQ(trained, size_t{kRounds}) << log;
  }

  const auto a = Rounds(flat_run), b = Rounds(run);
  ASSERT_EQ(a.size(), size_t{kRounds});
  ASSERT_EQ(b.size(), size_t{kRounds});
  EXPECT_EQ(a.back().participants, 4u);
  EXPECT_EQ(b.back().participants, 2u);  // Sites, not workers.
  EXPECT_EQ(b.back().aggregation, "secagg+") << b.back().aggregation;
  std::printf("final test accuracy: 4 clients %.4f, 2 sites of 2 %.4f\n", a.back().test_accuracy,
              b.back().test_accuracy);
  EXPECT_NEAR(b.back().test_accuracy, a.back().test_accuracy, 0.01);
  EXPECT_GT(b.back().test_accuracy, 0.8);
  // The coordinator never heard of a worker's shard.
  const std::string log = ReadFile(sites.coordinator_log());
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(log.find(ClientName(2 * s + 1)), std::string::npos) << log;
  }
}

// A site whose ranks meet over tcp: its worker and its client authenticate
// each other with their identity keys (CURVE), and a worker with a key
// outside the site's allowlist never joins it.
TEST(SiteTest, ASiteOverTcpTrainsOnlyWithItsAuthenticatedWorker) {
  Cluster c("site-tcp", 3);
  c.EnableCurve({0});  // The coordinator knows the site's client only.
  std::filesystem::create_directories(c.dir() / "site-allow");
  for (int k : {0, 1}) {
    const std::string name = ClientName(k) + ".pub";
    std::filesystem::copy_file(c.dir() / ("keys/" + name), c.dir() / ("site-allow/" + name));
  }
  const std::string config = c.WriteConfig("run.textproto", 2, "min_clients: 1 start_clients: 1");
  const std::string endpoint = c.StartCoordinator(config, c.dir() / "run");
  const std::string master = "ipc://" + (c.dir() / "site");
  c.StartClient(0, endpoint,
                {"--site-master", master, "--site-size", "2", "--site-transport", "tcp",
                 "--site-allow", c.dir() / "site-allow", "--site-no-encryption"});
  // A stranger holds its own key and lists it with the client's in its own
  // allowlist: everything it controls says it belongs.
  std::filesystem::create_directories(c.dir() / "stranger-allow");
  for (int k : {0, 2}) {
    const std::string name = ClientName(k) + ".pub";
    std::filesystem::copy_file(c.dir() / ("keys/" + name), c.dir() / ("stranger-allow/" + name));
  }
  auto worker = [&](int k, const std::string& allow, const std::string& log) {
    return std::make_unique<Process>(
        std::vector<std::string>{CohortBin(),      "site-worker",
                                 "--site-master",  master,
                                 "--rank",         "1",
                                 "--site-size",    "2",
                                 "--transport",    "tcp",
                                 "--data",         c.Shard(k),
                                 "--device",       "cpu",
                                 "--identity",     c.dir() / ("keys/" + ClientName(k) + ".key"),
                                 "--allow",        c.dir() / allow,
                                 "--master-key",   c.dir() / ("keys/" + ClientName(0) + ".pub"),
                                 "--no-encryption"},
        c.dir() / log);
  };
  // The client refuses the stranger's handshake (it never counts as rank 1)
  // and the run goes on with the real worker.
  auto stranger = worker(2, "stranger-allow", "stranger.log");
  ASSERT_TRUE(WaitForText(c.dir() / "client-0.log", "is not in the allowlist"))
      << ReadFile(c.dir() / "client-0.log") << ReadFile(c.dir() / "stranger.log");
  auto real = worker(1, "site-allow", "worker.log");
  ASSERT_EQ(c.coordinator().Wait(), 0) << ReadFile(c.coordinator_log());
  EXPECT_EQ(c.client(0).Wait(), 0) << ReadFile(c.dir() / "client-0.log");
  EXPECT_EQ(real->Wait(), 0) << ReadFile(c.dir() / "worker.log");
  const std::string log = ReadFile(c.dir() / "worker.log");
  EXPECT_NE(log.find("tcp: authenticated, not encrypted"), std::string::npos) << log;
  EXPECT_NE(log.find("task done (trained)"), std::string::npos) << log;
  // The stranger was never let in: it is still waiting to meet the site.
  stranger->Signal(SIGTERM);
  stranger->Wait();
  const std::string stranger_log = ReadFile(c.dir() / "stranger.log");
  EXPECT_EQ(stranger_log.find("site rank 1 of 2"), std::string::npos) << stranger_log;
  EXPECT_EQ(stranger_log.find("task done"), std::string::npos) << stranger_log;
  EXPECT_EQ(Rounds(c.dir() / "run").back().participants, 1u);
}

}  // namespace
}  // namespace cohort::testing
