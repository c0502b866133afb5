#include "client/site.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <numeric>

#include "common/rng.h"
#include "datasets/shard.h"
#include "proto/config_io.h"
#include "train/dp_step.h"
#include "train/model_config.h"

namespace cohort::client {
namespace {

// What rank 0 hands the workers before each task: these int64 words, sent
// as their bytes (Communicator::BroadcastBytesOf), then the serialized
// ModelConfig (BroadcastSized) and the global model.
enum Word : size_t {
  kKind,  // kTrain or kFinish.
  kEpochs,
  kBatchSize,
  kSeed,
  kOptimizerKind,
  kLearningRate,  // Floats travel as their bits.
  kWeightDecay,
  kMomentum,
  kDampening,
  kNesterov,
  kBeta1,
  kBeta2,
  kEps,
  kProximalMu,
  kNumParams,
  kHeaderWords
};
constexpr int64_t kTrain = 1, kFinish = 2;
constexpr size_t kMaxConfigBytes = 1 << 20;
// The most samples a client may report (the coordinator refuses a Hello
// with more, or with none): the bound on a rank's count and the site's.
constexpr int64_t kMaxSiteSamples = int64_t{1} << 40;

// Each rank's sample count, as summed from their own slots: kInvalidArgument
// naming the first rank whose count is out of [0, 2^40], or the site's
// total when it is out of [1, 2^40] (a client the coordinator would refuse).
StatusOr<uint64_t> SiteSamples(std::span<const int64_t> counts) {
  int64_t total = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] < 0 || counts[k] > kMaxSiteSamples) {
      return InvalidArgumentError("site: rank " + std::to_string(k) + " claims " +
                                  std::to_string(counts[k]) + " samples; a rank holds 0 to 2^40");
    }
    total += counts[k];  // At most 2^40 times the ranks: no overflow.
  }
  if (total < 1 || total > kMaxSiteSamples) {
    return InvalidArgumentError("site: the ranks hold " + std::to_string(total) +
                                " samples together; a client reports 1 to 2^40");
  }
  return static_cast<uint64_t>(total);
}

int64_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float Float(int64_t w) { return std::bit_cast<float>(static_cast<uint32_t>(w)); }

std::vector<int64_t> EncodeTask(const train::TrainOptions& o, size_t num_params) {
  std::vector<int64_t> h(kHeaderWords, 0);
  const train::OptimizerOptions& p = o.optimizer;
  h[kKind] = kTrain;
  h[kEpochs] = o.epochs;
  h[kBatchSize] = o.batch_size;
  h[kSeed] = static_cast<int64_t>(o.seed);
  h[kOptimizerKind] = static_cast<int64_t>(p.kind);
  h[kLearningRate] = Bits(p.learning_rate);
  h[kWeightDecay] = Bits(p.weight_decay);
  h[kMomentum] = Bits(p.momentum);
  h[kDampening] = Bits(p.dampening);
  h[kNesterov] = p.nesterov;
  h[kBeta1] = Bits(p.beta1);
  h[kBeta2] = Bits(p.beta2);
  h[kEps] = Bits(p.eps);
  h[kProximalMu] = Bits(p.proximal_mu);
  h[kNumParams] = static_cast<int64_t>(num_params);
  return h;
}

