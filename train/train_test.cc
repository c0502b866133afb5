#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "datasets/synthetic.h"
#include "train/backend.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = std::move(NewCpuBackend(1)).value(); }
  std::unique_ptr<Model> Make(ModelSpec spec) {
    return std::move(Model::Create(spec, backend_.get())).value();
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(TrainTest, LayoutMatchesPyTorchParameterCount) {
  auto mlp = Make({"mlp", 784, 10, {200, 200}});
  EXPECT_EQ(mlp->num_params(), 199210u);  // As torch's 784-200-200-10.
  auto logreg = Make({"logreg", 784, 10, {}});
  EXPECT_EQ(logreg->num_params(), 7850u);
  EXPECT_EQ(mlp->layout().tensors()[2].name, "fc2.weight");
  EXPECT_FALSE(Model::Create({"cnn", 784, 10, {}}, backend_.get()).ok());
}

TEST_F(TrainTest, InitFollowsFanInBoundsAndSeed) {
  auto m = Make({"mlp", 100, 4, {25}});
  std::vector<float> a(m->num_params()), b(m->num_params()), c(m->num_params());
  m->Init(a, 1);
  m->Init(b, 1);
  m->Init(c, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  auto w1 = m->layout().View(std::span<const float>(a), 0);
  for (float v : w1) EXPECT_LE(std::fabs(v), 0.1f);  // 1/sqrt(100)
  auto w2 = m->layout().View(std::span<const float>(a), 2);
  float max = 0;
  for (float v : w2) max = std::max(max, std::fabs(v));
  EXPECT_GT(max, 0.1f);  // 1/sqrt(25) = 0.2 bound for the second layer.
}

// One plain SGD step with lr 1 moves the parameters by exactly the gradient;
// compare it with a central finite difference of the loss.
TEST_F(TrainTest, BackwardMatchesFiniteDifferences) {
  auto m = Make({"mlp", 6, 3, {5}});
  datasets::Dataset data =
      datasets::MakeSynthetic({.num_samples = 4, .num_features = 6, .num_classes = 3, .seed = 5});
  std::vector<float> p(m->num_params());
  m->Init(p, 3);
  // Overwritten, not added to, and never read (GEMM with beta = 0).
  std::vector<float> grads(p.size(), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> before = p;
  m->Backward(p, data.features.data(), data.labels.data(), 4, grads);
  EXPECT_EQ(p, before);  // Backward leaves the parameters alone.
  auto loss = [&](std::vector<float>& q) {
    return m->Evaluate(q, data.features.data(), data.labels.data(), 4).loss_sum / 4;
  };
  int checked = 0;
  for (size_t i = 0; i < p.size(); i += 3) {
    const float h = 1e-2f;
    std::vector<float> plus = p, minus = p;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (loss(plus) - loss(minus)) / (2 * h);
    EXPECT_NEAR(grads[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "param " << i;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_F(TrainTest, FusedSgdEqualsGradientPathToFloatRounding) {
  // Data-parallel training takes the gradient path (Backward, all-reduce,
  // Optimizer::Step); local plain SGD the fused one. Over 20 steps of a
  // 3-layer MLP they stay within float rounding of each other.
  auto m = Make({"mlp", 10, 4, {16, 8}});
  datasets::Dataset data = datasets::MakeSynthetic({.num_samples = 640, .num_features = 10});
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  std::vector<float> fused = p, split = p, grads(p.size());
  auto sgd = std::move(Optimizer::Create({.learning_rate = 0.1f}, p.size())).value();
  for (int step = 0; step < 20; ++step) {
    const float* x = data.features.data() + size_t(step) * 32 * 10;
    const int32_t* y = data.labels.data() + size_t(step) * 32;
    const BatchStats a = m->SgdStep(fused, x, y, 32, 0.1f);
    const BatchStats b = m->Backward(split, x, y, 32, grads);
    ASSERT_TRUE(sgd->Step(split, grads).ok());
    EXPECT_EQ(a.correct, b.correct);
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-4 * std::fabs(a.loss_sum));
  }
  double max_diff = 0;
  for (size_t i = 0; i < p.size(); ++i)
    max_diff = std::max(max_diff, double{std::fabs(fused[i] - split[i])});
  EXPECT_LT(max_diff, 1e-5);
  EXPECT_NE(fused, p);
}

TEST_F(TrainTest, TrainLocalStepsThroughBackwardAndTheOptimizer) {
  // One batch of momentum SGD through TrainLocal equals Backward and one
  // Optimizer step by hand (so TrainStep does not take the fused path).
  auto m = Make({"mlp", 10, 4, {8}});
  datasets::Dataset data = datasets::MakeSynthetic({.num_samples = 16, .num_features = 10});
  std::vector<float> p(m->num_params());
  m->Init(p, 4);
  TrainOptions opts{.epochs = 1,
                    .batch_size = 16,
                    .optimizer = {.learning_rate = 0.1f, .weight_decay = 0.01f, .momentum = 0.9f},
                    .seed = 3};
  std::vector<float> through_trainer = p;
  ASSERT_TRUE(TrainLocal(*m, through_trainer, data, opts).ok());
  // The whole shard is one batch, so the shuffle only reorders the mean's terms.
  std::vector<float> by_hand = p, grads(p.size());
  m->Backward(by_hand, data.features.data(), data.labels.data(), 16, grads);
  auto opt = std::move(Optimizer::Create(opts.optimizer, p.size())).value();
  ASSERT_TRUE(opt->Step(by_hand, grads).ok());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(through_trainer[i], by_hand[i], 1e-6) << i;
  // Plain SGD (the fused path) gives another result: no weight decay.
  std::vector<float> fused = p;
  m->SgdStep(fused, data.features.data(), data.labels.data(), 16, 0.1f);
  EXPECT_NE(fused, by_hand);
}

// Golden values from an independent float64 implementation of torch.optim's
// documented SGD, Adam and AdamW (amsgrad off): 5 parameters, 3 steps with
// fixed gradients.
TEST(OptimizerTest, StepsMatchPyTorchSemantics) {
  const std::vector<float> p0 = {0.5f, -1.25f, 2.0f, 0.0f, -0.75f};
  const std::vector<std::vector<float>> gs = {{0.1f, -0.2f, 0.3f, -0.4f, 0.5f},
                                              {-0.3f, 0.1f, 0.05f, 0.2f, -0.1f},
                                              {0.25f, 0.25f, -0.5f, 0.0f, 0.125f}};
  struct Case {
    const char* name;
    OptimizerOptions options;
    std::vector<double> expected;
  };
  using K = OptimizerKind;
  const std::vector<Case> cases = {
      {"sgd", {.learning_rate = 0.1f}, {0.495, -1.265, 2.015, 0.02, -0.8025}},
      {"sgd momentum + weight decay",
       {.learning_rate = 0.1f, .weight_decay = 0.01f, .momentum = 0.9f},
       {0.502105389, -1.23285948, 1.94810857, 0.07026804, -0.874616149}},
      {"sgd dampening",
       {.learning_rate = 0.1f, .momentum = 0.9f, .dampening = 0.5f},
       {0.4889, -1.2178, 1.93895, 0.0894, -0.88225}},
      {"sgd nesterov",
       {.learning_rate = 0.1f, .weight_decay = 0.01f, .momentum = 0.9f, .nesterov = true},
       {0.495387062, -1.24594585, 1.96253659, 0.0830205544, -0.912095219}},
      {"adam",
       {.kind = K::kAdam, .learning_rate = 0.01f},
       {0.493974904, -1.24072813, 1.98448143, 0.014722163, -0.770469084}},
      {"adam with L2",
       {.kind = K::kAdam,
        .learning_rate = 0.01f,
        .weight_decay = 0.1f,
        .beta1 = 0.8f,
        .beta2 = 0.99f,
        .eps = 1e-6f},
       {0.490221847, -1.23108785, 1.97842346, 0.013588043, -0.765578667}},
      {"adamw",
       {.kind = K::kAdamW, .learning_rate = 0.01f, .weight_decay = 0.1f},
       {0.492491452, -1.23700453, 1.97851525, 0.0146995096, -0.768196233}},
  };
  for (const Case& c : cases) {
    auto opt = Optimizer::Create(c.options, p0.size());
    ASSERT_TRUE(opt.ok()) << c.name << ": " << opt.status();
    std::vector<float> p = p0;
    for (const auto& g : gs) ASSERT_TRUE((*opt)->Step(p, g).ok()) << c.name;
    EXPECT_EQ((*opt)->steps(), 3u);
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(p[i], c.expected[i], 2e-6 * std::max(1.0, std::fabs(c.expected[i])))
          << c.name << ", parameter " << i;
    }
  }
}

TEST(OptimizerTest, BadOptionsAreErrorsNamingTheOption) {
  auto error = [](const OptimizerOptions& o) {
    return std::string(Optimizer::Create(o, 4).status().message());
  };
  EXPECT_NE(error({.learning_rate = -1}).find("learning_rate"), std::string::npos);
  EXPECT_NE(error({.momentum = 1.0f}).find("momentum"), std::string::npos);
  EXPECT_NE(error({.nesterov = true}).find("nesterov"), std::string::npos);
  EXPECT_NE(error({.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}).find("nesterov"),
            std::string::npos);
  EXPECT_NE(error({.kind = OptimizerKind::kAdam, .beta2 = 1.0f}).find("beta2"), std::string::npos);
  EXPECT_NE(error({.kind = OptimizerKind::kAdamW, .eps = 0}).find("eps"), std::string::npos);
  EXPECT_NE(error({.weight_decay = std::nanf("")}).find("weight_decay"), std::string::npos);
  auto opt = std::move(Optimizer::Create({}, 4)).value();
  std::vector<float> p(4), g(3);
  EXPECT_EQ(opt->Step(p, g).code(), StatusCode::kInvalidArgument);
}

TEST_F(TrainTest, AdamTrainsThroughTheGradientPath) {
  auto m = Make({"mlp", 20, 4, {16}});
  datasets::Dataset train = datasets::MakeSynthetic({.num_samples = 800, .seed = 1});
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  auto before = Evaluate(*m, p, train);
  TrainOptions opts{
      .epochs = 2,
      .batch_size = 32,
      .optimizer = {.kind = OptimizerKind::kAdamW, .learning_rate = 0.01f, .weight_decay = 0.01f},
      .seed = 9};
  ASSERT_TRUE(TrainLocal(*m, p, train, opts).ok());
  auto after = Evaluate(*m, p, train);
  EXPECT_GT(after->accuracy, 0.9);
  EXPECT_LT(after->loss, before->loss);
  opts.optimizer.beta1 = 2.0f;
  auto bad = TrainLocal(*m, p, train, opts);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("beta1"), std::string::npos);
}

TEST_F(TrainTest, LocalTrainingLearnsAndIsDeterministic) {
  auto m = Make({"mlp", 20, 4, {16}});
  datasets::Dataset train = datasets::MakeSynthetic({.num_samples = 800, .seed = 1});
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  auto before = Evaluate(*m, p, train);
  ASSERT_TRUE(before.ok());
  std::vector<float> a = p, b = p, c = p;
  TrainOptions opts{.epochs = 3,
                    .batch_size = 32,
                    .optimizer = {.learning_rate = 0.05f, .weight_decay = 1e-4f, .momentum = 0.5f},
                    .seed = 9};
  auto r = TrainLocal(*m, a, train, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples, 2400u);
  ASSERT_TRUE(TrainLocal(*m, b, train, opts).ok());
  EXPECT_EQ(a, b);  // Bit for bit.
  opts.seed = 10;
  ASSERT_TRUE(TrainLocal(*m, c, train, opts).ok());
  EXPECT_NE(a, c);
  auto after = Evaluate(*m, a, train);
  EXPECT_GT(after->accuracy, 0.9);
  EXPECT_LT(after->loss, before->loss);
}

TEST_F(TrainTest, MismatchedDataIsAnErrorNotACrash) {
  auto m = Make({"logreg", 20, 4, {}});
  datasets::Dataset wrong = datasets::MakeSynthetic({.num_samples = 10, .num_features = 21});
  std::vector<float> p(m->num_params());
  auto r = TrainLocal(*m, p, wrong, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("21 features"), std::string::npos);
  std::vector<float> short_params(5);
  datasets::Dataset ok = datasets::MakeSynthetic({.num_samples = 10});
  EXPECT_FALSE(TrainLocal(*m, short_params, ok, {}).ok());
}

TEST_F(TrainTest, CancelStopsTraining) {
  auto m = Make({"logreg", 20, 4, {}});
  datasets::Dataset data = datasets::MakeSynthetic({.num_samples = 100});
  std::vector<float> p(m->num_params());
  std::atomic<bool> cancel{true};
  EXPECT_EQ(TrainLocal(*m, p, data, {}, &cancel).status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace cohort::train
