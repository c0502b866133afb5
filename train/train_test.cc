#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "datasets/synthetic.h"
#include "train/backend.h"
#include "train/model.h"
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
TEST_F(TrainTest, BackpropMatchesFiniteDifferences) {
  auto m = Make({"mlp", 6, 3, {5}});
  datasets::Dataset data =
      datasets::MakeSynthetic({.num_samples = 4, .num_features = 6, .num_classes = 3, .seed = 5});
  std::vector<float> p(m->num_params());
  m->Init(p, 3);
  std::vector<float> stepped = p;
  SgdOptions sgd{.learning_rate = 1.0f};
  m->TrainStep(stepped, {}, data.features.data(), data.labels.data(), 4, sgd, true);
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
    const double analytic = p[i] - stepped[i];
    EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "param " << i;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_F(TrainTest, FusedAndUnfusedSgdAgree) {
  auto m = Make({"mlp", 10, 4, {8}});
  datasets::Dataset data = datasets::MakeSynthetic({.num_samples = 64, .num_features = 10});
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  std::vector<float> fused = p, unfused = p;
  std::vector<float> velocity(p.size());
  m->TrainStep(fused, {}, data.features.data(), data.labels.data(), 32, {0.1f, 0.0f, 0.0f}, true);
  // Momentum on the first step equals plain SGD (PyTorch semantics).
  m->TrainStep(unfused, velocity, data.features.data(), data.labels.data(), 32, {0.1f, 0.9f, 0.0f},
               true);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(fused[i], unfused[i], 1e-5f);
}

TEST_F(TrainTest, LocalTrainingLearnsAndIsDeterministic) {
  auto m = Make({"mlp", 20, 4, {16}});
  datasets::Dataset train = datasets::MakeSynthetic({.num_samples = 800, .seed = 1});
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  auto before = Evaluate(*m, p, train);
  ASSERT_TRUE(before.ok());
  std::vector<float> a = p, b = p, c = p;
  TrainOptions opts{.epochs = 3, .batch_size = 32, .sgd = {0.05f, 0.5f, 1e-4f}, .seed = 9};
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
