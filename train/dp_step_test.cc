// The data-parallel step with N ranks as threads of this process (Gloo's
// way), over the in-process and shared-memory transports: the ranks' step
// is one process's step over the union of their samples, every rank ends
// with the same bits, and a bad gradient or a cancel stops every rank alike.
#include "train/dp_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <thread>

#include "datasets/dataset.h"
#include "datasets/synthetic.h"
#include "net/inprocess_transport.h"
#include "net/shm_transport.h"
#include "train/device.h"
#include "train/model_config.h"

namespace cohort::train {
namespace {

enum class Kind { kInProcess, kShm };

// `size` connected transports.
struct Group {
  Group(Kind kind, int size) : hub(size) {
    if (kind == Kind::kInProcess) {
      for (int r = 0; r < size; ++r) transports.push_back(hub.Connect(r));
      return;
    }
    std::vector<std::string> endpoints;
    std::vector<net::ShmTransport*> shm;
    for (int r = 0; r < size; ++r) {
      auto t = std::move(net::ShmTransport::Create(r, size)).value();
      endpoints.push_back(t->endpoint());
      shm.push_back(t.get());
      transports.push_back(std::move(t));
    }
    for (net::ShmTransport* t : shm) EXPECT_TRUE(t->Connect(endpoints).ok());
    for (net::ShmTransport* t : shm) t->Unlink();
  }
  net::InProcessHub hub;
  std::vector<std::unique_ptr<collective::Transport>> transports;
};

config::ModelConfig Mlp() {
  config::ModelConfig m;
  m.set_arch("mlp");
  m.set_input_dim(20);
  m.set_num_classes(4);
  m.add_hidden(16);
  m.add_hidden(12);
  return m;
}

OptimizerOptions Momentum() {
  OptimizerOptions o;
  o.learning_rate = 0.1f;
  o.momentum = 0.9f;
  return o;
}

// One rank: its backend, data (samples in order 0..n-1), model and step.
struct Rank {
  Rank(const datasets::Dataset& d, const std::vector<float>& start)
      : backend(std::move(NewBackend({.device = "cpu"})).value()),
        data(std::move(DeviceDataset::Upload(backend.get(), d)).value()),
        model(std::move(BuildModel(Mlp(), backend.get())).value()),
        optimizer(std::move(Optimizer::Create(Momentum(), start.size(), backend.get())).value()),
        order(std::move(DeviceArray<uint32_t>::Create(backend.get(), d.size())).value()),
        stats(std::move(DeviceArray<double>::Create(backend.get(), 2)).value()) {
    std::vector<uint32_t> iota(d.size());
    std::iota(iota.begin(), iota.end(), 0);
    backend->Upload(order.data(), iota.data(), order.bytes());
    backend->Zero(stats.data(), stats.bytes());
    EXPECT_TRUE(model->SetParams(start).ok());
  }
  std::vector<float> Params() {
    std::vector<float> p(model->num_params());
    EXPECT_TRUE(model->GetParams(p).ok());
    return p;
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceDataset> data;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  DeviceArray<uint32_t> order;
  DeviceArray<double> stats;
  std::unique_ptr<collective::Communicator> comm;
  std::unique_ptr<DataParallelStep> step;
};

std::vector<float> StartModel() {
  auto backend = std::move(NewBackend({.device = "cpu"})).value();
  auto model = std::move(BuildModel(Mlp(), backend.get())).value();
  std::vector<float> start(model->num_params());
  model->Init(start, 5);
  return start;
}

// `world` ranks, rank r holding data[r], each running `body` on a thread
// of its own over `kind`; returns the ranks (their models as trained).
std::vector<std::unique_ptr<Rank>> RunRanks(Kind kind, const std::vector<datasets::Dataset>& data,
                                            const DataParallelStepOptions& options,
                                            const std::function<void(int, Rank&)>& body) {
  const int world = static_cast<int>(data.size());
  const std::vector<float> start = StartModel();
  Group group(kind, world);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<Rank>(data[r], start));
    ranks[r]->comm = std::make_unique<collective::Communicator>(group.transports[r].get());
    ranks[r]->step = std::move(DataParallelStep::Create(ranks[r]->model.get(), ranks[r]->data.get(),
                                                        ranks[r]->comm.get(), options))
                         .value();
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, *ranks[r]); });
  for (std::thread& t : threads) t.join();
  for (auto& rank : ranks) rank->step.reset();  // Its reducer, before the transports.
  return ranks;
}

