#include "coordinator/strategy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "aggregation/aggregator.h"

namespace cohort::coordinator {
namespace {

config::RunConfig TestConfig(float momentum = 0) {
  config::RunConfig c;
  c.set_seed(11);
  c.mutable_rounds()->set_min_clients(2);
  c.mutable_rounds()->set_fraction(0.5f);
  c.mutable_train()->set_local_epochs(3);
  c.mutable_server()->set_learning_rate(0.5f);
  c.mutable_server()->set_momentum(momentum);
  return c;
}

std::unique_ptr<Strategy> Make(const config::RunConfig& config, Evaluator evaluator = {}) {
  auto strategy = MakeStrategy(config, std::move(evaluator));
  EXPECT_TRUE(strategy.ok()) << strategy.status().message();
  return std::move(*strategy);
}

CohortRequest Request(uint32_t round, uint32_t clients,
                      const std::map<std::string, std::string>* banned = nullptr) {
  CohortRequest r;
  r.round = round;
  r.needed = 2;
  r.min_clients = 2;
  for (uint32_t i = 0; i < clients; ++i) r.active.push_back("c" + std::to_string(100 + i));
  r.banned = banned;
  return r;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

TEST(StrategyTest, SelectionIsSeededBySeedAndRound) {
  auto strategy = Make(TestConfig());
  const std::vector<std::string> cohort = strategy->SelectCohort(Request(1, 10));
  // The cohort the engine selected before the strategy seam: a change here
  // changes which clients train, and every model after.
  EXPECT_EQ(cohort, (std::vector<std::string>{"c100", "c104", "c106", "c107", "c109"}));
  EXPECT_EQ(Make(TestConfig())->SelectCohort(Request(1, 10)), cohort);
  EXPECT_NE(strategy->SelectCohort(Request(2, 10)), cohort);
  config::RunConfig reseeded = TestConfig();
  reseeded.set_seed(12);
  EXPECT_NE(Make(reseeded)->SelectCohort(Request(1, 10)), cohort);
}

TEST(StrategyTest, SelectionNeverPicksBannedClients) {
  auto strategy = Make(TestConfig());
  const std::map<std::string, std::string> banned = {{"c100", "misbehaved: x"},
                                                     {"c103", "misbehaved: y"}};
  config::RunConfig all = TestConfig();
  all.mutable_rounds()->set_fraction(1);
  for (uint32_t round = 1; round <= 20; ++round) {
    const auto cohort = Make(all)->SelectCohort(Request(round, 6, &banned));
    EXPECT_EQ(cohort, (std::vector<std::string>{"c101", "c102", "c104", "c105"}));
  }
  // Banned clients do not count towards the clients a round waits for.
  CohortRequest request = Request(1, 6, &banned);
  request.needed = 5;
  EXPECT_TRUE(strategy->SelectCohort(request).empty());
  request.needed = 4;
  EXPECT_EQ(strategy->SelectCohort(request).size(), 2u);
}

TEST(StrategyTest, CohortSizeFollowsFractionAndBounds) {
  config::RunConfig c = TestConfig();
  EXPECT_EQ(Make(c)->SelectCohort(Request(1, 9)).size(), 5u);  // ceil(0.5 * 9).
  c.mutable_rounds()->set_fraction(0.1f);
  EXPECT_EQ(Make(c)->SelectCohort(Request(1, 9)).size(), 2u);  // min_clients.
  c.mutable_rounds()->set_fraction(1);
  c.mutable_rounds()->set_max_clients_per_round(3);
  const auto cohort = Make(c)->SelectCohort(Request(1, 9));
  EXPECT_EQ(cohort.size(), 3u);
  EXPECT_TRUE(std::is_sorted(cohort.begin(), cohort.end()));
  EXPECT_TRUE(Make(c)->SelectCohort(Request(1, 1)).empty());  // Fewer than needed.
}

TEST(StrategyTest, TaskCarriesTrainConfigAndPerClientSeed) {
  auto strategy = Make(TestConfig());
  wire::RoundTask a, b, a_again;
  strategy->ConfigureTask(3, "alice", a);
  strategy->ConfigureTask(3, "bob", b);
  strategy->ConfigureTask(3, "alice", a_again);
  EXPECT_EQ(a.train().local_epochs(), 3u);
  EXPECT_EQ(a.train_seed(), a_again.train_seed());
  EXPECT_NE(a.train_seed(), b.train_seed());
}

// FedProx: mu travels in every task, whichever server step the run takes
// (FedProx is a client-side term; it composes with FedAvgM and FedAdam).
TEST(StrategyTest, EveryTaskCarriesFedProxsMu) {
  for (float momentum : {0.0f, 0.9f}) {
    config::RunConfig c = TestConfig(momentum);
    c.mutable_train()->set_proximal_mu(0.01f);
    wire::RoundTask task;
    Make(c)->ConfigureTask(2, "alice", task);
    EXPECT_EQ(task.train().proximal_mu(), 0.01f);
  }
  config::RunConfig adam = TestConfig();
  adam.mutable_server()->set_optimizer(config::FEDADAM);
  adam.mutable_train()->set_proximal_mu(0.5f);
  wire::RoundTask task;
  Make(adam)->ConfigureTask(1, "bob", task);
  EXPECT_EQ(task.train().proximal_mu(), 0.5f);
  wire::RoundTask plain;
  Make(TestConfig())->ConfigureTask(1, "bob", plain);
  EXPECT_EQ(plain.train().proximal_mu(), 0.0f);
}

TEST(StrategyTest, FedAvgStepIsTheServerOptimizerWithoutMomentum) {
  auto strategy = Make(TestConfig());
  const std::vector<float> delta = {0.1f, -0.3f, 1e-7f, 3.0f};
  std::vector<float> model = {1.0f, 2.0f, -1.0f, 0.25f}, expected = model, no_velocity;
  aggregation::ApplyServerUpdate({0.5f, 0.0f}, delta, expected, no_velocity);
  ASSERT_TRUE(strategy->Aggregate(delta, model).ok());
  strategy->CommitAggregate();
  EXPECT_TRUE(SameBits(model, expected));
  store::Checkpoint cp{1, model, {}};
  strategy->SaveState(cp);
  EXPECT_TRUE(cp.velocity.empty());
}

TEST(StrategyTest, FedAvgMVelocityRoundTripsThroughTheCheckpoint) {
  auto original = Make(TestConfig(0.9f));
  const std::vector<float> d1 = {0.1f, -0.3f, 0.7f}, d2 = {-0.2f, 0.05f, 0.3f};
  std::vector<float> model = {1.0f, 2.0f, -1.0f};
  ASSERT_TRUE(original->Aggregate(d1, model).ok());
  original->CommitAggregate();
  store::Checkpoint cp{1, model, {}};
  original->SaveState(cp);
  ASSERT_EQ(cp.velocity.size(), model.size());

  // A coordinator restarted from `cp` takes the next step bit for bit as the
  // one that never stopped.
  auto resumed = Make(TestConfig(0.9f));
  ASSERT_TRUE(resumed->LoadState(cp).ok());
  std::vector<float> a = model, b = model;
  ASSERT_TRUE(original->Aggregate(d2, a).ok());
  ASSERT_TRUE(resumed->Aggregate(d2, b).ok());
  EXPECT_TRUE(SameBits(a, b));

  std::vector<float> expected = {1.0f, 2.0f, -1.0f}, velocity;
  aggregation::ApplyServerUpdate({0.5f, 0.9f}, d1, expected, velocity);
  aggregation::ApplyServerUpdate({0.5f, 0.9f}, d2, expected, velocity);
  EXPECT_TRUE(SameBits(a, expected));
}

TEST(StrategyTest, UncommittedStepLeavesTheStateAsItWas) {
  auto strategy = Make(TestConfig(0.5f));
  std::vector<float> model = {1.0f, 2.0f};
  ASSERT_TRUE(strategy->Aggregate(std::vector<float>{1.0f, 1.0f}, model).ok());
  // The engine aborted the round (say, its evaluation failed): no commit.
  store::Checkpoint cp{1, model, {}};
  strategy->SaveState(cp);
  EXPECT_TRUE(cp.velocity.empty());

  const float inf = std::numeric_limits<float>::infinity();
  Status status = strategy->Aggregate(std::vector<float>{inf, 0.0f}, model);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("not finite"), std::string::npos) << status.message();
}

TEST(StrategyTest, WrongSizeStateIsRefused) {
  store::Checkpoint cp{4, {1.0f, 2.0f, 3.0f, 4.0f}, {0.5f, 0.5f, 0.5f}};
  Status status = Make(TestConfig(0.9f))->LoadState(cp);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(status.message(),
            "checkpoint of round 4: a server velocity of 3 values for 4 parameters");

  // FedAvg keeps no state: a velocity in its checkpoint is another run's.
  status = Make(TestConfig())->LoadState(cp);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("keeps no server state"), std::string::npos) << status.message();

