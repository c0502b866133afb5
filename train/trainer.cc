#include "train/trainer.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/rng.h"

namespace cohort::train {

StatusOr<std::unique_ptr<DeviceDataset>> DeviceDataset::Upload(Backend* backend,
                                                               const datasets::Dataset& data) {
  auto d = std::make_unique<DeviceDataset>();
  d->num_features_ = data.num_features;
  d->num_classes_ = data.num_classes;
  COHORT_ASSIGN_OR_RETURN(d->features_, DeviceArray<float>::Create(backend, data.features.size()));
  COHORT_ASSIGN_OR_RETURN(d->labels_, DeviceArray<int32_t>::Create(backend, data.labels.size()));
  backend->Upload(d->features_.data(), data.features.data(), d->features_.bytes());
  backend->Upload(d->labels_.data(), data.labels.data(), d->labels_.bytes());
  return d;
}

Status CheckCompatible(const Model& model, uint64_t num_features, uint32_t num_classes) {
  if (num_features != model.input_features()) {
    const Shape& s = model.spec().input;
    return InvalidArgumentError("data has " + std::to_string(num_features) +
                                " features per sample, the model's input_shape " +
                                std::to_string(s.c) + "x" + std::to_string(s.h) + "x" +
                                std::to_string(s.w) + " takes " +
                                std::to_string(model.input_features()));
  }
  if (num_classes > model.num_classes()) {
    return InvalidArgumentError("data has " + std::to_string(num_classes) +
                                " classes, the model has " + std::to_string(model.num_classes()));
  }
  return OkStatus();
}

namespace {

Status CheckParams(const Model& model, size_t n) {
  if (n == model.num_params()) return OkStatus();
  return InvalidArgumentError("params have " + std::to_string(n) + " values, the model has " +
                              std::to_string(model.num_params()));
}

// The batch buffers of one training or evaluation call, in backend memory.
struct BatchBuffers {
  DeviceArray<uint32_t> order;
  DeviceArray<float> x;
  DeviceArray<int32_t> y;
  DeviceArray<double> stats;  // Summed loss, correct count.

