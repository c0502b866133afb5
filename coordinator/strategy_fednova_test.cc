#include "coordinator/strategy_fednova.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "aggregation/aggregator.h"
#include "aggregation/fednova.h"

namespace cohort::coordinator {
namespace {

// NumPy computed (tests/data/make_fednova_golden.py).
struct GoldenNorm {
  uint64_t steps = 0;
  float momentum = 0;
  double norm = 0;
};
struct GoldenClient {
  uint64_t samples = 0, steps = 0;
  double norm = 0;
  std::vector<float> local;
  std::vector<double> normalised;
};
struct GoldenCase {
  std::string name;
  float momentum = 0, server_lr = 0, server_momentum = 0;
  std::vector<float> initial;
  std::vector<GoldenClient> clients;
  double tau_eff = 0;
  std::vector<double> fedavg, model;
};
struct GoldenFile {
  std::vector<GoldenNorm> norms;
  std::vector<GoldenCase> cases;
};

std::vector<double> Values(std::istringstream& f) {
  std::vector<double> values;
  for (double x; f >> x;) values.push_back(x);
  return values;
}

// The file's lines: "norm STEPS MOMENTUM A", "case NAME MOMENTUM LR SERVER_MOMENTUM
// CLIENTS", "client N TAU A", "TAG v1 v2 ...".
GoldenFile ReadGolden() {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/fednova_golden.txt");
  GoldenFile file;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string tag;
    f >> tag;
    if (tag == "norm") {
      GoldenNorm n;
      f >> n.steps >> n.momentum >> n.norm;
      file.norms.push_back(n);
    } else if (tag == "case") {
      GoldenCase c;
      f >> c.name >> c.momentum >> c.server_lr >> c.server_momentum;
      file.cases.push_back(c);
    } else if (file.cases.empty()) {
      continue;
    } else if (GoldenCase& c = file.cases.back(); tag == "client") {
      GoldenClient client;
      f >> client.samples >> client.steps >> client.norm;
      c.clients.push_back(client);
    } else if (tag == "initial") {
      const std::vector<double> v = Values(f);
      c.initial.assign(v.begin(), v.end());
    } else if (tag == "local") {
      const std::vector<double> v = Values(f);
      c.clients.back().local.assign(v.begin(), v.end());
    } else if (tag == "normalised") {
      c.clients.back().normalised = Values(f);
    } else if (tag == "tau_eff") {
      f >> c.tau_eff;
    } else if (tag == "fedavg") {
      c.fedavg = Values(f);
    } else if (tag == "model") {
      c.model = Values(f);
    }
  }
  return file;
}

config::RunConfig FedNovaConfig(const GoldenCase& g) {
  config::RunConfig c;
  c.mutable_train()->set_fednova(true);
  c.mutable_train()->set_momentum(g.momentum);
  c.mutable_server()->set_learning_rate(g.server_lr);
  c.mutable_server()->set_momentum(g.server_momentum);
  return c;
}

std::unique_ptr<FedNovaStrategy> Wrapped(const config::RunConfig& config) {
  auto inner = MakeStrategy(config);
  EXPECT_TRUE(inner.ok()) << inner.status().message();
  auto wrapped = FedNovaStrategy::Wrap(std::move(*inner), config);
  EXPECT_TRUE(wrapped.ok()) << wrapped.status().message();
  return std::move(*wrapped);
}

// Within a few float32 ulps of NumPy's float64, relative to the vector's
// largest value (the mean and the step each round to float once).
void ExpectNear(std::span<const float> actual, const std::vector<double>& expected,
                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::fabs(e));
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 4e-7 * largest) << what << ", value " << i;
  }
}

TEST(FedNovaTest, TheNormaliserMatchesTheAuthorsRecursion) {
  const GoldenFile golden = ReadGolden();
  ASSERT_EQ(golden.norms.size(), 8u) << "tests/data/fednova_golden.txt is missing or incomplete";
  for (const GoldenNorm& n : golden.norms) {
    EXPECT_NEAR(aggregation::FedNovaNorm(n.steps, n.momentum), n.norm, 1e-10 * n.norm)
        << n.steps << " steps, momentum " << n.momentum;
  }
  EXPECT_EQ(aggregation::FedNovaNorm(0, 0.9), 0.0);
}