  cp.velocity.clear();  // No step taken yet: fine for both.
  EXPECT_TRUE(Make(TestConfig())->LoadState(cp).ok());
  EXPECT_TRUE(Make(TestConfig(0.9f))->LoadState(cp).ok());
}

TEST(StrategyTest, EvaluateUsesTheRunsEvaluator) {
  auto none = Make(TestConfig())->Evaluate(std::vector<float>{1.0f});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  Evaluator evaluator = [](std::span<const float> p) -> StatusOr<EvalMetrics> {
    if (p[0] < 0) return InvalidArgumentError("negative");
    return EvalMetrics{p[0], 0.75};
  };
  auto strategy = Make(TestConfig(), evaluator);
  auto metrics = strategy->Evaluate(std::vector<float>{2.0f});
  ASSERT_TRUE(metrics.ok() && metrics->has_value());
  EXPECT_EQ((*metrics)->loss, 2.0);
  EXPECT_EQ((*metrics)->accuracy, 0.75);
  EXPECT_EQ(strategy->Evaluate(std::vector<float>{-1.0f}).status().message(), "negative");
}

// One adaptive optimizer's settings and, after each step, the model, m and v
// NumPy computed (tests/data/make_fedopt_golden.py).
struct FedOptGolden {
  std::string optimizer;
  float lr = 0, beta_1 = 0, beta_2 = 0, tau = 0;
  std::vector<std::vector<double>> model, m, v;
};

struct FedOptGoldenFile {
  std::vector<float> initial;
  std::vector<std::vector<float>> deltas;
  std::vector<FedOptGolden> cases;
};

// The file's lines: "TAG v1 v2 ...", "case NAME lr beta_1 beta_2 tau".
FedOptGoldenFile ReadFedOptGolden() {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/fedopt_golden.txt");
  FedOptGoldenFile file;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string tag;
    f >> tag;
    if (tag == "case") {
      FedOptGolden c;
      f >> c.optimizer >> c.lr >> c.beta_1 >> c.beta_2 >> c.tau;
      file.cases.push_back(c);
      continue;
    }
    std::vector<double> values;
    for (double x; f >> x;) values.push_back(x);
    if (tag == "initial") file.initial.assign(values.begin(), values.end());
    if (tag == "delta") file.deltas.emplace_back(values.begin(), values.end());
    if (file.cases.empty()) continue;
    FedOptGolden& c = file.cases.back();
    if (tag == "model") c.model.push_back(values);
    if (tag == "m") c.m.push_back(values);
    if (tag == "v") c.v.push_back(values);
  }
  return file;
}