  static StatusOr<BatchBuffers> Create(Model& model, size_t n, size_t batch) {
    Backend* b = model.backend();
    BatchBuffers bufs;
    COHORT_RETURN_IF_ERROR(model.Reserve(static_cast<int>(batch)));
    COHORT_ASSIGN_OR_RETURN(bufs.order, DeviceArray<uint32_t>::Create(b, n));
    COHORT_ASSIGN_OR_RETURN(bufs.x, DeviceArray<float>::Create(b, batch * model.input_features()));
    COHORT_ASSIGN_OR_RETURN(bufs.y, DeviceArray<int32_t>::Create(b, batch));
    COHORT_ASSIGN_OR_RETURN(bufs.stats, DeviceArray<double>::Create(b, 2));
    b->Zero(bufs.stats.data(), bufs.stats.bytes());
    return bufs;
  }
  // Gathers samples order[begin, begin + count) into x and y.
  void Gather(Model& model, const DeviceDataset& data, size_t begin, size_t count) {
    const Shape& s = model.spec().input;
    model.backend()->Gather(data.features(), data.labels(), order.data() + begin,
                            static_cast<int>(count), int(s.c), int(s.h), int(s.w), x.data(),
                            y.data());
  }
  StatusOr<std::pair<double, double>> ReadStats(Backend* b) {
    double host[2];
    b->Download(host, stats.data(), sizeof(host));
    COHORT_RETURN_IF_ERROR(b->Sync());
    return std::make_pair(host[0], host[1]);
  }
};

// SCAFFOLD's c - c_i in backend memory (empty: none).
StatusOr<DeviceArray<float>> UploadCorrection(Backend* backend, std::span<const float> correction,
                                              size_t num_params) {
  if (correction.empty()) return DeviceArray<float>();
  if (correction.size() != num_params) {
    return InvalidArgumentError("train.scaffold: a correction of " +
                                std::to_string(correction.size()) + " values for " +
                                std::to_string(num_params) + " parameters");
  }
  COHORT_ASSIGN_OR_RETURN(DeviceArray<float> d, DeviceArray<float>::Create(backend, num_params));
  backend->Upload(d.data(), correction.data(), d.bytes());
  return d;
}

}  // namespace

StatusOr<TrainResult> TrainLocal(Model& model, std::span<float> params, const DeviceDataset& data,
                                 const TrainOptions& options, const std::atomic<bool>* cancel,
                                 Env* env) {
  COHORT_RETURN_IF_ERROR(CheckCompatible(model, data.num_features(), data.num_classes()));
  COHORT_RETURN_IF_ERROR(CheckParams(model, params.size()));
  if (options.batch_size == 0) return InvalidArgumentError("batch_size must be >= 1");
  const double start = env->MonotonicSeconds();
  const size_t n = data.size();
  const size_t bs = std::min<size_t>(options.batch_size, std::max<size_t>(n, 1));
  Backend* backend = model.backend();
  COHORT_ASSIGN_OR_RETURN(BatchBuffers bufs, BatchBuffers::Create(model, n, bs));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                          Optimizer::Create(options.optimizer, params.size(), backend));
  // FedProx pulls towards the model this call starts from (the round's).
  COHORT_RETURN_IF_ERROR(optimizer->SetProximalAnchor(params));
  COHORT_RETURN_IF_ERROR(model.SetParams(params));
  COHORT_ASSIGN_OR_RETURN(DeviceArray<float> correction,
                          UploadCorrection(backend, options.scaffold_correction, params.size()));
  const float corrected_lr = -options.optimizer.learning_rate;
  std::vector<uint32_t> order(n);
  Rng rng(options.seed);
  TrainResult result;
  for (uint32_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    rng.Shuffle(std::span<uint32_t>(order));
    backend->Upload(bufs.order.data(), order.data(), bufs.order.bytes());
    for (size_t begin = 0; begin < n; begin += bs) {
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        return CancelledError("training cancelled");
      }
      const size_t count = std::min(bs, n - begin);
      bufs.Gather(model, data, begin, count);
      model.TrainStep(bufs.x.data(), bufs.y.data(), static_cast<int>(count), *optimizer,
                      bufs.stats.data());
      if (correction.size() > 0) {
        backend->Axpy(corrected_lr, correction.data(), model.params().data(), params.size());
      }
      result.samples += count;
      ++result.steps;
      if (options.progress) options.progress(epoch, begin + count, n);
    }
  }
  COHORT_RETURN_IF_ERROR(model.GetParams(params));
  COHORT_ASSIGN_OR_RETURN(auto stats, bufs.ReadStats(backend));
  if (result.samples > 0) {
    result.mean_loss = stats.first / result.samples;
    result.accuracy = stats.second / result.samples;
  }
  result.seconds = env->MonotonicSeconds() - start;
  return result;
}

StatusOr<EvalResult> Evaluate(Model& model, std::span<const float> params,
                              const DeviceDataset& data, uint32_t batch_size) {
  COHORT_RETURN_IF_ERROR(CheckCompatible(model, data.num_features(), data.num_classes()));
  COHORT_RETURN_IF_ERROR(CheckParams(model, params.size()));
  if (batch_size == 0) return InvalidArgumentError("batch_size must be >= 1");
  const size_t n = data.size();
  const size_t bs = std::min<size_t>(batch_size, std::max<size_t>(n, 1));
  Backend* backend = model.backend();
  COHORT_ASSIGN_OR_RETURN(BatchBuffers bufs, BatchBuffers::Create(model, n, bs));
  COHORT_RETURN_IF_ERROR(model.SetParams(params));
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  backend->Upload(bufs.order.data(), order.data(), bufs.order.bytes());
  for (size_t begin = 0; begin < n; begin += bs) {
    const size_t count = std::min(bs, n - begin);
    bufs.Gather(model, data, begin, count);
    model.Evaluate(bufs.x.data(), bufs.y.data(), static_cast<int>(count), bufs.stats.data());
  }
  COHORT_ASSIGN_OR_RETURN(auto stats, bufs.ReadStats(backend));
  EvalResult result;
  result.samples = n;
  if (n > 0) {
    result.loss = stats.first / n;
    result.accuracy = stats.second / n;
  }
  return result;
}

}  // namespace cohort::train