// Rank 0's words, checked as untrusted input.
StatusOr<train::TrainOptions> DecodeTask(std::span<const int64_t> h) {
  train::TrainOptions o;
  if (h[kEpochs] < 1 || h[kEpochs] > 1000 || h[kBatchSize] < 1 || h[kBatchSize] > (1 << 20)) {
    return InvalidArgumentError("site task: epochs " + std::to_string(h[kEpochs]) +
                                ", batch size " + std::to_string(h[kBatchSize]));
  }
  o.epochs = static_cast<uint32_t>(h[kEpochs]);
  o.batch_size = static_cast<uint32_t>(h[kBatchSize]);
  o.seed = static_cast<uint64_t>(h[kSeed]);
  train::OptimizerOptions& p = o.optimizer;
  if (h[kOptimizerKind] < 0 || h[kOptimizerKind] > 2) {
    return InvalidArgumentError("site task: optimizer " + std::to_string(h[kOptimizerKind]));
  }
  p.kind = static_cast<train::OptimizerKind>(h[kOptimizerKind]);
  p.learning_rate = Float(h[kLearningRate]);
  p.weight_decay = Float(h[kWeightDecay]);
  p.momentum = Float(h[kMomentum]);
  p.dampening = Float(h[kDampening]);
  p.nesterov = h[kNesterov] != 0;
  p.beta1 = Float(h[kBeta1]);
  p.beta2 = Float(h[kBeta2]);
  p.eps = Float(h[kEps]);
  p.proximal_mu = Float(h[kProximalMu]);
  COHORT_RETURN_IF_ERROR(train::CheckOptimizerOptions(p).WithContext("site task"));
  return o;
}

}  // namespace

StatusOr<std::unique_ptr<Site>> Site::Join(zmq::context_t& context, const net::GroupOptions& group,
                                           train::Backend* backend,
                                           const train::DeviceDataset* data, Env* env) {
  if (group.size < 1 || group.rank < 0 || group.rank >= group.size) {
    return InvalidArgumentError("site: rank " + std::to_string(group.rank) + " of " +
                                std::to_string(group.size));
  }
  std::unique_ptr<Site> s(new Site());
  s->rank_ = group.rank;
  s->size_ = group.size;
  s->backend_ = backend;
  s->data_ = data;
  s->env_ = env;
  s->step_.timeout_ms = 60000;
  // Between tasks a worker waits as long as a round may take; a dead rank 0
  // is still noticed at once over shared memory.
  s->idle_.timeout_ms = 24 * 3600 * 1000;
  COHORT_ASSIGN_OR_RETURN(s->transport_, net::JoinGroup(context, group, s->step_));
  s->comm_ = std::make_unique<collective::Communicator>(s->transport_.get());
  // Every rank's count in its own slot, so a bad one is named (and every
  // rank refuses it alike) rather than summed into a weight the coordinator
  // refuses, Hello after Hello.
  std::vector<int64_t> samples(s->size_, 0);
  samples[s->rank_] = static_cast<int64_t>(data->size());
  COHORT_RETURN_IF_ERROR(s->comm_->AllReduce(samples, s->step_));
  COHORT_ASSIGN_OR_RETURN(s->total_samples_, SiteSamples(samples));
  return s;
}

StatusOr<train::TrainResult> Site::Train(const config::ModelConfig& config, train::Model& model,
                                         std::span<float> params,
                                         const train::TrainOptions& options,
                                         const std::atomic<bool>* cancel) {
  if (rank_ != 0) return FailedPreconditionError("site: only rank 0 hands out tasks");
  const std::string serialized = config.SerializeAsString();
  std::vector<uint8_t> bytes(serialized.begin(), serialized.end());
  std::vector<int64_t> header = EncodeTask(options, params.size());
  COHORT_RETURN_IF_ERROR(
      comm_->BroadcastBytesOf(std::span(header), 0, step_).WithContext("site: handing out a task"));
  COHORT_RETURN_IF_ERROR(comm_->BroadcastSized(bytes, 0, kMaxConfigBytes, step_)
                             .WithContext("site: handing out a task"));
  COHORT_RETURN_IF_ERROR(comm_->Broadcast(params, 0, step_));
  return TrainEpochs(model, params, options, cancel);
}

void Site::Finish() {
  if (rank_ != 0) return;
  std::vector<int64_t> header(kHeaderWords, 0);
  header[kKind] = kFinish;
  collective::CollectiveOptions quick = step_;
  quick.timeout_ms = 2000;
  if (Status s = comm_->BroadcastBytesOf(std::span(header), 0, quick); !s.ok()) {
    spdlog::warn("site: could not tell the workers the run is over: {}", s.message());
  }
}

