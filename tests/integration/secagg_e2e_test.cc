// Acceptance for secure aggregation with real daemons on loopback: the sum
// the coordinator unmasks equals the sum of the clients' fixed-point inputs
// exactly; clients that leave at any stage cost the round nothing while at
// least t remain; below t the round aborts, reveals nothing, and the run
// goes on.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

std::vector<uint32_t> ReadU32(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<uint32_t> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::vector<std::string> Names(const std::string& path) {
  std::istringstream in(ReadFile(path));
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

// The coordinator's unmasked sum of `round` against the clients' own
// encoded inputs, summed here mod 2^32. Returns the names in the sum.
std::vector<std::string> ExpectExactSum(const std::string& dumps, uint32_t round) {
  const std::string base = dumps + "/round-" + std::to_string(round);
  const std::vector<uint32_t> sum = ReadU32(base + ".u32");
  const std::vector<std::string> names = Names(base + ".names");
  EXPECT_FALSE(sum.empty()) << "round " << round;
  std::vector<uint32_t> expected(sum.size(), 0);
  for (const auto& name : names) {
    const auto input = ReadU32(dumps + "/" + name + ".round-" + std::to_string(round) + ".u32");
    EXPECT_EQ(input.size(), sum.size()) << name;
    for (size_t i = 0; i < std::min(input.size(), sum.size()); ++i) expected[i] += input[i];
  }
  EXPECT_EQ(sum, expected) << "round " << round << ": unmasked sum differs from the inputs' sum";
  // Not the trivial case: the inputs are not all zero.
  EXPECT_NE(expected, std::vector<uint32_t>(sum.size(), 0));
  return names;
}

std::vector<std::string> Args(const std::string& dumps, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--dump-inputs", dumps});
  return extra;
}

TEST(SecAggE2eTest, UnmaskedSumIsExactOverCurveAndTheModelLearns) {
  constexpr int kClients = 6;
  Cluster cluster("secagg-exact", kClients);
  std::vector<int> all;
  for (int k = 0; k < kClients; ++k) all.push_back(k);
  cluster.EnableCurve(all);
  // Default aggregation: SecAgg+ (complete graph at this size).
  const std::string config = cluster.WriteConfig(
      "run.textproto", 3, "min_clients: 6 start_clients: 6 round_deadline_s: 30", "");
  const std::string run_dir = cluster.dir() / "run";
  const std::string dumps = cluster.dir() / "dumps";
  std::filesystem::create_directories(dumps);
  const std::string endpoint =
      cluster.StartCoordinator(config, run_dir, "tcp://127.0.0.1:0", {"--dump-sums", dumps});
  // Each client checks the cohort against its own copy of the allowlist.
  const std::string peers = cluster.dir() / "allow";
  for (int k = 0; k < kClients; ++k) {
    cluster.StartClient(k, endpoint, Args(dumps, {"--peers", peers}));
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < kClients; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;

  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 3u);
  for (const auto& r : rounds) {
    EXPECT_EQ(r.aggregation, "secagg+");
    EXPECT_EQ(r.outcome, "committed");
    EXPECT_EQ(r.participants, 6u);
    EXPECT_EQ(ExpectExactSum(dumps, r.round).size(), 6u);
  }
  // The decoded mean trains the model as plain FedAvg would.
  EXPECT_GT(rounds.back().test_accuracy, 0.8);
  EXPECT_LT(rounds.back().test_loss, rounds.front().test_loss);
}

TEST(SecAggE2eTest, ClientsLeavingAtEachStageCostTheRoundNothing) {
  constexpr int kClients = 7;
  Cluster cluster("secagg-dropout", kClients);
  const std::string config =
      cluster.WriteConfig("run.textproto", 8, "min_clients: 3 start_clients: 7 round_deadline_s: 4",
                          "secagg { aggregation: SECAGG stage_timeout_s: 1.5 mask_prg: CHACHA20 }");
  const std::string run_dir = cluster.dir() / "run";
  const std::string dumps = cluster.dir() / "dumps";
  std::filesystem::create_directories(dumps);
  const std::string endpoint =
      cluster.StartCoordinator(config, run_dir, "tcp://127.0.0.1:0", {"--dump-sums", dumps});
  // Client k goes silent at stage k of round k + 2 (client 0 has not come
  // back yet in round 2, so cohorts have 6 or 7 clients: t = 4 of 5 or 6
  // neighbours, one of which may be corrupt).
  // ChaCha20 masks here; the CURVE test above uses the default AES-128-CTR.
  const std::vector<std::string> stages = {"advertise_keys", "share_keys",  "check_shares",
                                           "masked_input",   "consistency", "unmasking"};
  for (int k = 0; k < static_cast<int>(stages.size()); ++k) {
    cluster.StartClient(
        k, endpoint, Args(dumps, {"--fault-stop-before", stages[k] + ":" + std::to_string(k + 2)}));
  }
  cluster.StartClient(6, endpoint, Args(dumps, {}));
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < static_cast<int>(stages.size()); ++k) {
    EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
    EXPECT_TRUE(cluster.client(k).WaitForLine("paused before " + stages[k] + " of round " +
                                              std::to_string(k + 2)))
        << "client " << k;
  }

  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 8u);
  for (int k = 0; k < static_cast<int>(stages.size()); ++k) {
    const uint32_t round = static_cast<uint32_t>(k + 2);
    const auto& r = rounds[round - 1];
    EXPECT_EQ(r.aggregation, "secagg");
    EXPECT_EQ(r.outcome, "committed") << "round " << round;
    const std::string name = ClientName(k);
    bool found = false;
    const auto clients = std::move(store->ClientRounds(round)).value();
    for (const auto& c : clients) {
      if (c.client != name) continue;
      found = true;
      EXPECT_EQ(c.stage, stages[k]) << "round " << round;
      // After its masked input, a client's update is in the sum.
      EXPECT_EQ(c.status, k >= 4 ? "ok" : "dropped") << "round " << round;
    }
    EXPECT_TRUE(found) << name << " in round " << round;
    const auto names = ExpectExactSum(dumps, round);
    const bool counted = std::find(names.begin(), names.end(), name) != names.end();
    EXPECT_EQ(counted, k >= 4) << name << " in round " << round;
    EXPECT_GE(names.size(), 3u);
  }
}

