#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "common/rng.h"
#include "datasets/synthetic.h"
#include "proto/config_io.h"
#include "tests/data/optimizer_golden.h"
#include "train/backend.h"
#include "train/device.h"
#include "train/model.h"
#include "train/model_config.h"
#include "train/optimizer.h"
#include "train/train_progress.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

LayerSpec Linear(uint32_t out) { return {LayerKind::kLinear, out}; }
LayerSpec Conv(uint32_t out, uint32_t k, uint32_t stride = 1, uint32_t pad = 0) {
  return {LayerKind::kConv2d, out, k, stride, pad};
}
LayerSpec Pool(uint32_t k, uint32_t stride) { return {LayerKind::kMaxPool2d, 0, k, stride}; }
LayerSpec Relu() { return {LayerKind::kRelu}; }
LayerSpec Flatten() { return {LayerKind::kFlatten}; }

class TrainTest : public ::testing::Test {
 public:
  void SetUp() override { backend_ = std::move(NewCpuBackend(1)).value(); }
  // A preset as the config names it: "mlp" with hidden widths, "logreg", "lenet5".
  std::unique_ptr<Model> Preset(const std::string& arch, uint32_t in, uint32_t classes,
                                std::vector<uint32_t> hidden = {}) {
    config::ModelConfig c;
    c.set_arch(arch);
    c.set_input_dim(in);
    c.set_num_classes(classes);
    for (uint32_t h : hidden) c.add_hidden(h);
    return std::move(BuildModel(c, backend_.get())).value();
  }
  std::unique_ptr<Model> Net(Shape input, uint32_t classes, std::vector<LayerSpec> layers) {
    return std::move(Model::Create({input, classes, std::move(layers)}, backend_.get())).value();
  }
  std::unique_ptr<DeviceDataset> Upload(const datasets::Dataset& d) {
    return std::move(DeviceDataset::Upload(backend_.get(), d)).value();
  }
  // Mean loss of `params` on the first `batch` samples (CPU memory is the
  // backend's, so host pointers serve).
  double Loss(Model& m, std::span<const float> params, const datasets::Dataset& d, int batch) {
    EXPECT_TRUE(m.SetParams(params).ok() && m.Reserve(batch).ok());
    double stats[2] = {0, 0};
    m.Evaluate(d.features.data(), d.labels.data(), batch, stats);
    return stats[0] / batch;
  }
  std::vector<float> Gradient(Model& m, std::span<const float> params, const datasets::Dataset& d,
                              int batch) {
    EXPECT_TRUE(m.SetParams(params).ok() && m.Reserve(batch).ok());
    double stats[2] = {0, 0};
    m.Backward(d.features.data(), d.labels.data(), batch, stats);
    return {m.grads().begin(), m.grads().end()};
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(TrainTest, LayoutMatchesPyTorchParameterCount) {
  auto mlp = Preset("mlp", 784, 10, {200, 200});
  EXPECT_EQ(mlp->num_params(), 199210u);  // As torch's 784-200-200-10.
  EXPECT_EQ(Preset("logreg", 784, 10)->num_params(), 7850u);
  auto lenet = Preset("lenet5", 784, 10);
  EXPECT_EQ(lenet->num_params(), 44426u);                    // NIID-Bench's LeNet in PyTorch.
  EXPECT_EQ(lenet->layout().tensors()[0].name, "0.weight");  // nn.Sequential's names.
  EXPECT_EQ(lenet->layout().tensors()[0].cols, 25u);         // 6 x (5 x 5 x 1).
  EXPECT_EQ(lenet->layout().tensors()[2].name, "3.weight");
  EXPECT_EQ(lenet->layout().tensors()[4].rows * lenet->layout().tensors()[4].cols, 256u * 120);
  EXPECT_EQ(mlp->layout().tensors()[2].name, "2.weight");
}

TEST_F(TrainTest, InitFollowsFanInBoundsAndSeed) {
  auto m = Preset("mlp", 100, 4, {25});
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
  // A conv's fan-in is kernel x kernel x in_channels: 1/sqrt(2 x 9).
  auto conv = Net({2, 5, 5}, 3, {Conv(4, 3), Flatten(), Linear(3)});
  std::vector<float> q(conv->num_params());
  conv->Init(q, 1);
  max = 0;
  for (float v : conv->layout().View(std::span<const float>(q), 0))
    max = std::max(max, std::fabs(v));
  EXPECT_LE(max, 1.0f / std::sqrt(18.0f));
  EXPECT_GT(max, 0.8f / std::sqrt(18.0f));
}

// Every parameter's gradient against a central difference of the mean loss
// (float32 forward passes: tolerance 2e-3 absolute + 2 % relative). Where a
// ReLU or a pool's winner flips within +-h the loss has a kink there, and the
// one-sided differences disagree: such parameters are skipped, and at most
// `max_kinks` of them may be (overlapping pools flip often).
void ExpectGradientMatchesFiniteDifferences(TrainTest& t, Model& m, const datasets::Dataset& data,
                                            int batch, uint64_t seed, float h = 1e-2f,
                                            double max_kinks = 0.1) {
  std::vector<float> p(m.num_params());
  m.Init(p, seed);
  const std::vector<float> grads = t.Gradient(m, p, data, batch);
  const double at = t.Loss(m, p, data, batch);
  int checked = 0, nonzero = 0, kinks = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<float> plus = p, minus = p;
    plus[i] += h;
    minus[i] -= h;
    const double up = t.Loss(m, plus, data, batch), down = t.Loss(m, minus, data, batch);
    const double forward = (up - at) / h, backward = (at - down) / h;
    if (std::fabs(forward - backward) > 3e-3 + 5e-3 * std::fabs(forward + backward)) {
      ++kinks;
      continue;
    }
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(grads[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "param " << i;
    ++checked;
    nonzero += std::fabs(numeric) > 1e-3 ? 1 : 0;
  }
  EXPECT_LE(kinks, static_cast<int>(max_kinks * p.size()));
  EXPECT_GT(nonzero, checked / 3) << "too few parameters move the loss to test anything";
}

TEST_F(TrainTest, LinearAndReluGradientsMatchFiniteDifferences) {
  datasets::Dataset data =
      datasets::MakeSynthetic({.num_samples = 4, .num_features = 6, .num_classes = 3, .seed = 5});
  auto m = Preset("mlp", 6, 3, {5});
  ExpectGradientMatchesFiniteDifferences(*this, *m, data, 4, 3);
}

TEST_F(TrainTest, ConvPoolAndFlattenGradientsMatchFiniteDifferences) {
  // Two input channels; a padded, strided conv; an overlapping pool (stride
  // 1 < kernel 2, so a pixel can win several windows); a second conv, whose
  // input gradient goes through col2im into the first.
  datasets::Dataset data = datasets::MakeSynthetic(
      {.num_samples = 3, .num_features = 2 * 7 * 7, .num_classes = 3, .seed = 8});
  auto m = Net({2, 7, 7}, 3,
               {Conv(3, 3, 2, 1), Relu(), Pool(2, 1), Conv(4, 2), Relu(), Flatten(), Linear(3)});
  // 2 channels: the batch must be channel-last, as Gather writes it.
  datasets::Dataset hwc = data;
  for (size_t s = 0; s < data.size(); ++s) {
    for (size_t p = 0; p < 49; ++p) {
      for (size_t c = 0; c < 2; ++c)
        hwc.features[s * 98 + p * 2 + c] = data.features[s * 98 + c * 49 + p];
    }
  }
  ExpectGradientMatchesFiniteDifferences(*this, *m, hwc, 3, 11, 1e-3f, 0.3);
  // One input channel: the CPU backend's tap-major im2col.
  datasets::Dataset gray = datasets::MakeSynthetic(
      {.num_samples = 3, .num_features = 7 * 7, .num_classes = 3, .seed = 9});
  auto single = Net({1, 7, 7}, 3, {Conv(3, 3, 2, 1), Relu(), Pool(2, 2), Flatten(), Linear(3)});
  ExpectGradientMatchesFiniteDifferences(*this, *single, gray, 3, 12, 1e-3f, 0.3);
}

// The backend's convolution against direct loops, for one and for several
// input channels (the CPU backend lays im2col out differently for each),
// with padding and a stride.
TEST_F(TrainTest, ConvolutionMatchesDirectLoops) {
  for (int c : {1, 3}) {
    for (int stride : {1, 2}) {
      SCOPED_TRACE("channels " + std::to_string(c) + ", stride " + std::to_string(stride));
      const int h = 6, w = 5, k = 3, pad = 1, oc = 2, batch = 2;
      const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
      ConvGeom g{c, h, w, k, stride, pad, oh, ow, oc};
      Rng rng(c * 10 + stride);
      std::vector<float> x(batch * h * w * c), wt(oc * k * k * c), bias(oc);
      for (float& v : x) v = float(rng.Normal());
      for (float& v : wt) v = float(rng.Normal());
      for (float& v : bias) v = float(rng.Normal());
      // Workspace and output hold garbage, as reused device buffers do.
      std::vector<float> saved(batch * g.workspace(), std::nanf("")),
          y(batch * oh * ow * oc, std::nanf(""));
      backend_->ConvForward(x.data(), wt.data(), bias.data(), g, batch, saved.data(), y.data());
      for (int b = 0; b < batch; ++b) {
        for (int oy = 0; oy < oh; ++oy) {
          for (int ox = 0; ox < ow; ++ox) {
            for (int o = 0; o < oc; ++o) {
              double sum = bias[o];
              for (int ky = 0; ky < k; ++ky) {
                for (int kx = 0; kx < k; ++kx) {
                  const int iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  for (int ch = 0; ch < c; ++ch) {
                    sum += double{x[((b * h + iy) * w + ix) * c + ch]} *
                           wt[((o * k + ky) * k + kx) * c + ch];
                  }
                }
              }
              EXPECT_NEAR(y[((b * oh + oy) * ow + ox) * oc + o], sum, 1e-4)
                  << b << " " << oy << " " << ox << " " << o;
            }
          }
        }
      }
    }
  }
}

TEST_F(TrainTest, GatherReadsChannelMajorSamplesIntoChannelLast) {
  datasets::Dataset d;
  d.num_features = 2 * 2 * 3;  // C = 2, H = 2, W = 3
  d.num_classes = 2;
  for (int i = 0; i < 24; ++i) d.features.push_back(float(i));
  d.labels = {0, 1};
  auto dev = Upload(d);
  const uint32_t index[2] = {1, 0};
  std::vector<float> x(24);
  int32_t y[2];
  backend_->Gather(dev->features(), dev->labels(), index, 2, 2, 2, 3, x.data(), y);
  // Sample 1 first: pixel p, channel c was at 12 + c * 6 + p.
  EXPECT_EQ(x[0], 12.0f);
  EXPECT_EQ(x[1], 18.0f);
  EXPECT_EQ(x[2], 13.0f);
  EXPECT_EQ(x[12], 0.0f);
  EXPECT_EQ(x[13], 6.0f);
  EXPECT_EQ(y[0], 1);
  EXPECT_EQ(y[1], 0);
}

// Data-parallel training takes the gradient path (Backward, all-reduce,
// Optimizer::Step); local plain SGD the fused one. Over 20 steps they stay
// within float rounding of each other, for an MLP and for a CNN.
void ExpectFusedEqualsGradientPath(TrainTest& t, Model& m, const datasets::Dataset& data) {
  std::vector<float> p(m.num_params());
  m.Init(p, 0);
  const size_t nf = data.num_features;
  std::vector<float> fused = p, split = p;
  auto sgd = std::move(Optimizer::Create({.learning_rate = 0.1f}, p.size(), m.backend())).value();
  ASSERT_TRUE(m.Reserve(32).ok());
  for (int step = 0; step < 20; ++step) {
    const float* x = data.features.data() + size_t(step) * 32 * nf;
    const int32_t* y = data.labels.data() + size_t(step) * 32;
    double a[2] = {0, 0}, b[2] = {0, 0};
    ASSERT_TRUE(m.SetParams(fused).ok());
    m.SgdStep(x, y, 32, 0.1f, a);
    ASSERT_TRUE(m.GetParams(fused).ok());
    ASSERT_TRUE(m.SetParams(split).ok());
    m.Backward(x, y, 32, b);
    ASSERT_TRUE(sgd->Step(split, m.grads()).ok());
    EXPECT_EQ(a[1], b[1]);
    EXPECT_NEAR(a[0], b[0], 1e-4 * std::fabs(a[0]));
  }
  double max_diff = 0;
  for (size_t i = 0; i < p.size(); ++i)
    max_diff = std::max(max_diff, double{std::fabs(fused[i] - split[i])});
  EXPECT_LT(max_diff, 1e-5);
  EXPECT_NE(fused, p);
}

TEST_F(TrainTest, FusedSgdEqualsGradientPathToFloatRounding) {
  auto mlp = Preset("mlp", 10, 4, {16, 8});
  ExpectFusedEqualsGradientPath(*this, *mlp,
                                datasets::MakeSynthetic({.num_samples = 640, .num_features = 10}));
  auto cnn = Net({1, 8, 8}, 4,
                 {Conv(4, 3, 1, 1), Relu(), Pool(2, 2), Conv(6, 3), Relu(), Flatten(), Linear(4)});
  ExpectFusedEqualsGradientPath(*this, *cnn,
                                datasets::MakeSynthetic({.num_samples = 640, .num_features = 64}));
}

TEST_F(TrainTest, TrainLocalStepsThroughBackwardAndTheOptimizer) {
  // One batch of momentum SGD through TrainLocal equals Backward and one
  // Optimizer step by hand (so TrainStep does not take the fused path).
  auto m = Preset("mlp", 10, 4, {8});
  datasets::Dataset data = datasets::MakeSynthetic({.num_samples = 16, .num_features = 10});
  std::vector<float> p(m->num_params());
  m->Init(p, 4);
  TrainOptions opts{.epochs = 1,
                    .batch_size = 16,
                    .optimizer = {.learning_rate = 0.1f, .weight_decay = 0.01f, .momentum = 0.9f},
                    .seed = 3};
  std::vector<float> through_trainer = p;
  ASSERT_TRUE(TrainLocal(*m, through_trainer, *Upload(data), opts).ok());
  // The whole shard is one batch, so the shuffle only reorders the mean's terms.
  std::vector<float> by_hand = p;
  std::vector<float> grads = Gradient(*m, by_hand, data, 16);
  auto opt = std::move(Optimizer::Create(opts.optimizer, p.size(), backend_.get())).value();
  ASSERT_TRUE(opt->Step(by_hand, grads).ok());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(through_trainer[i], by_hand[i], 1e-6) << i;
  // Plain SGD (the fused path) gives another result: no weight decay.
  std::vector<float> fused = p;
  ASSERT_TRUE(m->SetParams(fused).ok());
  double stats[2] = {0, 0};
  m->SgdStep(data.features.data(), data.labels.data(), 16, 0.1f, stats);
  ASSERT_TRUE(m->GetParams(fused).ok());
  EXPECT_NE(fused, by_hand);
}

// Golden values recorded with PyTorch's own torch.optim (see
// tests/data/make_optimizer_golden.py): 5 parameters, 3 steps with fixed
// gradients, so momentum and Adam's moments carry across steps.
TEST(OptimizerTest, StepsMatchPyTorchGoldenVectors) {
  auto backend = std::move(NewCpuBackend(1)).value();
  const std::vector<testing::OptimizerGolden> cases = testing::ReadOptimizerGolden();
  int checked = 0;
  for (const testing::OptimizerGolden& c : cases) {
    if (c.kind == "server") continue;  // aggregation/fedavg_test.cc
    OptimizerOptions o{.kind = c.kind == "adam"    ? OptimizerKind::kAdam
                               : c.kind == "adamw" ? OptimizerKind::kAdamW
                                                   : OptimizerKind::kSgd,
                       .learning_rate = c.lr,
                       .weight_decay = c.weight_decay,
                       .momentum = c.momentum,
                       .dampening = c.dampening,
                       .nesterov = c.nesterov,
                       .beta1 = c.beta1,
                       .beta2 = c.beta2,
                       .eps = c.eps};
    auto opt = Optimizer::Create(o, 5, backend.get());
    ASSERT_TRUE(opt.ok()) << c.name << ": " << opt.status();
    std::vector<float> p = testing::kGoldenStart;
    for (const auto& g : testing::kGoldenGrads) ASSERT_TRUE((*opt)->Step(p, g).ok()) << c.name;
    ASSERT_EQ(c.expected.size(), p.size()) << c.name;
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(p[i], c.expected[i], 1e-6 * std::max(1.0, std::fabs(c.expected[i])))
          << c.name << ", parameter " << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 9) << "tests/data/optimizer_golden.txt is missing cases";
}

TEST(OptimizerTest, BadOptionsAreErrorsNamingTheOption) {
  auto backend = std::move(NewCpuBackend(1)).value();
  auto error = [&](const OptimizerOptions& o) {
    return std::string(Optimizer::Create(o, 4, backend.get()).status().message());
  };
  EXPECT_NE(error({.learning_rate = -1}).find("learning_rate"), std::string::npos);
  EXPECT_NE(error({.momentum = 1.0f}).find("momentum"), std::string::npos);
  EXPECT_NE(error({.nesterov = true}).find("nesterov"), std::string::npos);
  EXPECT_NE(error({.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}).find("nesterov"),
            std::string::npos);
  EXPECT_NE(error({.kind = OptimizerKind::kAdam, .beta2 = 1.0f}).find("beta2"), std::string::npos);
  EXPECT_NE(error({.kind = OptimizerKind::kAdamW, .eps = 0}).find("eps"), std::string::npos);
  EXPECT_NE(error({.weight_decay = std::nanf("")}).find("weight_decay"), std::string::npos);
  auto opt = std::move(Optimizer::Create({}, 4, backend.get())).value();
  std::vector<float> p(4), g(3);
  EXPECT_EQ(opt->Step(p, g).code(), StatusCode::kInvalidArgument);
}

TEST_F(TrainTest, AdamTrainsThroughTheGradientPath) {
  auto m = Preset("mlp", 20, 4, {16});
  auto train = Upload(datasets::MakeSynthetic({.num_samples = 800, .seed = 1}));
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  auto before = Evaluate(*m, p, *train);
  TrainOptions opts{
      .epochs = 2,
      .batch_size = 32,
      .optimizer = {.kind = OptimizerKind::kAdamW, .learning_rate = 0.01f, .weight_decay = 0.01f},
      .seed = 9};
  ASSERT_TRUE(TrainLocal(*m, p, *train, opts).ok());
  auto after = Evaluate(*m, p, *train);
  EXPECT_GT(after->accuracy, 0.9);
  EXPECT_LT(after->loss, before->loss);
  opts.optimizer.beta1 = 2.0f;
  auto bad = TrainLocal(*m, p, *train, opts);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("beta1"), std::string::npos);
}

// Progress is drawn per epoch and changes nothing computed.
TEST_F(TrainTest, EpochProgressSaysEachEpochAndChangesNothing) {
  auto m = Preset("mlp", 20, 4, {16});
  auto train = Upload(datasets::MakeSynthetic({.num_samples = 100, .seed = 1}));
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  std::vector<float> quiet = p;
  TrainOptions opts{.epochs = 2, .batch_size = 32, .seed = 9};
  ASSERT_TRUE(TrainLocal(*m, quiet, *train, opts).ok());
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  opts.progress = EpochProgress("round 3", 2, out, ProgressMode::kLines);
  ASSERT_TRUE(TrainLocal(*m, p, *train, opts).ok());
  std::fclose(out);
  const std::string said(text, size);
  std::free(text);
  EXPECT_EQ(p, quiet);
  EXPECT_NE(said.find("round 3 epoch 1/2: done, 100 samples in "), std::string::npos) << said;
  EXPECT_NE(said.find("round 3 epoch 2/2: done, 100 samples in "), std::string::npos) << said;
  EXPECT_NE(said.find("samples/s)"), std::string::npos) << said;
}

TEST_F(TrainTest, LocalTrainingLearnsAndIsDeterministic) {
  auto m = Preset("mlp", 20, 4, {16});
  auto train = Upload(datasets::MakeSynthetic({.num_samples = 800, .seed = 1}));
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  auto before = Evaluate(*m, p, *train);
  ASSERT_TRUE(before.ok());
  std::vector<float> a = p, b = p, c = p;
  TrainOptions opts{.epochs = 3,
                    .batch_size = 32,
                    .optimizer = {.learning_rate = 0.05f, .weight_decay = 1e-4f, .momentum = 0.5f},
                    .seed = 9};
  auto r = TrainLocal(*m, a, *train, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples, 2400u);
  EXPECT_EQ(r->steps, 75u);  // 800 / 32 = 25 batches an epoch, 3 epochs.
  ASSERT_TRUE(TrainLocal(*m, b, *train, opts).ok());
  EXPECT_EQ(a, b);  // Bit for bit.
  opts.seed = 10;
  ASSERT_TRUE(TrainLocal(*m, c, *train, opts).ok());
  EXPECT_NE(a, c);
  auto after = Evaluate(*m, a, *train);
  EXPECT_GT(after->accuracy, 0.9);
  EXPECT_LT(after->loss, before->loss);
}

TEST_F(TrainTest, MismatchedDataIsAnErrorNotACrash) {
  auto m = Preset("logreg", 20, 4);
  auto wrong = Upload(datasets::MakeSynthetic({.num_samples = 10, .num_features = 21}));
  std::vector<float> p(m->num_params());
  auto r = TrainLocal(*m, p, *wrong, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("21 features"), std::string::npos);
  std::vector<float> short_params(5);
  auto ok = Upload(datasets::MakeSynthetic({.num_samples = 10}));
  EXPECT_FALSE(TrainLocal(*m, short_params, *ok, {}).ok());
}

TEST_F(TrainTest, CancelStopsTraining) {
  auto m = Preset("logreg", 20, 4);
  auto data = Upload(datasets::MakeSynthetic({.num_samples = 100}));
  std::vector<float> p(m->num_params());
  std::atomic<bool> cancel{true};
  EXPECT_EQ(TrainLocal(*m, p, *data, {}, &cancel).status().code(), StatusCode::kCancelled);
}

TEST(DeviceTest, DeviceFlagPicksTheBackendOrSaysWhyNot) {
  auto cpu = NewBackend({.device = "cpu"});
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->Name(), "cpu (OpenBLAS)");
  auto bad = NewBackend({.device = "gpu0"});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--device gpu0: must be cpu, cuda, cuda:N or auto"),
            std::string::npos);
  auto missing = NewBackend({.device = "cuda:7"});
  if (missing.ok()) GTEST_SKIP() << "this host has a cuda:7";
  EXPECT_NE(missing.status().message().find("--device cuda:7"), std::string::npos)
      << missing.status();
  // auto falls back to the CPU where no GPU is usable, and says why.
  std::string note;
  auto any = NewBackend({.device = "auto"}, &note);
  ASSERT_TRUE(any.ok());
  if ((*any)->Name().rfind("cpu", 0) == 0) {
    EXPECT_NE(note.find("training on the CPU"), std::string::npos) << note;
    EXPECT_NE(note.find(CudaBuilt() ? "GPU" : "no CUDA backend"), std::string::npos) << note;
  }
}

TEST_F(TrainTest, Lenet5LearnsOnImages) {
  // 28 x 28 synthetic images: the CNN path end to end through TrainLocal.
  auto m = Preset("lenet5", 784, 4);
  auto train =
      Upload(datasets::MakeSynthetic({.num_samples = 512, .num_features = 784, .seed = 2}));
  std::vector<float> p(m->num_params());
  m->Init(p, 0);
  auto before = Evaluate(*m, p, *train);
  TrainOptions opts{
      .epochs = 2, .batch_size = 32, .optimizer = {.learning_rate = 0.05f}, .seed = 1};
  auto r = TrainLocal(*m, p, *train, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  auto after = Evaluate(*m, p, *train);
  EXPECT_LT(after->loss, before->loss * 0.5);
  EXPECT_GT(after->accuracy, 0.9);
}

}  // namespace
}  // namespace cohort::train