Status Site::Serve() {
  for (;;) {
    std::vector<int64_t> header(kHeaderWords, 0);
    COHORT_RETURN_IF_ERROR(comm_->BroadcastBytesOf(std::span(header), 0, idle_)
                               .WithContext("site: waiting for a task"));
    if (header[kKind] == kFinish) return OkStatus();
    if (header[kKind] != kTrain || header[kNumParams] < 1) {
      return InvalidArgumentError("site: rank 0 sent a task header that is not one (kind " +
                                  std::to_string(header[kKind]) + ", " +
                                  std::to_string(header[kNumParams]) + " parameters)");
    }
    std::vector<uint8_t> config;
    COHORT_RETURN_IF_ERROR(comm_->BroadcastSized(config, 0, kMaxConfigBytes, step_)
                               .WithContext("site: rank 0's model config"));
    COHORT_ASSIGN_OR_RETURN(train::TrainOptions options, DecodeTask(header));
    const std::string bytes(config.begin(), config.end());
    if (!model_ || bytes != model_config_) {
      config::RunConfig check;
      if (!check.mutable_model()->ParseFromString(bytes)) {
        return InvalidArgumentError("site: rank 0's model config does not parse");
      }
      COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(check).WithContext("site model"));
      COHORT_ASSIGN_OR_RETURN(model_, train::BuildModel(check.model(), backend_));
      COHORT_RETURN_IF_ERROR(
          train::CheckCompatible(*model_, data_->num_features(), data_->num_classes()));
      model_config_ = bytes;
    }
    if (model_->num_params() != static_cast<size_t>(header[kNumParams])) {
      return InvalidArgumentError("site: rank 0's model has " + std::to_string(header[kNumParams]) +
                                  " parameters, its config " +
                                  std::to_string(model_->num_params()));
    }
    std::vector<float> params(model_->num_params());
    COHORT_RETURN_IF_ERROR(comm_->Broadcast(params, 0, step_));
    StatusOr<train::TrainResult> r = TrainEpochs(*model_, params, options, nullptr);
    if (!r.ok() && r.status().code() != StatusCode::kCancelled) return r.status();
    spdlog::info("site rank {}: task done ({})", rank_, r.ok() ? "trained" : "cancelled by rank 0");
  }
}

// Every rank: `epochs` passes over its own shard in the same number of
// steps as the others; a step's gradient is the mean over the samples all
// ranks took, so the site trains like one client holding all of them with
// a batch W times the task's. Each rank's gradient is a sum before the
// all-reduce and the total is divided after it (GradientWeighting's
// kSumThenDivide): no rank knows the others' parts.
StatusOr<train::TrainResult> Site::TrainEpochs(train::Model& model, std::span<float> params,
                                               const train::TrainOptions& options,
                                               const std::atomic<bool>* cancel) {
  const double start = env_->MonotonicSeconds();
  train::Backend* b = backend_;
  const size_t n = data_->size(), np = model.num_params();
  // The task's batch size is per rank, as in data-parallel training: the
  // site's batch is size_ times larger, and an epoch as many times shorter.
  const size_t site_batch = size_t{std::max<uint32_t>(options.batch_size, 1)} * size_;
  const size_t steps = std::max<size_t>(1, (total_samples_ + site_batch - 1) / site_batch);
  const size_t most = (n + steps - 1) / steps;  // The largest part this rank takes.
  COHORT_ASSIGN_OR_RETURN(auto optimizer, train::Optimizer::Create(options.optimizer, np, b));
  // FedProx: every rank pulls towards the model rank 0 broadcast.
  COHORT_RETURN_IF_ERROR(optimizer->SetProximalAnchor(params));
  COHORT_ASSIGN_OR_RETURN(auto order_dev, train::DeviceArray<uint32_t>::Create(b, n));
  COHORT_ASSIGN_OR_RETURN(auto stats, train::DeviceArray<double>::Create(b, 2));
  train::DataParallelStepOptions step_options;
  step_options.weighting = train::GradientWeighting::kSumThenDivide;
  step_options.micro_batch = std::max<size_t>(most, 1);  // A rank's part in one batch.
  step_options.collective = step_;
  step_options.cancellable = true;
  COHORT_ASSIGN_OR_RETURN(
      auto step, train::DataParallelStep::Create(&model, data_, comm_.get(), step_options));
  COHORT_RETURN_IF_ERROR(model.SetParams(params));
  b->Zero(stats.data(), stats.bytes());
  std::vector<uint32_t> order(n);
  Rng rng(DeriveSeed(options.seed, 0x5173, static_cast<uint64_t>(rank_)));
  for (uint32_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    rng.Shuffle(std::span<uint32_t>(order));
    if (n > 0) b->Upload(order_dev.data(), order.data(), order_dev.bytes());
    for (size_t k = 0; k < steps; ++k) {
      const size_t lo = n * k / steps, hi = n * (k + 1) / steps;
      COHORT_ASSIGN_OR_RETURN(
          train::StepReport report,
          step->Step(order_dev.data(), lo, hi, 0, *optimizer, stats.data(), cancel));
      if (!report.non_finite_ranks.empty()) {
        return DataLossError("site: rank(s) " + report.non_finite_ranks +
                             " sent a gradient that is not finite (NaN or infinity) at epoch " +
                             std::to_string(epoch + 1) + ", step " + std::to_string(k + 1) +
                             " of " + std::to_string(steps) +
                             "; the task stops before the step (nothing of it is sent)");
      }
      if (report.cancelled) return CancelledError("training cancelled");
    }
  }
  COHORT_ASSIGN_OR_RETURN(train::TrainResult result,
                          Summarize(model, params, options, stats.data(), start));
  result.steps = uint64_t{steps} * options.epochs;
  return result;
}

