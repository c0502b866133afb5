// A site's training, its ranks as threads meeting over shared memory: the
// site's step is the full mean gradient over every rank's samples, however
// unevenly the data is split, and a cancel stops every rank at one step.
#include "client/site.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <numeric>
#include <thread>

#include "datasets/dataset.h"
#include "datasets/synthetic.h"
#include "train/device.h"
#include "train/model_config.h"

namespace cohort::client {
namespace {

struct Rank {
  explicit Rank(const datasets::Dataset& d)
      : backend(std::move(train::NewBackend({.device = "cpu"})).value()),
        data(std::move(train::DeviceDataset::Upload(backend.get(), d)).value()) {}
  std::unique_ptr<train::Backend> backend;
  std::unique_ptr<train::DeviceDataset> data;
  std::unique_ptr<Site> site;
};

config::ModelConfig Mlp() {
  config::ModelConfig m;
  m.set_arch("mlp");
  m.set_input_dim(20);
  m.set_num_classes(4);
  m.add_hidden(16);
  return m;
}

// Rank 0 and rank 1 join (in threads: each waits for the other).
void JoinBoth(Rank& r0, Rank& r1, zmq::context_t& context, const std::string& tag) {
  const std::string master = "ipc:///tmp/cohort-site-test-" + std::to_string(getpid()) + "-" + tag;
  std::thread t([&] {
    r1.site = std::move(Site::Join(context, {.rank = 1, .size = 2, .master = master},
                                   r1.backend.get(), r1.data.get()))
                  .value();
  });
  r0.site = std::move(Site::Join(context, {.rank = 0, .size = 2, .master = master},
                                 r0.backend.get(), r0.data.get()))
                .value();
  t.join();
}

TEST(SiteTest, FullBatchStepsEqualOneClientHoldingAllTheSitesData) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 80, .seed = 3});
  std::vector<uint32_t> first(30), second(50);  // Uneven: the weights matter.
  std::iota(first.begin(), first.end(), 0);
  std::iota(second.begin(), second.end(), 30);
  Rank r0(datasets::Subset(all, first)), r1(datasets::Subset(all, second));
  zmq::context_t context(1);
  JoinBoth(r0, r1, context, "full");
  EXPECT_EQ(r0.site->total_samples(), 80u);
  EXPECT_EQ(r1.site->total_samples(), 80u);

  const config::ModelConfig config = Mlp();
  auto model = std::move(train::BuildModel(config, r0.backend.get())).value();
  std::vector<float> start(model->num_params());
  model->Init(start, 11);
  // A batch of the whole site: each step is one full-batch gradient step.
  train::TrainOptions options;
  options.epochs = 6;
  options.batch_size = 40;  // Per rank: 80 for the site.
  options.seed = 1;
  options.optimizer.learning_rate = 0.1f;
  options.optimizer.momentum = 0.9f;

  Status served;
  std::thread worker([&] { served = r1.site->Serve(); });
  std::vector<float> site_params = start;
  auto result = r0.site->Train(config, *model, site_params, options, nullptr);
  r0.site->Finish();
  worker.join();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(served.ok()) << served.ToString();
  EXPECT_EQ(result->samples, 80u * 6);
  EXPECT_EQ(result->steps, 6u);  // One site step an epoch (FedNova's tau).

  // One process with all 80 samples, the same full-batch steps.
  Rank alone(all);
  auto reference = std::move(train::BuildModel(config, alone.backend.get())).value();
  std::vector<float> alone_params = start;
  train::TrainOptions whole = options;
  whole.batch_size = 80;
  auto alone_result = train::TrainLocal(*reference, alone_params, *alone.data, whole);
  ASSERT_TRUE(alone_result.ok());
  EXPECT_EQ(alone_result->steps, 6u);
  double worst = 0, moved = 0;
  for (size_t i = 0; i < start.size(); ++i) {
    worst = std::max(worst, double(std::fabs(site_params[i] - alone_params[i])));
    moved = std::max(moved, double(std::fabs(site_params[i] - start[i])));
  }
  EXPECT_LT(worst, 1e-5) << "the site's step is not the union's mean gradient";
  EXPECT_GT(moved, 1e-2) << "nothing trained";
  EXPECT_NEAR(result->mean_loss, 0, 10);  // Finite and reported.
}

train::TrainOptions Options(uint32_t epochs) {
  train::TrainOptions o;
  o.epochs = epochs;
  o.batch_size = 8;
  return o;
}

