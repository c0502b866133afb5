// Sites that are data-parallel inside (issue 10, hierarchical mode): each
// federated client is rank 0 of a site whose `cohort site-worker` processes
// hold part of the site's data. Secure aggregation runs between the sites;
// the coordinator never hears of a worker.
#include <gtest/gtest.h>

#include <memory>

#include "coordinator/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

std::vector<coordinator::RoundRecord> Rounds(const std::string& run_dir) {
  auto store = std::move(coordinator::OpenSqliteRunStore(run_dir + "/run.db")).value();
  return std::move(store->Rounds()).value();
}

constexpr int kShards = 6;
constexpr int kRounds = 3;

// SecAgg+ needs at least 3 clients, so the 2 sites x 2 workers
// become 3 sites x 2 workers, against 6 single-process clients holding the
// same 6 shards.
TEST(SiteTest, ThreeSitesOfTwoWorkersLearnLikeSixClientsAndOnlySitesAreSeen) {
  Cluster flat("site-flat", kShards);
  std::vector<int> all;
  for (int k = 0; k < kShards; ++k) all.push_back(k);
  flat.EnableCurve(all);
  const std::string flat_config =
      flat.WriteConfig("run.textproto", kRounds, "min_clients: 6 start_clients: 6", "");
  const std::string flat_run = flat.dir() / "run";
  const std::string flat_endpoint = flat.StartCoordinator(flat_config, flat_run);
  for (int k = 0; k < kShards; ++k) flat.StartClient(k, flat_endpoint);
  ASSERT_EQ(flat.coordinator().Wait(), 0) << ReadFile(flat.coordinator_log());

  Cluster sites("site-sites", kShards);  // The same partition: the same shards.
  sites.EnableCurve({0, 2, 4});          // Only the sites' clients are known.
  const std::string config =
      sites.WriteConfig("run.textproto", kRounds, "min_clients: 3 start_clients: 3", "");
  const std::string run = sites.dir() / "run";
  const std::string endpoint = sites.StartCoordinator(config, run);
  std::vector<std::unique_ptr<Process>> workers;
  for (int s = 0; s < 3; ++s) {
    const std::string master = "ipc://" + (sites.dir() / ("site-" + std::to_string(s)));
    sites.StartClient(2 * s, endpoint, {"--site-master", master, "--site-size", "2"});
    workers.push_back(std::make_unique<Process>(
        std::vector<std::string>{CohortBin(), "site-worker", "--site-master", master, "--rank", "1",
                                 "--site-size", "2", "--data", sites.Shard(2 * s + 1), "--device",
                                 "cpu"},
        sites.dir() / ("worker-" + std::to_string(s) + ".log")));
  }
  ASSERT_EQ(sites.coordinator().Wait(), 0) << ReadFile(sites.coordinator_log());
  for (int s = 0; s < 3; ++s) {
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
  EXPECT_EQ(a.back().participants, 6u);
  EXPECT_EQ(b.back().participants, 3u);  // Sites, not workers.
  EXPECT_EQ(b.back().aggregation, "secagg+") << b.back().aggregation;
  std::printf("final test accuracy: 6 clients %.4f, 3 sites of 2 %.4f\n", a.back().test_accuracy,
              b.back().test_accuracy);
  EXPECT_NEAR(b.back().test_accuracy, a.back().test_accuracy, 0.01);
  EXPECT_GT(b.back().test_accuracy, 0.8);
  // The coordinator never heard of a worker's shard.
  const std::string log = ReadFile(sites.coordinator_log());
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(log.find(ClientName(2 * s + 1)), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace cohort::testing
