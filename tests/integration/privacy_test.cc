// Central differential privacy end to end (issue 34, acceptance 5's central
// half): `cohort simulate` runs DP-FedAvg until the next round would pass
// the budget, stopping at the round the accountant predicts; `cohort
// status` shows epsilon; the noise key is kept beside the store, 0600; a
// restart stops again; central DP with secure aggregation is refused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <sstream>
#include <string>
#include <vector>

#include "coordinator/secagg_plan.h"
#include "privacy/rdp_accountant.h"
#include "privacy/rdp_wor.h"
#include "privacy/skellam.h"
#include "proto/config_io.h"
#include "store/run_store.h"
#include "tests/integration/harness.h"

namespace cohort::testing {
namespace {

std::string Config(const std::string& secagg, double budget) {
  return "seed: 5\n"
         "data { partition { format: \"synthetic\" samples: 1200 test_samples: 400 "
         "features: 20 classes: 4 clients: 10 scheme: \"iid\" seed: 3 } }\n"
         "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
         "train { batch_size: 16 learning_rate: 0.05 }\n"
         "net { heartbeat_s: 0.5 }\n"
         "rounds { num_rounds: 20 min_clients: 2 start_clients: 10 fraction: 0.5 }\n"
         "secagg { aggregation: " +
         secagg +
         " }\n"
         "privacy { noise_multiplier: 1.0 clip_norm: 1.0 target_delta: 1e-5 epsilon_budget: " +
         std::to_string(budget) + " }\n";
}

TEST(PrivacyRunTest, StopsWhereTheAccountantSaysAndStatusShowsEpsilon) {
  // 5 of 10 clients a round: q = 0.5. Room for 3 rounds, not 4.
  std::vector<double> eps;
  privacy::RdpAccountant accountant;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(privacy::ComposeSampledWithoutReplacement(accountant, 0.5, 1.0 / 2).ok());
    eps.push_back(accountant.Spent(1e-5)->epsilon);
  }
  const double budget = (eps[2] + eps[3]) / 2;
  TempDir dir("privacy");
  const std::string config = dir / "dp.textproto";
  WriteFile(config, Config("PLAIN", budget));
  std::string out;
  ASSERT_EQ(
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "run"}, &out, dir / "sim.log"),
      0)
      << ReadFile(dir / "sim.log");
  const std::string log = ReadFile(dir / "sim.log");
  EXPECT_NE(log.find("privacy budget spent: ε="), std::string::npos) << log;
  EXPECT_NE(log.find("the run stops after round 3"), std::string::npos) << log;
  {
    auto store = std::move(store::OpenSqliteRunStore(dir / "run/run.db")).value();
    auto rounds = std::move(store->Rounds()).value();
    ASSERT_EQ(rounds.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(rounds[r].selected, 5u);
      EXPECT_EQ(rounds[r].dp_sampling_rate, 0.5);
      EXPECT_NEAR(rounds[r].dp_epsilon, eps[r], 1e-9);
    }
  }
  struct stat st = {};
  ASSERT_EQ(::stat((dir / "run/privacy_noise.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  ASSERT_EQ(RunCohort({"status", "--run-dir", dir / "run"}, &out, dir / "status.log"), 0);
  char line[160];
  std::snprintf(line, sizeof(line),
                "privacy: DP-FedAvg, noise multiplier 1, clip norm 1; epsilon %.4g at delta "
                "1e-05 after round 3",
                eps[2]);
  EXPECT_NE(out.find(line), std::string::npos) << out;
  // The accountant's assumption, beside the figure it qualifies.
  EXPECT_NE(out.find("), accounted as a fixed-size cohort sampled without replacement at "
                     "q=0.5, replace-one adjacency (noise multiplier 1 / 2: a replaced client "
                     "moves the sum by up to 2 x clip norm; docs/privacy.md)\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  epsilon\n"), std::string::npos) << out;

  // Started again, it stops again before round 4 and commits nothing.
  ASSERT_EQ(
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "run"}, &out, dir / "sim2.log"),
      0)
      << ReadFile(dir / "sim2.log");
  EXPECT_NE(ReadFile(dir / "sim2.log").find("privacy budget spent"), std::string::npos);
  auto store = std::move(store::OpenSqliteRunStore(dir / "run/run.db")).value();
  EXPECT_EQ(std::move(store->Rounds()).value().size(), 3u);
}

// Distributed DP under SecAgg+, 5 of 10 clients a round (q = 0.5), its
// budget on the released model's view (privacy.budget_view RELEASED_MODEL):
// `cohort simulate` stops where that view's accountant says, naming the
// view; the store records both views every round; `cohort status` shows
// both, each named with whom it holds against.
std::string DistributedConfig(double budget) {
  return "seed: 5\n"
         "data { partition { format: \"synthetic\" samples: 1200 test_samples: 400 "
         "features: 20 classes: 4 clients: 10 scheme: \"iid\" seed: 3 } }\n"
         "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
         "train { batch_size: 16 learning_rate: 0.05 }\n"
         "net { heartbeat_s: 0.5 }\n"
         "rounds { num_rounds: 20 min_clients: 2 start_clients: 10 fraction: 0.5 "
         "max_clients_per_round: 5 }\n"
         "secagg { aggregation: SECAGG_PLUS }\n"
         "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 2.0 clip_norm: 1.0 "
         "target_delta: 1e-5 budget_view: RELEASED_MODEL epsilon_budget: " +
         std::to_string(budget) + " }\n";
}

