// SCAFFOLD (train.scaffold) end to end on one round against plain NumPy
// (tests/data/make_scaffold_golden.py): the client's corrected local steps
// (train::TrainLocal), its new control variate (aggregation/scaffold.h),
// the plain round's sums and the server's step (ScaffoldStrategy over
// FedAvg); then what a resume and a bad checkpoint do.
#include "coordinator/strategy_scaffold.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "aggregation/aggregator.h"
#include "aggregation/scaffold.h"
#include "datasets/dataset.h"
#include "proto/config.pb.h"
#include "train/backend.h"
#include "train/model.h"
#include "train/model_config.h"
#include "train/trainer.h"

namespace cohort::coordinator {
namespace {

struct GoldenClient {
  std::string name;
  uint32_t lo = 0, hi = 0, epochs = 0;
  float lr = 0, momentum = 0, weight_decay = 0;
  std::map<std::string, std::vector<double>> rows;  // ci, local, ci_plus, delta_c.
};

struct Golden {
  std::map<std::string, std::vector<double>> rows;  // start, c, features, labels, x, c_new.
  std::vector<GoldenClient> clients;
  uint64_t population = 0;
  double eta_g = 0;
};

std::vector<double> Rest(std::istringstream& f) {
  std::vector<double> out;
  double v;
  while (f >> v) out.push_back(v);
  return out;
}

Golden ReadGolden() {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/scaffold_golden.txt");
  Golden g;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string tag;
    f >> tag;
    if (tag == "client") {
      GoldenClient c;
      f >> c.name >> c.lo >> c.hi >> c.epochs >> c.lr >> c.momentum >> c.weight_decay;
      g.clients.push_back(c);
    } else if (tag == "server") {
      f >> g.population >> g.eta_g;
    } else if (!g.clients.empty() && g.population == 0) {
      g.clients.back().rows[tag] = Rest(f);
    } else {
      g.rows[tag] = Rest(f);
    }
  }
  return g;
}

std::vector<float> Floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

void ExpectNear(std::span<const float> got, const std::vector<double>& want, double tolerance,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * std::max(1.0, std::fabs(want[i])))
        << what << ", value " << i;
  }
}

config::RunConfig ScaffoldConfig() {
  config::RunConfig c;
  c.mutable_train()->set_scaffold(true);
  return c;
}

// The golden round: two clients of four, different shards, step counts,
// learning rates and momentum; the server's FedAvg step (server lr 1).
// Tolerance: 1e-5 relative for the local models (two float32 trainings
// that differ only in summation order), 1e-4 for c_i+ and Δc_i, which
// divide the models' difference by K lr (0.1 to 0.3).
TEST(ScaffoldTest, OneRoundMatchesNumPyGoldenVectors) {
  const Golden g = ReadGolden();
  ASSERT_EQ(g.clients.size(), 2u) << "tests/data/scaffold_golden.txt";
  auto backend = std::move(train::NewCpuBackend(1)).value();
  config::ModelConfig mc;
  mc.set_arch("mlp");
  mc.set_input_dim(6);
  mc.set_num_classes(3);
  mc.add_hidden(5);
  auto model = std::move(train::BuildModel(mc, backend.get())).value();
  const std::vector<float> start = Floats(g.rows.at("start"));
  const std::vector<float> c = Floats(g.rows.at("c"));
  ASSERT_EQ(start.size(), model->num_params());
  const size_t n = start.size();

  auto sums = std::move(aggregation::NewScaffoldFedAvg(n, 0)).value();
  uint32_t participant = 0;
  for (const GoldenClient& client : g.clients) {
    datasets::Dataset shard{6, 3, {}, {}};
    for (uint32_t i = client.lo; i < client.hi; ++i) {
      for (int j = 0; j < 6; ++j) shard.features.push_back(g.rows.at("features")[i * 6 + j]);
      shard.labels.push_back(static_cast<int32_t>(g.rows.at("labels")[i]));
    }
    auto data = std::move(train::DeviceDataset::Upload(backend.get(), shard)).value();
    const std::vector<float> ci = Floats(client.rows.at("ci"));
    train::TrainOptions options;
    options.epochs = client.epochs;
    options.batch_size = 64;  // The whole shard: one step per epoch.
    options.optimizer = {.learning_rate = client.lr,
                         .weight_decay = client.weight_decay,
                         .momentum = client.momentum};
    options.seed = 7;
    for (size_t j = 0; j < n; ++j) options.scaffold_correction.push_back(c[j] - ci[j]);
    std::vector<float> local = start;
    auto result = train::TrainLocal(*model, local, *data, options);
    ASSERT_TRUE(result.ok()) << result.status().message();
    EXPECT_EQ(result->steps, client.epochs);
    ExpectNear(local, client.rows.at("local"), 1e-5, "client " + client.name + " local model");

    std::vector<float> ci_plus(n), delta_c(n);
    ASSERT_TRUE(aggregation::ScaffoldClientVariate(start, local, c, ci, result->steps, client.lr,
                                                   ci_plus, delta_c)
                    .ok());
    ExpectNear(ci_plus, client.rows.at("ci_plus"), 1e-4, "client " + client.name + " c_i+");
    ExpectNear(delta_c, client.rows.at("delta_c"), 1e-4, "client " + client.name + " delta c_i");

    std::vector<float> update(2 * n);
    for (size_t j = 0; j < n; ++j) {
      update[j] = local[j] - start[j];
      update[n + j] = delta_c[j];
    }
    ASSERT_TRUE(sums->Accept(participant++, update, client.hi - client.lo).ok());
  }
  auto mean = std::move(sums->Finalize()).value();
  ASSERT_EQ(mean.delta.size(), 2 * n);

  auto strategy =
      std::move(ScaffoldStrategy::Wrap(std::move(MakeStrategy(ScaffoldConfig())).value(),
                                       ScaffoldConfig()))
          .value();
  store::Checkpoint initial{0, start, {}};
  strategy->SaveState(initial);
  EXPECT_EQ(initial.velocity, std::vector<float>(n, 0.0f)) << "c starts at zeros";
  // The golden round starts from a given c: load it as a resume would.
  store::Checkpoint given{0, start, c};
  ASSERT_TRUE(strategy->LoadState(given).ok());
  std::vector<double> sum(mean.delta.begin() + static_cast<ptrdiff_t>(n), mean.delta.end());
  ASSERT_TRUE(strategy->SetVariateSum(sum, g.population).ok());
  std::vector<float> x = start;
  ASSERT_TRUE(strategy->Aggregate(std::span<const float>(mean.delta).first(n), x).ok());
  ExpectNear(x, g.rows.at("x"), 1e-5, "server x");
  EXPECT_TRUE(std::equal(strategy->variate().begin(), strategy->variate().end(), c.begin(),
                         c.end()))
      << "c moves only on the commit";
  strategy->CommitAggregate();
  ExpectNear(strategy->variate(), g.rows.at("c_new"), 1e-4, "server c");

  // The checkpoint carries c after the wrapped strategy's velocity, and a
  // fresh strategy resumes with it bit for bit.
  store::Checkpoint saved{1, x, {}};
  strategy->SaveState(saved);
  auto resumed = std::move(ScaffoldStrategy::Wrap(std::move(MakeStrategy(ScaffoldConfig())).value(),
                                                  ScaffoldConfig()))
                     .value();
  ASSERT_TRUE(resumed->LoadState(saved).ok());
  EXPECT_TRUE(std::equal(resumed->variate().begin(), resumed->variate().end(),
                         strategy->variate().begin(), strategy->variate().end()));
}