// One process: full-batch steps over all of `data` (Backward's mean
// gradient and the optimizer), the reference.
std::vector<float> OneProcess(const datasets::Dataset& data, int steps) {
  Rank alone(data, StartModel());
  const int n = static_cast<int>(data.size());
  DeviceArray<float> x =
      std::move(DeviceArray<float>::Create(alone.backend.get(), size_t(n) * 20)).value();
  DeviceArray<int32_t> y =
      std::move(DeviceArray<int32_t>::Create(alone.backend.get(), size_t(n))).value();
  EXPECT_TRUE(alone.model->Reserve(n).ok());
  for (int s = 0; s < steps; ++s) {
    const Shape& in = alone.model->spec().input;
    alone.backend->Gather(alone.data->features(), alone.data->labels(), alone.order.data(), n,
                          int(in.c), int(in.h), int(in.w), x.data(), y.data());
    alone.model->Backward(x.data(), y.data(), n, alone.stats.data());
    EXPECT_TRUE(alone.optimizer->Step(alone.model->params(), alone.model->grads()).ok());
  }
  return alone.Params();
}

double Worst(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  }
  return worst;
}

class DataParallelStepTest : public ::testing::TestWithParam<Kind> {};

// Three ranks split one global batch of 24 (8 each, in micro-batches of 3,
// the last one short): after 5 momentum steps every rank holds the same
// bits, and they are one process's full-batch steps up to float rounding.
TEST_P(DataParallelStepTest, ShareBeforeSumIsOneProcessOverTheGlobalBatch) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 24, .seed = 3});
  DataParallelStepOptions options;
  options.micro_batch = 3;
  auto ranks = RunRanks(GetParam(), {all, all, all}, options, [](int r, Rank& rank) {
    for (int s = 0; s < 5; ++s) {
      auto report = rank.step->Step(rank.order.data(), 8 * r, 8 * (r + 1), 24, *rank.optimizer,
                                    rank.stats.data());
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_TRUE(report->stepped);
    }
  });
  const std::vector<float> reference = OneProcess(all, 5);
  for (auto& rank : ranks) EXPECT_EQ(rank->Params(), ranks[0]->Params()) << "replicas differ";
  EXPECT_LT(Worst(ranks[0]->Params(), reference), 1e-5);
  EXPECT_GT(Worst(ranks[0]->Params(), StartModel()), 1e-2) << "nothing trained";
}

// Sites: each rank its own shard, of 5, 11 and 0 samples (the last rank
// takes part with nothing). The step is the mean over the 16.
TEST_P(DataParallelStepTest, SumThenDivideWithUnevenPartsIsOneProcessOverTheUnion) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 16, .seed = 4});
  std::vector<uint32_t> first(5), second(11);
  std::iota(first.begin(), first.end(), 0);
  std::iota(second.begin(), second.end(), 5);
  DataParallelStepOptions options;
  options.weighting = GradientWeighting::kSumThenDivide;
  options.micro_batch = 11;
  const std::vector<datasets::Dataset> shards = {
      datasets::Subset(all, first), datasets::Subset(all, second), datasets::Subset(all, {})};
  auto ranks = RunRanks(GetParam(), shards, options, [&](int r, Rank& rank) {
    for (int s = 0; s < 4; ++s) {
      auto report = rank.step->Step(rank.order.data(), 0, shards[r].size(), 0, *rank.optimizer,
                                    rank.stats.data());
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_TRUE(report->stepped);
    }
  });
  for (auto& rank : ranks) EXPECT_EQ(rank->Params(), ranks[0]->Params()) << "replicas differ";
  EXPECT_LT(Worst(ranks[0]->Params(), OneProcess(all, 4)), 1e-5);
}

