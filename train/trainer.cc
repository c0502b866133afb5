#include "train/trainer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"

namespace cohort::train {

Status CheckCompatible(const Model& model, const datasets::Dataset& data) {
  if (data.num_features != model.spec().input_dim) {
    return InvalidArgumentError("data has " + std::to_string(data.num_features) +
                                " features per sample, the model expects " +
                                std::to_string(model.spec().input_dim));
  }
  if (data.num_classes > model.spec().num_classes) {
    return InvalidArgumentError("data has " + std::to_string(data.num_classes) +
                                " classes, the model has " +
                                std::to_string(model.spec().num_classes));
  }
  return OkStatus();
}

StatusOr<TrainResult> TrainLocal(Model& model, std::span<float> params,
                                 const datasets::Dataset& data, const TrainOptions& options,
                                 const std::atomic<bool>* cancel) {
  COHORT_RETURN_IF_ERROR(CheckCompatible(model, data));
  if (params.size() != model.num_params()) {
    return InvalidArgumentError("params have " + std::to_string(params.size()) +
                                " values, the model has " + std::to_string(model.num_params()));
  }
  if (options.batch_size == 0) return InvalidArgumentError("batch_size must be >= 1");
  const double start = WallSeconds();
  const size_t n = data.size();
  const size_t nf = data.num_features;
  const size_t bs = options.batch_size;
  std::vector<uint32_t> order(n);
  std::vector<float> xb(bs * nf);
  std::vector<int32_t> yb(bs);
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                          Optimizer::Create(options.optimizer, params.size()));
  Rng rng(options.seed);
  TrainResult result;
  double loss_sum = 0;
  uint64_t correct = 0;
  for (uint32_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    rng.Shuffle(std::span<uint32_t>(order));
    for (size_t begin = 0; begin < n; begin += bs) {
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        return CancelledError("training cancelled");
      }
      const size_t count = std::min(bs, n - begin);
      // Gather the batch: contiguous rows keep the GEMMs on their fast path.
      for (size_t i = 0; i < count; ++i) {
        const uint32_t idx = order[begin + i];
        std::memcpy(xb.data() + i * nf, data.features.data() + size_t(idx) * nf,
                    nf * sizeof(float));
        yb[i] = data.labels[idx];
      }
      BatchStats stats =
          model.TrainStep(params, xb.data(), yb.data(), static_cast<int>(count), *optimizer);
      loss_sum += stats.loss_sum;
      correct += stats.correct;
      result.samples += count;
    }
  }
  if (result.samples > 0) {
    result.mean_loss = loss_sum / result.samples;
    result.accuracy = static_cast<double>(correct) / result.samples;
  }
  result.seconds = WallSeconds() - start;
  return result;
}

StatusOr<EvalResult> Evaluate(Model& model, std::span<const float> params,
                              const datasets::Dataset& data, uint32_t batch_size) {
  COHORT_RETURN_IF_ERROR(CheckCompatible(model, data));
  if (params.size() != model.num_params()) {
    return InvalidArgumentError("params have " + std::to_string(params.size()) +
                                " values, the model has " + std::to_string(model.num_params()));
  }
  EvalResult result;
  double loss_sum = 0;
  uint64_t correct = 0;
  const size_t nf = data.num_features;
  for (size_t begin = 0; begin < data.size(); begin += batch_size) {
    const size_t count = std::min<size_t>(batch_size, data.size() - begin);
    // Rows are already contiguous: no gather needed.
    BatchStats stats = model.Evaluate(params, data.features.data() + begin * nf,
                                      data.labels.data() + begin, static_cast<int>(count));
    loss_sum += stats.loss_sum;
    correct += stats.correct;
  }
  result.samples = data.size();
  if (result.samples > 0) {
    result.loss = loss_sum / result.samples;
    result.accuracy = static_cast<double>(correct) / result.samples;
  }
  return result;
}

}  // namespace cohort::train