TEST(ScaffoldTest, ACheckpointWithoutRoomForTheVariateIsDataLoss) {
  auto strategy =
      std::move(ScaffoldStrategy::Wrap(std::move(MakeStrategy(ScaffoldConfig())).value(),
                                       ScaffoldConfig()))
          .value();
  store::Checkpoint short_one{3, std::vector<float>(4, 1.0f), std::vector<float>(2, 0.0f)};
  const Status s = strategy->LoadState(short_one);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "checkpoint of round 3: a server velocity of 2 values has no room for SCAFFOLD's "
            "control variate of 4");
  EXPECT_EQ(strategy->SetVariateSum({1.0}, 0).message(),
            "SCAFFOLD: no clients to average over (N = 0)");
  std::vector<float> model(4, 0.0f);
  EXPECT_EQ(strategy->Aggregate(model, model).message(),
            "SCAFFOLD: Aggregate before SetVariateSum");
  EXPECT_EQ(ScaffoldStrategy::Wrap(std::move(MakeStrategy(config::RunConfig())).value(),
                                   config::RunConfig())
                .status()
                .message(),
            "train.scaffold: the config does not ask for SCAFFOLD");
}

// A plain round's sums: the model half by sample count, the variate half
// unweighted, in any order; a variate half that is not finite is refused
// by name and changes neither sum.
TEST(ScaffoldTest, PlainSumsWeighTheModelAndAddTheVariates) {
  auto sums = std::move(aggregation::NewScaffoldFedAvg(2, 0)).value();
  EXPECT_EQ(sums->frame_floats(), 4u);
  const std::vector<float> a = {1, 2, 0.5f, -1}, b = {3, 4, 0.25f, 2};
  const std::vector<float> bad = {1, 1, NAN, 0};
  const Status refused = sums->Accept(0, bad, 1);
  EXPECT_EQ(refused.message(),
            "train.scaffold: the control variate's change has value nan at index 0 (NaN, Inf or "
            "beyond 2^23)");
  EXPECT_EQ(sums->Accept(0, std::vector<float>{1, 2, 3}, 1).message(),
            "update has 3 values, expected 4 (train.scaffold: the delta, then the control "
            "variate's change)");
  ASSERT_TRUE(sums->Accept(1, b, 3).ok());
  ASSERT_TRUE(sums->Accept(0, a, 1).ok());
  EXPECT_EQ(sums->accepted(), 2u);
  auto mean = std::move(sums->Finalize()).value();
  EXPECT_EQ(mean.delta, (std::vector<float>{2.5f, 3.5f, 0.75f, 1.0f}));
}

}  // namespace
}  // namespace cohort::coordinator