// Buckets all-reduced during the backward pass: the same step as one
// all-reduce after it, up to the order of float additions.
TEST_P(DataParallelStepTest, BucketsDuringTheBackwardPassGiveTheSameStep) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 24, .seed = 6});
  DataParallelStepOptions options;
  options.micro_batch = 4;
  options.bucket_bytes = 64;  // A bucket per layer.
  auto train = [](int r, Rank& rank) {
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(
          rank.step
              ->Step(rank.order.data(), 8 * r, 8 * (r + 1), 24, *rank.optimizer, rank.stats.data())
              .ok());
    }
  };
  auto bucketed = RunRanks(GetParam(), {all, all, all}, options, [&](int r, Rank& rank) {
    EXPECT_EQ(rank.step->buckets(), 3u);  // 12x4, 16x12 and 20x16 with their biases.
    train(r, rank);
  });
  options.bucket_bytes = 0;
  auto whole = RunRanks(GetParam(), {all, all, all}, options, train);
  for (auto& rank : bucketed) EXPECT_EQ(rank->Params(), bucketed[0]->Params());
  EXPECT_LT(Worst(bucketed[0]->Params(), whole[0]->Params()), 1e-6);
}

// Rank 1's features are NaN: every rank names it, and no rank steps.
TEST_P(DataParallelStepTest, ANonFiniteGradientIsNamedOnEveryRankAndNoRankSteps) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 12, .seed = 7});
  datasets::Dataset poisoned = all;
  std::fill(poisoned.features.begin(), poisoned.features.end(), std::nanf(""));
  DataParallelStepOptions options;
  options.micro_batch = 4;
  for (size_t bucket_bytes : {size_t{0}, size_t{64}}) {
    options.bucket_bytes = bucket_bytes;
    auto ranks = RunRanks(GetParam(), {all, poisoned, all}, options, [](int r, Rank& rank) {
      auto report = rank.step->Step(rank.order.data(), 4 * r, 4 * (r + 1), 12, *rank.optimizer,
                                    rank.stats.data());
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_EQ(report->non_finite_ranks, "1");
      EXPECT_FALSE(report->stepped);
    });
    for (auto& rank : ranks) EXPECT_EQ(rank->Params(), StartModel());
  }
}

// One rank's cancel flag stops every rank at the same step.
TEST_P(DataParallelStepTest, OneRanksCancelStopsEveryRank) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 12, .seed = 8});
  DataParallelStepOptions options;
  options.weighting = GradientWeighting::kSumThenDivide;
  options.micro_batch = 12;
  options.cancellable = true;
  const std::atomic<bool> cancel{true};
  auto ranks = RunRanks(GetParam(), {all, all}, options, [&](int r, Rank& rank) {
    auto report = rank.step->Step(rank.order.data(), 0, 12, 0, *rank.optimizer, rank.stats.data(),
                                  r == 1 ? &cancel : nullptr);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->cancelled);
    EXPECT_FALSE(report->stepped);
  });
  for (auto& rank : ranks) EXPECT_EQ(rank->Params(), StartModel());
}

INSTANTIATE_TEST_SUITE_P(Transports, DataParallelStepTest,
                         ::testing::Values(Kind::kInProcess, Kind::kShm), [](const auto& info) {
                           return info.param == Kind::kInProcess ? "InProcess" : "Shm";
                         });

TEST(BucketCutsTest, CutsWhereTheLayersSinceTheLastHoldABucketAndAtZero) {
  auto backend = std::move(NewBackend({.device = "cpu"})).value();
  auto model = std::move(BuildModel(Mlp(), backend.get())).value();
  // Layers of 336, 204 and 52 parameters; the backward pass reaches the
  // last first.
  const size_t np = model->num_params();
  ASSERT_EQ(np, 336u + 204u + 52u);
  EXPECT_EQ(BucketCuts(*model, 1), (std::vector<size_t>{336 + 204, 336, 0}));
  EXPECT_EQ(BucketCuts(*model, 256 * 4), (std::vector<size_t>{336, 0}));
  EXPECT_EQ(BucketCuts(*model, size_t{1} << 30), (std::vector<size_t>{0}));
}

TEST(DataParallelStepOptionsTest, TheDeviceSumWeighsBeforeTheSumOnly) {
  auto backend = std::move(NewBackend({.device = "cpu"})).value();
  auto model = std::move(BuildModel(Mlp(), backend.get())).value();
  net::InProcessHub hub(1);
  auto transport = hub.Connect(0);
  collective::Communicator comm(transport.get());
  auto data =
      std::move(DeviceDataset::Upload(backend.get(), datasets::MakeSynthetic({.num_samples = 4})))
          .value();
  DataParallelStepOptions options;
  options.sum = GradientSum::kDevice;
  options.weighting = GradientWeighting::kSumThenDivide;
  EXPECT_EQ(DataParallelStep::Create(model.get(), data.get(), &comm, options).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::train