TEST(SiteTest, ACancelStopsEveryRankAndTheWorkerServesTheNextTask) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 64, .seed = 4});
  std::vector<uint32_t> half(32), rest(32);
  std::iota(half.begin(), half.end(), 0);
  std::iota(rest.begin(), rest.end(), 32);
  Rank r0(datasets::Subset(all, half)), r1(datasets::Subset(all, rest));
  zmq::context_t context(1);
  JoinBoth(r0, r1, context, "cancel");
  const config::ModelConfig config = Mlp();
  auto model = std::move(train::BuildModel(config, r0.backend.get())).value();
  std::vector<float> params(model->num_params());
  model->Init(params, 2);
  Status served;
  std::thread worker([&] { served = r1.site->Serve(); });
  const std::atomic<bool> cancelled{true};
  auto first = r0.site->Train(config, *model, params, Options(3), &cancelled);
  EXPECT_EQ(first.status().code(), StatusCode::kCancelled);
  auto second = r0.site->Train(config, *model, params, Options(1), nullptr);
  EXPECT_TRUE(second.ok()) << second.status().ToString();
  r0.site->Finish();
  worker.join();
  EXPECT_TRUE(served.ok()) << served.ToString();
}

// A rank whose shard holds a NaN feature sends a NaN gradient at the first
// step: every rank names it and stops before the step, so the site's model
// (what rank 0 would send the coordinator) is still the global one.
TEST(SiteTest, ANonFiniteGradientIsNamedOnEveryRankBeforeTheStep) {
  const datasets::Dataset all = datasets::MakeSynthetic({.num_samples = 64, .seed = 5});
  std::vector<uint32_t> half(32), rest(32);
  std::iota(half.begin(), half.end(), 0);
  std::iota(rest.begin(), rest.end(), 32);
  datasets::Dataset poisoned = datasets::Subset(all, rest);
  std::fill(poisoned.features.begin(), poisoned.features.end(), std::nanf(""));
  Rank r0(datasets::Subset(all, half)), r1(poisoned);
  zmq::context_t context(1);
  JoinBoth(r0, r1, context, "nan");
  const config::ModelConfig config = Mlp();
  auto model = std::move(train::BuildModel(config, r0.backend.get())).value();
  std::vector<float> params(model->num_params());
  model->Init(params, 2);
  const std::vector<float> global = params;
  Status served;
  std::thread worker([&] { served = r1.site->Serve(); });
  auto result = r0.site->Train(config, *model, params, Options(2), nullptr);
  if (result.ok()) r0.site->Finish();  // The worker would wait for a task.
  worker.join();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDataLoss);
  for (const Status& s : {result.status(), served}) {
    EXPECT_NE(s.message().find("site: rank(s) 1 sent a gradient that is not finite (NaN or "
                               "infinity) at epoch 1, step 1 of "),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(params, global);
}

// A worker that claims an impossible sample count (a negative one, or more
// than the coordinator accepts from a client) is named by the site's rank 0
// when it joins, instead of a site weight the coordinator refuses forever.
// The worker here speaks the group protocol itself, as a modified one would.
TEST(SiteTest, AnImpossibleSampleCountIsNamedWhenTheSiteJoins) {
  const datasets::Dataset data = datasets::MakeSynthetic({.num_samples = 30, .seed = 6});
  int tag = 0;
  struct Claim {
    int64_t samples;
    std::string says;
  };
  for (const Claim& c : {Claim{-(int64_t{1} << 62),
                               "site: rank 1 claims -4611686018427387904 samples; a rank "
                               "holds 0 to 2^40"},
                         Claim{int64_t{1} << 50,
                               "site: rank 1 claims 1125899906842624 samples; a rank holds 0 to "
                               "2^40"},
                         // Each count possible, the site's more than a client may report.
                         Claim{int64_t{1} << 40,
                               "site: the ranks hold 1099511627806 samples together; a client "
                               "reports 1 to 2^40"}}) {
    const int64_t claim = c.samples;
    Rank r0(data);
    zmq::context_t context(1);
    const std::string master = "ipc:///tmp/cohort-site-test-" + std::to_string(getpid()) +
                               "-claim" + std::to_string(tag++);
    Status sent;
    std::thread liar([&] {
      auto transport = net::JoinGroup(context, {.rank = 1, .size = 2, .master = master}, {});
      if (!transport.ok()) {
        sent = transport.status();
        return;
      }
      collective::Communicator comm(transport->get());
      std::vector<int64_t> samples = {0, claim};
      collective::CollectiveOptions quick;
      quick.timeout_ms = 10000;
      sent = comm.AllReduce(samples, quick);
    });
    auto site = Site::Join(context, {.rank = 0, .size = 2, .master = master}, r0.backend.get(),
                           r0.data.get());
    liar.join();
    EXPECT_TRUE(sent.ok()) << sent;
    ASSERT_FALSE(site.ok());
    EXPECT_EQ(site.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(site.status().message().find(c.says), std::string::npos) << site.status();
  }
}

}  // namespace
}  // namespace cohort::client
