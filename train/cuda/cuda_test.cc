// The `gpu` suite: the CUDA backend against the CPU backend on golden
// steps. Every test skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "datasets/synthetic.h"
#include "train/device.h"
#include "train/model.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpu = NewBackend({.device = "cuda:0"});
    if (!gpu.ok()) GTEST_SKIP() << "no GPU to test on: " << gpu.status();
    gpu_ = std::move(*gpu);
    cpu_ = std::move(NewCpuBackend(1)).value();
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

// The presets on Fashion-MNIST's shape, without the config layer (so this
// suite builds on a machine with nothing but a compiler, OpenBLAS and CUDA).
NetSpec Preset(const std::string& arch) {
  const Shape input = arch == "lenet5" ? Shape{1, 28, 28} : Shape{784, 1, 1};
  return NetSpec{
      input, 10,
      PresetLayers(arch, 10,
                   arch == "mlp" ? std::vector<uint32_t>{200, 200} : std::vector<uint32_t>{})};
}

// Trains `arch` for one epoch of 4 batches on both backends from the same
// start; the parameters agree within `rel` (relative to max(|p|, 1e-2)).
void ExpectSameStep(Backend* cpu, Backend* gpu, const std::string& arch,
                    const OptimizerOptions& optimizer, double rel) {
  SCOPED_TRACE(arch);
  const datasets::Dataset data =
      datasets::MakeSynthetic({.num_samples = 128, .num_features = 784, .num_classes = 10});
  auto on_cpu = std::move(Model::Create(Preset(arch), cpu)).value();
  auto on_gpu = std::move(Model::Create(Preset(arch), gpu)).value();
  std::vector<float> start(on_cpu->num_params());
  on_cpu->Init(start, 1);
  TrainOptions opts{.epochs = 1, .batch_size = 32, .optimizer = optimizer, .seed = 2};
  std::vector<float> a = start, b = start;
  auto ra = TrainLocal(*on_cpu, a, *std::move(DeviceDataset::Upload(cpu, data)).value(), opts);
  auto rb = TrainLocal(*on_gpu, b, *std::move(DeviceDataset::Upload(gpu, data)).value(), opts);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << " " << rb.status();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst =
        std::max(worst, std::fabs(double{a[i]} - b[i]) / std::max(std::fabs(double{a[i]}), 1e-2));
  }
  EXPECT_LT(worst, rel);
  EXPECT_NEAR(ra->mean_loss, rb->mean_loss, 1e-4 * std::fabs(ra->mean_loss));
  EXPECT_NE(a, start);
}

TEST_F(CudaTest, PlainSgdStepsMatchTheCpuBackend) {
  for (const char* arch : {"logreg", "mlp"}) {
    ExpectSameStep(cpu_.get(), gpu_.get(), arch, {.learning_rate = 0.05f}, 1e-5);
  }
  // Convolutions sum 25-150 products per output in another order: 1e-4.
  ExpectSameStep(cpu_.get(), gpu_.get(), "lenet5", {.learning_rate = 0.05f}, 1e-4);
}

TEST_F(CudaTest, GradientPathOptimizersMatchTheCpuBackend) {
  const OptimizerOptions momentum{
      .learning_rate = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f, .nesterov = true};
  const OptimizerOptions adamw{
      .kind = OptimizerKind::kAdamW, .learning_rate = 1e-3f, .weight_decay = 0.01f};
  for (const char* arch : {"logreg", "mlp"}) {
    ExpectSameStep(cpu_.get(), gpu_.get(), arch, momentum, 1e-5);
    ExpectSameStep(cpu_.get(), gpu_.get(), arch, adamw, 1e-5);
  }
  ExpectSameStep(cpu_.get(), gpu_.get(), "lenet5", momentum, 1e-4);
  ExpectSameStep(cpu_.get(), gpu_.get(), "lenet5", adamw, 1e-4);
}