TEST(SecAggE2eTest, BelowThresholdTheRoundAbortsRevealsNothingAndTheRunGoesOn) {
  constexpr int kClients = 5;
  Cluster cluster("secagg-abort", kClients);
  const std::string config =
      cluster.WriteConfig("run.textproto", 3, "min_clients: 3 start_clients: 5 round_deadline_s: 3",
                          "secagg { aggregation: SECAGG stage_timeout_s: 1.5 }");
  const std::string run_dir = cluster.dir() / "run";
  const std::string dumps = cluster.dir() / "dumps";
  std::filesystem::create_directories(dumps);
  const std::string endpoint =
      cluster.StartCoordinator(config, run_dir, "tcp://127.0.0.1:0", {"--dump-sums", dumps});
  // Three of five withhold their masked input in round 2: 2 < t = 3.
  for (int k = 0; k < kClients; ++k) {
    cluster.StartClient(
        k, endpoint,
        Args(dumps, k < 3 ? std::vector<std::string>{"--fault-stop-before", "masked_input:2"}
                          : std::vector<std::string>{}));
  }
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < kClients; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;

  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_EQ(rounds[0].outcome, "committed");
  EXPECT_EQ(rounds[1].outcome, "aborted");
  EXPECT_EQ(rounds[1].participants, 0u);
  // The model is unchanged: the same evaluation, bit for bit.
  EXPECT_EQ(rounds[1].test_loss, rounds[0].test_loss);
  EXPECT_EQ(rounds[2].outcome, "committed");
  EXPECT_GE(rounds[2].participants, 3u);
  // Nothing was unmasked in round 2: the coordinator never held a sum.
  EXPECT_FALSE(std::filesystem::exists(dumps + "/round-2.u32"));
  ExpectExactSum(dumps, 1);
  ExpectExactSum(dumps, 3);
  EXPECT_NE(ReadFile(cluster.coordinator_log()).find("masked inputs, need 3"), std::string::npos);
}

}  // namespace
}  // namespace cohort::testing