config::RunConfig FedOptConfig(const FedOptGolden& g) {
  config::RunConfig c = TestConfig();
  config::ServerOptimizer optimizer = config::FEDAVG;
  EXPECT_TRUE(config::ServerOptimizer_Parse(g.optimizer, &optimizer)) << g.optimizer;
  c.mutable_server()->set_optimizer(optimizer);
  c.mutable_server()->set_learning_rate(g.lr);
  c.mutable_server()->set_beta_1(g.beta_1);
  if (optimizer != config::FEDADAGRAD) c.mutable_server()->set_beta_2(g.beta_2);
  c.mutable_server()->set_tau(g.tau);
  return c;
}

// Within about 3 float32 ulps (2^-23 relative) of NumPy's float64, relative
// to the vector's largest value: each step rounds m, v and the model to
// float once, and m = beta_1 m + (1 - beta_1) d may cancel (measured: at
// most 2 ulps).
void ExpectNear(std::span<const float> actual, const std::vector<double>& expected,
                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::fabs(e));
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 4e-7 * largest) << what << ", value " << i;
  }
}

TEST(StrategyTest, AdaptiveOptimizersMatchTheNumPyGoldenVectorsStepByStep) {
  const FedOptGoldenFile golden = ReadFedOptGolden();
  ASSERT_EQ(golden.cases.size(), 6u) << "tests/data/fedopt_golden.txt is missing or incomplete";
  ASSERT_EQ(golden.deltas.size(), 6u);
  for (const FedOptGolden& g : golden.cases) {
    auto strategy = Make(FedOptConfig(g));
    std::vector<float> model = golden.initial;
    ASSERT_EQ(g.model.size(), golden.deltas.size()) << g.optimizer;
    for (size_t step = 0; step < golden.deltas.size(); ++step) {
      ASSERT_TRUE(strategy->Aggregate(golden.deltas[step], model).ok());
      strategy->CommitAggregate();
      store::Checkpoint cp{static_cast<uint32_t>(step + 1), model, {}};
      strategy->SaveState(cp);
      ASSERT_EQ(cp.velocity.size(), 2 * model.size());
      EXPECT_EQ(cp.optimizer_steps, step + 1);
      const std::string what =
          g.optimizer + " lr " + std::to_string(g.lr) + ", step " + std::to_string(step + 1);
      const std::span<const float> state(cp.velocity);
      ExpectNear(model, g.model[step], what + ", model");
      ExpectNear(state.first(model.size()), g.m[step], what + ", m");
      ExpectNear(state.last(model.size()), g.v[step], what + ", v");
    }
  }
}