TEST(PrivacyRunTest, DistributedDpStopsOnTheReleasedModelViewAndStatusShowsBothViews) {
  // The grid depends on the model's size (404 values: 20x16 + 16 + 16x4 +
  // 4) and the fewest survivors a round commits with.
  auto parsed = config::ParseRunConfig(DistributedConfig(1), "ddp.textproto");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto params =
      privacy::ChooseSkellamParams(1.0, 2.0, 5, coordinator::MinRoundClients(*parsed), 404);
  ASSERT_TRUE(params.ok()) << params.status();
  std::vector<double> against, released;
  privacy::RdpAccountant a, r;
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(privacy::ChargeSkellamRounds(a, *params).ok());
    ASSERT_TRUE(privacy::ChargeSkellamRoundsForReleasedModel(r, *params, 0.5).ok());
    against.push_back(a.Spent(1e-5)->epsilon);
    released.push_back(r.Spent(1e-5)->epsilon);
  }
  const double budget = (released[2] + released[3]) / 2;  // Room for 3 rounds, not 4.
  TempDir dir("privacy_ddp");
  const std::string config = dir / "ddp.textproto";
  WriteFile(config, DistributedConfig(budget));
  std::string out;
  ASSERT_EQ(RunCohort({"simulate", "--config", config, "--run-dir", dir / "run", "--json"}, &out,
                      dir / "sim.log"),
            0)
      << ReadFile(dir / "sim.log");
  // Each round's JSON line carries both views.
  EXPECT_NE(out.find("\"privacy\":{\"sampling_rate\":0.5,\"epsilon\":"), std::string::npos) << out;
  EXPECT_NE(out.find(",\"epsilon_released_model\":"), std::string::npos) << out;
  // The clients leave the metric slots empty under distributed DP: the
  // coordinator does not know the training loss, and says so.
  EXPECT_NE(out.find("\"train_loss\":null"), std::string::npos) << out;
  EXPECT_EQ(out.find("\"train_loss\":0"), std::string::npos) << out;
  const std::string log = ReadFile(dir / "sim.log");
  ASSERT_NE(log.find("privacy: distributed DP (Skellam) over 404 values"), std::string::npos)
      << log;
  char stop[128];
  std::snprintf(stop, sizeof(stop),
                "privacy budget spent: ε for the released model=%.4g > %.4g (round 4, 5 of 10",
                released[3], budget);
  EXPECT_NE(log.find(stop), std::string::npos) << log;
  EXPECT_NE(log.find("the run stops after round 3"), std::string::npos) << log;
  {
    auto store = std::move(store::OpenSqliteRunStore(dir / "run/run.db")).value();
    auto rounds = std::move(store->Rounds()).value();
    ASSERT_EQ(rounds.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(rounds[k].dp_sampling_rate, 0.5);
      EXPECT_NEAR(rounds[k].dp_epsilon, against[k], 1e-9 * against[k]);
      EXPECT_NEAR(rounds[k].dp_epsilon_released_model, released[k], 1e-9 * released[k]);
      EXPECT_EQ(rounds[k].train_loss, -1) << "round " << k + 1;
    }
  }
  ASSERT_EQ(RunCohort({"status", "--run-dir", dir / "run"}, &out, dir / "status.log"), 0);
  // Up to the budget (which prints as Number() writes it), then after it.
  char line[640];
  std::snprintf(
      line, sizeof(line),
      "privacy: distributed DP (Skellam noise from the clients under secure aggregation), noise "
      "multiplier 2, clip norm 1; epsilon %.4g against the coordinator (who picks the cohorts: "
      "no amplification by sampling) and %.4g for the released model (amplified by the cohort's "
      "sampling without replacement at q=0.5; holds only while cohort membership stays secret) "
      "at delta 1e-05 after round 3 (budget ",
      against[2], released[2]);
  EXPECT_NE(out.find(line), std::string::npos) << out;
  EXPECT_NE(out.find(" for the released model); replace-one adjacency (a replaced client moves "
                     "the sum by up to 2 x its clipped, rounded update; docs/privacy.md)\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  epsilon  released\n"), std::string::npos) << out;
  // Round 1's row: "-" where the train loss would be.
  const size_t row = out.find("\n    1 ");
  ASSERT_NE(row, std::string::npos) << out;
  std::istringstream fields(out.substr(row + 1, out.find('\n', row + 1) - row - 1));
  std::string field;
  for (int k = 0; k < 5; ++k) fields >> field;  // round, agg, participants, dropped, train_loss.
  EXPECT_EQ(field, "-") << out;
  // And in the CSV, an empty field.
  ASSERT_EQ(RunCohort({"status", "--run-dir", dir / "run", "--csv"}, &out, dir / "status.log"), 0);
  const size_t csv_row = out.find("\n1,");
  ASSERT_NE(csv_row, std::string::npos) << out;
  std::istringstream cells(out.substr(csv_row + 1, out.find('\n', csv_row + 1) - csv_row - 1));
  for (int k = 0; k < 8; ++k) std::getline(cells, field, ',');  // ... dropped, train_loss.
  EXPECT_EQ(field, "") << out;
}

TEST(PrivacyRunTest, CentralPrivacyUnderSecureAggregationIsRefused) {
  TempDir dir("privacy_secagg");
  const std::string config = dir / "dp.textproto";
  WriteFile(config, Config("SECAGG_PLUS", 0));
  std::string out;
  EXPECT_NE(
      RunCohort({"simulate", "--config", config, "--run-dir", dir / "run"}, &out, dir / "sim.log"),
      0);
  const std::string log = ReadFile(dir / "sim.log");
  EXPECT_NE(log.find("privacy: central differential privacy clips and noises each update on "
                     "the coordinator, but secagg.aggregation SECAGG_PLUS hides the updates"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace cohort::testing
