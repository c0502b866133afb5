// Acceptance: 2 of 5 client processes are killed mid-round; the round closes
// at its deadline with the other 3, records the 2 as dropped, and the next
// rounds proceed.
#include <gtest/gtest.h>
#include <signal.h>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

TEST(DropoutTest, KilledClientsAreDroppedAndTheRunGoesOn) {
  Cluster cluster("dropout", 5);
  const std::string config = cluster.WriteConfig(
      "run.textproto", 4, "min_clients: 3 start_clients: 5 round_deadline_s: 3");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 3; ++k) cluster.StartClient(k, endpoint);
  // These two receive round 2's task, train, then hold their update: they are
  // killed while the round waits for them.
  for (int k = 3; k < 5; ++k) {
    cluster.StartClient(k, endpoint, {"--fault-pause-before-update-round", "2"});
  }
  for (int k = 3; k < 5; ++k) {
    ASSERT_TRUE(cluster.client(k).WaitForLine("paused before update of round 2")) << "client " << k;
    cluster.client(k).Signal(SIGKILL);
    EXPECT_EQ(cluster.client(k).Wait(), 128 + SIGKILL);
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;

  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 4u);
  EXPECT_EQ(rounds[0].participants, 5u);
  EXPECT_EQ(rounds[1].participants, 3u);
  EXPECT_EQ(rounds[1].dropped, 2u);
  EXPECT_EQ(rounds[2].participants, 3u);
  EXPECT_EQ(rounds[2].dropped, 0u);  // The dead are not selected again.
  EXPECT_EQ(rounds[3].participants, 3u);
  auto clients = std::move(store->ClientRounds(2)).value();
  int dropped = 0;
  for (const auto& c : clients) {
    if (c.status == "dropped") {
      ++dropped;
      EXPECT_TRUE(c.client == "client-003" || c.client == "client-004") << c.client;
      EXPECT_EQ(c.reason, "missed the round deadline");
    }
  }
  EXPECT_EQ(dropped, 2);
}

}  // namespace
}  // namespace cohort::testing
