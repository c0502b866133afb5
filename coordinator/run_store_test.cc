#include "coordinator/run_store.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace cohort::coordinator {
namespace {

Checkpoint Cp(uint32_t round, float v) { return {round, std::vector<float>(5, v), {}}; }

TEST(RunStoreTest, CommittedRoundsSurviveReopening) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("cohort_store_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/run.db";
  {
    auto store = std::move(OpenSqliteRunStore(path)).value();
    auto run = store->LoadRun();
    ASSERT_TRUE(run.ok());
    EXPECT_FALSE(run->has_value());
    ASSERT_TRUE(store->CreateRun({"name: \"x\"", 7, "v1", 0}, Cp(0, 0.5f)).ok());
    RoundRecord r;
    r.round = 1;
    r.participants = 2;
    r.selected = 3;
    r.dropped = 1;
    r.test_accuracy = 0.75;
    std::vector<ClientRoundRecord> clients(2);
    clients[0] = {"a", "ok", "", 10, 0.5, 0.8, 1.0, ""};
    clients[1].client = "b";
    clients[1].status = "dropped";
    clients[1].reason = "missed the round deadline";
    clients[1].stage = "share_keys";
    r.aggregation = "secagg+";
    ASSERT_TRUE(store->CommitRound(r, clients, Cp(1, 1.5f), 3).ok());
  }
  auto store = std::move(OpenSqliteRunStore(path)).value();
  auto run = store->LoadRun();
  ASSERT_TRUE(run.ok() && run->has_value());
  EXPECT_EQ((*run)->seed, 7u);
  EXPECT_EQ((*run)->last_round, 1u);
  auto cp = store->LatestCheckpoint();
  ASSERT_TRUE(cp.ok());
  EXPECT_EQ(cp->round, 1u);
  EXPECT_EQ(cp->model, std::vector<float>(5, 1.5f));
  auto rounds = store->Rounds();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].dropped, 1u);
  EXPECT_DOUBLE_EQ((*rounds)[0].test_accuracy, 0.75);
  EXPECT_EQ((*rounds)[0].aggregation, "secagg+");
  EXPECT_EQ((*rounds)[0].outcome, "committed");
  auto clients = store->ClientRounds(1);
  ASSERT_EQ(clients->size(), 2u);
  EXPECT_EQ((*clients)[1].reason, "missed the round deadline");
  EXPECT_EQ((*clients)[1].stage, "share_keys");
  std::filesystem::remove_all(dir);
}

TEST(RunStoreTest, OutOfOrderCommitIsRefusedAndChangesNothing) {
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  RoundRecord r;
  r.round = 2;
  EXPECT_EQ(store->CommitRound(r, {}, Cp(2, 2), 3).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->LatestCheckpoint()->round, 0u);
  EXPECT_TRUE(store->Rounds()->empty());
  EXPECT_EQ(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).code(), StatusCode::kAlreadyExists);
}

TEST(RunStoreTest, KeepsOnlyTheNewestCheckpoints) {
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  for (uint32_t i = 1; i <= 5; ++i) {
    RoundRecord r;
    r.round = i;
    ASSERT_TRUE(store->CommitRound(r, {}, Cp(i, static_cast<float>(i)), 2).ok());
  }
  EXPECT_EQ(store->LatestCheckpoint()->model[0], 5.0f);
  EXPECT_EQ(store->Rounds()->size(), 5u);
}

}  // namespace
}  // namespace cohort::coordinator
