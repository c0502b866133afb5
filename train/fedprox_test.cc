// FedProx's proximal term (train.proximal_mu) in the local optimizer: step by
// step against PyTorch (tests/data/make_fedprox_golden.py), and what a user
// sees when it is misconfigured.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "datasets/synthetic.h"
#include "proto/config.pb.h"
#include "train/backend.h"
#include "train/model.h"
#include "train/model_config.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

struct FedProxCase {
  std::string name, kind;
  float lr = 0, weight_decay = 0, momentum = 0, mu = 0;
  std::vector<std::vector<double>> steps;  // The parameters after each step.
};

struct FedProxGolden {
  std::vector<float> start, features;
  std::vector<int32_t> labels;
  std::vector<FedProxCase> cases;
};

template <typename T>
std::vector<T> Rest(std::istringstream& f) {
  std::vector<T> out;
  T v;
  while (f >> v) out.push_back(v);
  return out;
}

FedProxGolden ReadGolden() {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/fedprox_golden.txt");
  FedProxGolden g;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string tag;
    f >> tag;
    if (tag == "start") g.start = Rest<float>(f);
    if (tag == "features") g.features = Rest<float>(f);
    if (tag == "labels") g.labels = Rest<int32_t>(f);
    if (tag == "case") {
      FedProxCase c;
      f >> c.name >> c.kind >> c.lr >> c.weight_decay >> c.momentum >> c.mu;
      g.cases.push_back(c);
    }
    if (tag == "step" && !g.cases.empty()) {
      int k = 0;
      f >> k;
      g.cases.back().steps.push_back(Rest<double>(f));
    }
  }
  return g;
}

std::unique_ptr<Model> Mlp(Backend* backend, uint32_t in, uint32_t hidden, uint32_t classes) {
  config::ModelConfig c;
  c.set_arch("mlp");
  c.set_input_dim(in);
  c.set_num_classes(classes);
  c.add_hidden(hidden);
  return std::move(BuildModel(c, backend)).value();
}

// The golden model: Cohort's mlp 6-5-3, whose flat layout is PyTorch's
// nn.Sequential(Linear(6, 5), ReLU, Linear(5, 3)) state_dict, stepped
// through Model::TrainStep (Backward, then the optimizer's proximal SGD or
// Adam update) on batches 0-3, 4-7, 0-3, 4-7. PyTorch differentiates the
// proximal term with autograd; Cohort adds mu (p - anchor) in the update
// rule. Tolerance: 2e-6 x max(1, |value|) per parameter and step, where
// two float32 implementations differ only by summation order (the observed
// gap is under 1e-7); FedProx's own effect by step 2 is about 4e-4.
TEST(FedProxTest, LocalStepsMatchPyTorchGoldenVectors) {
  auto backend = std::move(NewCpuBackend(1)).value();
  const FedProxGolden g = ReadGolden();
  auto model = Mlp(backend.get(), 6, 5, 3);
  ASSERT_EQ(g.start.size(), model->num_params()) << "tests/data/fedprox_golden.txt";
  ASSERT_EQ(g.features.size(), 8u * 6);
  ASSERT_EQ(g.labels.size(), 8u);
  ASSERT_TRUE(model->Reserve(4).ok());
  int checked = 0;
  for (const FedProxCase& c : g.cases) {
    OptimizerOptions o{.kind = c.kind == "adam" ? OptimizerKind::kAdam : OptimizerKind::kSgd,
                       .learning_rate = c.lr,
                       .weight_decay = c.weight_decay,
                       .momentum = c.momentum,
                       .proximal_mu = c.mu};
    auto opt = std::move(Optimizer::Create(o, g.start.size(), backend.get())).value();
    ASSERT_TRUE(opt->SetProximalAnchor(g.start).ok());
    ASSERT_TRUE(model->SetParams(g.start).ok());
    ASSERT_EQ(c.steps.size(), 4u) << c.name;
    double worst = 0;
    for (size_t k = 0; k < c.steps.size(); ++k) {
      const size_t lo = (k % 2) * 4;  // CPU backend memory is host memory.
      double stats[2] = {0, 0};
      model->TrainStep(g.features.data() + lo * 6, g.labels.data() + lo, 4, *opt, stats);
      std::vector<float> p(model->num_params());
      ASSERT_TRUE(model->GetParams(p).ok());
      ASSERT_EQ(c.steps[k].size(), p.size()) << c.name;
      for (size_t i = 0; i < p.size(); ++i) {
        const double want = c.steps[k][i];
        worst = std::max(worst, std::fabs(p[i] - want));
        EXPECT_NEAR(p[i], want, 2e-6 * std::max(1.0, std::fabs(want)))
            << c.name << ", step " << k + 1 << ", parameter " << i;
      }
    }
    std::cout << c.name << ": largest gap to PyTorch " << worst << "\n";
    ++checked;
  }
  EXPECT_EQ(checked, 4) << "tests/data/fedprox_golden.txt is missing cases";
}

