// The local training loop and evaluation.
#ifndef COHORT_TRAIN_TRAINER_H_
#define COHORT_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <span>

#include "common/status.h"
#include "datasets/dataset.h"
#include "train/model.h"

namespace cohort::train {

struct TrainOptions {
  uint32_t epochs = 1;
  uint32_t batch_size = 32;
  OptimizerOptions optimizer;  // Fresh state for each call (each round).
  uint64_t seed = 0;           // Shuffling; the caller derives it from run, round, client.
};

struct TrainResult {
  double mean_loss = 0;  // Over every sample seen in every epoch.
  double accuracy = 0;   // Of the predictions made while training.
  uint64_t samples = 0;  // Samples seen (epochs x dataset size).
  double seconds = 0;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  uint64_t samples = 0;
};

// Runs `options.epochs` epochs of minibatch training over `data` in a fresh seeded
// order per epoch (last batch partial) and updates `params` in place.
// kInvalidArgument when the data does not fit the model or an optimizer
// option is out of range; kCancelled when
// `cancel` becomes true (checked between batches); params are then partial.
StatusOr<TrainResult> TrainLocal(Model& model, std::span<float> params,
                                 const datasets::Dataset& data, const TrainOptions& options,
                                 const std::atomic<bool>* cancel = nullptr);

// Mean loss and accuracy of `params` over `data`.
StatusOr<EvalResult> Evaluate(Model& model, std::span<const float> params,
                              const datasets::Dataset& data, uint32_t batch_size = 1000);

// Checks that `data` matches the model's input width and class count.
Status CheckCompatible(const Model& model, const datasets::Dataset& data);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_TRAINER_H_