TEST(StrategyTest, AdaptiveStateRoundTripsThroughTheCheckpointBitForBit) {
  for (auto optimizer : {config::FEDADAM, config::FEDYOGI, config::FEDADAGRAD}) {
    config::RunConfig c = TestConfig();
    c.mutable_server()->set_optimizer(optimizer);
    c.mutable_server()->set_learning_rate(0.1f);
    auto original = Make(c);
    const std::vector<float> d1 = {0.1f, -0.3f, 0.7f}, d2 = {-0.2f, 0.05f, 0.3f};
    std::vector<float> model = {1.0f, 2.0f, -1.0f};
    ASSERT_TRUE(original->Aggregate(d1, model).ok());
    original->CommitAggregate();
    store::Checkpoint cp{1, model, {}};
    original->SaveState(cp);
    EXPECT_EQ(cp.optimizer_steps, 1u);

    auto resumed = Make(c);
    ASSERT_TRUE(resumed->LoadState(cp).ok());
    std::vector<float> a = model, b = model;
    ASSERT_TRUE(original->Aggregate(d2, a).ok());
    ASSERT_TRUE(resumed->Aggregate(d2, b).ok());
    original->CommitAggregate();
    resumed->CommitAggregate();
    EXPECT_TRUE(SameBits(a, b)) << config::ServerOptimizer_Name(optimizer);
    store::Checkpoint after_a{2, a, {}}, after_b{2, b, {}};
    original->SaveState(after_a);
    resumed->SaveState(after_b);
    EXPECT_TRUE(SameBits(after_a.velocity, after_b.velocity));
    EXPECT_EQ(after_b.optimizer_steps, 2u);
  }
}

TEST(StrategyTest, AdaptiveOptimizersRefuseAStateOfTheWrongSizeAndKeepUncommittedSteps) {
  config::RunConfig c = TestConfig();
  c.mutable_server()->set_optimizer(config::FEDYOGI);
  c.mutable_server()->set_learning_rate(0.01f);
  // FedAvgM's velocity (one model size) is not FedYogi's state.
  store::Checkpoint cp{4, {1.0f, 2.0f, 3.0f}, {0.5f, 0.5f, 0.5f}};
  Status status = Make(c)->LoadState(cp);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(status.message(),
            "checkpoint of round 4: a server optimizer state of 3 values for 3 parameters; "
            "FedYogi keeps twice as many (m and v)");
  cp.velocity.clear();
  EXPECT_TRUE(Make(c)->LoadState(cp).ok());

  auto strategy = Make(c);
  std::vector<float> model = {1.0f, 2.0f};
  ASSERT_TRUE(strategy->Aggregate(std::vector<float>{1.0f, 1.0f}, model).ok());
  store::Checkpoint none{1, model, {}};
  strategy->SaveState(none);  // Not committed: no state, no step.
  EXPECT_TRUE(none.velocity.empty());
  EXPECT_EQ(none.optimizer_steps, 0u);
  const float inf = std::numeric_limits<float>::infinity();
  status = strategy->Aggregate(std::vector<float>{inf, 0.0f}, model);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "the FedYogi server state (m, v) is not finite");
}

}  // namespace
}  // namespace cohort::coordinator