// mu = 0 is the optimizer without FedProx: plain SGD keeps its fused path,
// and no anchor is needed or kept.
TEST(FedProxTest, MuZeroLeavesTheOptimizerAsItWas) {
  auto backend = std::move(NewCpuBackend(1)).value();
  auto plain = std::move(Optimizer::Create({.learning_rate = 0.1f}, 4, backend.get())).value();
  EXPECT_TRUE(plain->plain_sgd());
  std::vector<float> p = {1, 2, 3, 4}, g = {0.5f, -0.5f, 1, 0};
  ASSERT_TRUE(plain->Step(p, g).ok());  // No anchor asked for.
  EXPECT_EQ(p, (std::vector<float>{0.95f, 2.05f, 2.9f, 4}));
  auto prox =
      std::move(Optimizer::Create({.learning_rate = 0.1f, .proximal_mu = 0.5f}, 4, backend.get()))
          .value();
  EXPECT_FALSE(prox->plain_sgd());  // The term needs the gradient path.
}

TEST(FedProxTest, BadMuAndAMissingAnchorAreErrorsNamingThem) {
  auto backend = std::move(NewCpuBackend(1)).value();
  for (float mu : {-0.1f, std::nanf(""), INFINITY}) {
    Status s = Optimizer::Create({.proximal_mu = mu}, 4, backend.get()).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("proximal_mu"), std::string::npos) << s.message();
  }
  auto opt = std::move(Optimizer::Create({.proximal_mu = 0.5f}, 4, backend.get())).value();
  std::vector<float> p(4), g(4);
  Status s = opt->Step(p, g);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "optimizer: proximal_mu 0.5 needs the round's starting model "
            "(SetProximalAnchor)");
  std::vector<float> short_anchor(3);
  EXPECT_EQ(opt->SetProximalAnchor(short_anchor).code(), StatusCode::kInvalidArgument);
}

// Through the local training loop: the anchor is the model TrainLocal
// starts from, so a larger mu keeps the update closer to it, and mu = 0
// trains exactly as an optimizer that never heard of FedProx.
TEST(FedProxTest, TrainLocalPullsTheUpdateTowardsTheRoundsModel) {
  auto backend = std::move(NewCpuBackend(1)).value();
  auto m = Mlp(backend.get(), 20, 16, 4);
  auto data =
      std::move(DeviceDataset::Upload(backend.get(),
                                      datasets::MakeSynthetic({.num_samples = 400, .seed = 2})))
          .value();
  std::vector<float> start(m->num_params());
  m->Init(start, 1);
  auto delta_norm = [&](float mu) {
    std::vector<float> p = start;
    TrainOptions opts{.epochs = 2,
                      .batch_size = 32,
                      .optimizer = {.learning_rate = 0.1f, .momentum = 0.9f, .proximal_mu = mu},
                      .seed = 4};
    EXPECT_TRUE(TrainLocal(*m, p, *data, opts).ok());
    double s = 0;
    for (size_t i = 0; i < p.size(); ++i) s += double(p[i] - start[i]) * (p[i] - start[i]);
    return std::sqrt(s);
  };
  const double free = delta_norm(0), some = delta_norm(0.1f), strong = delta_norm(10.0f);
  EXPECT_GT(free, 0.1);
  EXPECT_LT(some, free);
  EXPECT_LT(strong, 0.5 * some);
  EXPECT_EQ(delta_norm(0.1f), some);  // Deterministic, bit for bit.
}

TEST(FedProxTest, TheConfigsMuReachesTheOptimizer) {
  config::TrainConfig t;
  EXPECT_EQ(OptimizerFromConfig(t).proximal_mu, 0.0f);
  t.set_proximal_mu(0.01f);
  EXPECT_EQ(OptimizerFromConfig(t).proximal_mu, 0.01f);
}

}  // namespace
}  // namespace cohort::train