// One FedNova round of case `g` as the coordinator runs it: each client's
// normalised delta (checked against NumPy's), the streaming weighted mean,
// tau_eff and FedNovaStrategy's step around MakeStrategy's.
std::vector<float> FedNovaRound(const GoldenCase& g, double& tau_eff) {
  auto sum = aggregation::NewStreamingFedAvg(g.initial.size());
  EXPECT_TRUE(sum.ok());
  double weighted_norm = 0, weight = 0;
  for (size_t k = 0; k < g.clients.size(); ++k) {
    const GoldenClient& c = g.clients[k];
    const double norm = aggregation::FedNovaNorm(c.steps, g.momentum);
    EXPECT_NEAR(norm, c.norm, 1e-10 * c.norm) << g.name << ", client " << k;
    std::vector<float> sent(g.initial.size());
    EXPECT_TRUE(aggregation::NormaliseDelta(c.local, g.initial, norm, sent));
    ExpectNear(sent, c.normalised, g.name + ", client " + std::to_string(k) + "'s update");
    EXPECT_TRUE((*sum)->Accept(static_cast<uint32_t>(k), sent, c.samples).ok());
    weighted_norm += static_cast<double>(c.samples) * norm;
    weight += static_cast<double>(c.samples);
  }
  tau_eff = weighted_norm / weight;
  auto mean = (*sum)->Finalize();
  EXPECT_TRUE(mean.ok());
  auto strategy = Wrapped(FedNovaConfig(g));
  EXPECT_TRUE(strategy->SetTauEff(tau_eff).ok());
  std::vector<float> model = g.initial;
  EXPECT_TRUE(strategy->Aggregate(mean->delta, model).ok()) << g.name;
  strategy->CommitAggregate();
  return model;
}

TEST(FedNovaTest, TheRoundMatchesTheNumPyGoldenVectors) {
  const GoldenFile golden = ReadGolden();
  ASSERT_EQ(golden.cases.size(), 4u) << "tests/data/fednova_golden.txt is missing or incomplete";
  for (const GoldenCase& g : golden.cases) {
    double tau_eff = 0;
    const std::vector<float> model = FedNovaRound(g, tau_eff);
    EXPECT_NEAR(tau_eff, g.tau_eff, 1e-10 * g.tau_eff) << g.name;
    ExpectNear(model, g.model, g.name + ", model");
  }
}

// Equal steps everywhere: every a_k is the same, so FedNova's step is
// FedAvg's weighted mean of the raw deltas (within float rounding), here
// both computed by Cohort.
TEST(FedNovaTest, EqualStepsGiveFedAvg) {
  const GoldenFile golden = ReadGolden();
  ASSERT_EQ(golden.cases.size(), 4u);
  const GoldenCase& g = golden.cases.back();
  ASSERT_EQ(g.name, "equal_steps");
  double tau_eff = 0;
  const std::vector<float> fednova = FedNovaRound(g, tau_eff);
  auto sum = aggregation::NewStreamingFedAvg(g.initial.size());
  ASSERT_TRUE(sum.ok());
  for (size_t k = 0; k < g.clients.size(); ++k) {
    std::vector<float> delta(g.initial.size());
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = g.clients[k].local[i] - g.initial[i];
    ASSERT_TRUE((*sum)->Accept(static_cast<uint32_t>(k), delta, g.clients[k].samples).ok());
  }
  auto mean = (*sum)->Finalize();
  ASSERT_TRUE(mean.ok());
  config::RunConfig fedavg_config = FedNovaConfig(g);
  fedavg_config.mutable_train()->set_fednova(false);
  auto fedavg = MakeStrategy(fedavg_config);
  ASSERT_TRUE(fedavg.ok());
  std::vector<float> model = g.initial;
  ASSERT_TRUE((*fedavg)->Aggregate(mean->delta, model).ok());
  ExpectNear(fednova, std::vector<double>(model.begin(), model.end()), "FedNova against FedAvg");
  ExpectNear(model, g.model, "FedAvg against NumPy's FedNova");
}

TEST(FedNovaTest, TheStrategyNeedsAFinitePositiveTauEffEachRound) {
  config::RunConfig config;
  config.mutable_train()->set_fednova(true);
  auto strategy = Wrapped(config);
  std::vector<float> model = {1, 2}, mean = {0.5f, -0.25f};
  Status before = strategy->Aggregate(mean, model);
  EXPECT_EQ(before.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(before.message(), "FedNova: Aggregate before SetTauEff");
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    Status s = strategy->SetTauEff(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("is not a finite value > 0"), std::string::npos) << s.message();
  }
  ASSERT_TRUE(strategy->SetTauEff(4).ok());
  ASSERT_TRUE(strategy->Aggregate(mean, model).ok());
  EXPECT_EQ(model, (std::vector<float>{3, 1}));
  // Used once: the next round needs its own.
  EXPECT_EQ(strategy->Aggregate(mean, model).code(), StatusCode::kFailedPrecondition);

  config::RunConfig plain;
  auto refused = FedNovaStrategy::Wrap(std::move(*MakeStrategy(plain)), plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "train.fednova: the config does not ask for FedNova");
}

// The secure slot: a normaliser survives the trip through [0, clip], and
// one beyond the bound is clamped.
TEST(FedNovaTest, TheSlotCarriesTheNormaliserWithinItsBound) {
  for (double a : {1.0, 17.4, 311.33, 90100.5}) {
    const float slot = aggregation::FedNovaToSlot(a, 2.5f);
    EXPECT_LE(slot, 2.5f);
    EXPECT_NEAR(aggregation::SlotToTauEff(slot, 2.5f), a, 1e-6 * a) << a;
  }
  EXPECT_EQ(aggregation::FedNovaToSlot(1e9, 1.0f), 1.0f);
  EXPECT_EQ(aggregation::FedNovaToSlot(std::nan(""), 1.0f), 0.0f);
}

}  // namespace
}  // namespace cohort::coordinator