StatusOr<train::TrainResult> Site::Summarize(train::Model& model, std::span<float> params,
                                             const train::TrainOptions& options, double* stats,
                                             double start) {
  COHORT_RETURN_IF_ERROR(model.GetParams(params));
  double local[2];
  backend_->Download(local, stats, sizeof(local));
  COHORT_RETURN_IF_ERROR(backend_->Sync());
  std::vector<float> totals = {float(local[0]), float(local[1])};
  COHORT_RETURN_IF_ERROR(comm_->AllReduce(totals, step_));
  train::TrainResult result;
  result.samples = total_samples_ * options.epochs;
  if (result.samples > 0) {
    result.mean_loss = totals[0] / double(result.samples);
    result.accuracy = totals[1] / double(result.samples);
  }
  result.seconds = env_->MonotonicSeconds() - start;
  return result;
}

Status RunSiteWorker(const SiteWorkerOptions& o) {
  if (o.group.rank < 1 || o.group.rank >= o.group.size) {
    return InvalidArgumentError(
        "site-worker: --rank must be in [1, --site-size): rank 0 is the "
        "site's cohort client");
  }
  COHORT_ASSIGN_OR_RETURN(datasets::Dataset data, datasets::ReadShard(o.data));
  std::string note;
  COHORT_ASSIGN_OR_RETURN(auto backend,
                          train::NewBackend({.device = o.device, .threads = o.threads}, &note));
  if (!note.empty()) spdlog::info("{}", note);
  COHORT_ASSIGN_OR_RETURN(auto device_data, train::DeviceDataset::Upload(backend.get(), data));
  net::GroupOptions group = o.group;
  crypto::Ed25519KeyPair identity;
  COHORT_RETURN_IF_ERROR(
      net::LoadGroupKeys(o.identity, o.allow, o.master_key, "site-worker", &identity, &group));
  zmq::context_t context(1);
  COHORT_ASSIGN_OR_RETURN(auto site, Site::Join(context, group, backend.get(), device_data.get()));
  spdlog::info("site rank {} of {}: {} samples of the site's {} ({}, {})", site->rank(),
               site->size(), data.size(), site->total_samples(), backend->Name(),
               net::Describe(group));
  return site->Serve();
}

}  // namespace cohort::client