// FedProx's proximal term (rules.h ProximalGradient) in the CUDA kernels:
// the CPU backend is the reference (train/fedprox_test matches it to
// PyTorch). mu large enough that the term moves the result.
TEST_F(CudaTest, FedProxStepsMatchTheCpuBackend) {
  const OptimizerOptions momentum{
      .learning_rate = 0.05f, .weight_decay = 1e-4f, .momentum = 0.9f, .proximal_mu = 0.5f};
  const OptimizerOptions adam{
      .kind = OptimizerKind::kAdam, .learning_rate = 1e-3f, .proximal_mu = 0.1f};
  const OptimizerOptions plain{.learning_rate = 0.05f, .proximal_mu = 1.0f};
  for (const char* arch : {"logreg", "mlp"}) {
    ExpectSameStep(cpu_.get(), gpu_.get(), arch, momentum, 1e-5);
    ExpectSameStep(cpu_.get(), gpu_.get(), arch, adam, 1e-5);
    ExpectSameStep(cpu_.get(), gpu_.get(), arch, plain, 1e-5);
  }
  ExpectSameStep(cpu_.get(), gpu_.get(), "lenet5", momentum, 1e-4);
}

TEST_F(CudaTest, EvaluationMatchesTheCpuBackend) {
  const datasets::Dataset data =
      datasets::MakeSynthetic({.num_samples = 1000, .num_features = 784, .num_classes = 10});
  auto on_cpu = std::move(Model::Create(Preset("lenet5"), cpu_.get())).value();
  auto on_gpu = std::move(Model::Create(Preset("lenet5"), gpu_.get())).value();
  std::vector<float> p(on_cpu->num_params());
  on_cpu->Init(p, 3);
  auto a = Evaluate(*on_cpu, p, *std::move(DeviceDataset::Upload(cpu_.get(), data)).value(), 300);
  auto b = Evaluate(*on_gpu, p, *std::move(DeviceDataset::Upload(gpu_.get(), data)).value(), 300);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->loss, b->loss, 1e-5 * a->loss);
  EXPECT_EQ(a->accuracy, b->accuracy);
}

TEST_F(CudaTest, OutOfDeviceMemoryIsAnErrorNamingTheSize) {
  auto huge = DeviceArray<float>::Create(gpu_.get(), size_t{1} << 42);  // 16 TiB.
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("17592186044416 bytes"), std::string::npos)
      << huge.status();
  // The backend still works afterwards.
  auto small = DeviceArray<float>::Create(gpu_.get(), 1024);
  EXPECT_TRUE(small.ok());
  EXPECT_TRUE(gpu_->Sync().ok());
}

// NCCL on device buffers. One GPU holds one rank (NCCL refuses two ranks
// on one device), so the group has one rank: its sum is its own vector,
// here of a length no chunking divides, after Axpy built it on the device.
TEST_F(CudaTest, NcclSumsADeviceBufferInAGroupOfOne) {
  if (!gpu_->HasDeviceCollectives(1)) GTEST_SKIP() << "the plugin was built without NCCL";
  auto id = gpu_->NewGroupId();
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(gpu_->JoinGroup(*id, 0, 1, 60000).ok());
  const size_t n = (size_t{16} << 20) + 3;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(i % 1000) * 0.25f, y[i] = 1.0f;
  auto dx = std::move(DeviceArray<float>::Create(gpu_.get(), n)).value();
  auto dy = std::move(DeviceArray<float>::Create(gpu_.get(), n)).value();
  gpu_->Upload(dx.data(), x.data(), n * sizeof(float));
  gpu_->Upload(dy.data(), y.data(), n * sizeof(float));
  gpu_->Axpy(2.0f, dx.data(), dy.data(), n);  // y = 1 + 2x, exactly.
  ASSERT_TRUE(gpu_->AllReduceSum(dy.data(), n, 60000).ok());
  std::vector<float> out(n);
  gpu_->Download(out.data(), dy.data(), n * sizeof(float));
  ASSERT_TRUE(gpu_->Sync().ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 1.0f + 2.0f * x[i]) << i;
  // A second group on the same backend is an error, not a leak.
  EXPECT_FALSE(gpu_->JoinGroup(*id, 0, 1, 60000).ok());
}

}  // namespace
}  // namespace cohort::train
