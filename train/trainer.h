// The local training loop and evaluation.
#ifndef COHORT_TRAIN_TRAINER_H_
#define COHORT_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "datasets/dataset.h"
#include "train/model.h"

namespace cohort::train {

// A dataset uploaded to backend memory once (a client's shard, the
// coordinator's test set) and read by index every batch.
class DeviceDataset {
 public:
  static StatusOr<std::unique_ptr<DeviceDataset>> Upload(Backend* backend,
                                                         const datasets::Dataset& data);
  size_t size() const { return labels_.size(); }
  uint32_t num_features() const { return num_features_; }
  uint32_t num_classes() const { return num_classes_; }
  const float* features() const { return features_.data(); }
  const int32_t* labels() const { return labels_.data(); }

 private:
  uint32_t num_features_ = 0, num_classes_ = 0;
  DeviceArray<float> features_;
  DeviceArray<int32_t> labels_;
};

// Called after each batch with the epoch (from 0), the samples done in it
// and the epoch's total (train_progress.h draws it for a person).
using ProgressFn = std::function<void(uint32_t epoch, uint64_t done, uint64_t total)>;

// Every field but `progress` travels to an MPI hosting rank in
// sim/mpi_executors.cc (PutOptions/GetOptions): a new one goes there too.
struct TrainOptions {
  uint32_t epochs = 1;
  uint32_t batch_size = 32;
  // Fresh state for each call (each round); a proximal term (FedProx)
  // pulls towards the params the call starts from.
  OptimizerOptions optimizer{};
  uint64_t seed = 0;  // Shuffling; the caller derives it from run, round, client.
  // SCAFFOLD (train.scaffold, aggregation/scaffold.h): c - c_i, the
  // server's control variate less the client's, one value per parameter.
  // After each optimizer step the parameters move by -learning_rate times
  // it (NIID-Bench's order: outside the optimizer's momentum and weight
  // decay). Empty: no correction.
  std::vector<float> scaffold_correction{};
  ProgressFn progress{};  // Empty: none. Never changes what is computed.
};

struct TrainResult {
  double mean_loss = 0;  // Over every sample seen in every epoch.
  double accuracy = 0;   // Of the predictions made while training.
  uint64_t samples = 0;  // Samples seen (epochs x dataset size).
  uint64_t steps = 0;    // Optimizer steps taken (FedNova's tau).
  double seconds = 0;    // On the caller's Env clock (virtual in the simulator).
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  uint64_t samples = 0;
};

// Runs `options.epochs` epochs of minibatch training over `data` in a fresh
// seeded order per epoch (last batch partial) and updates `params` (host
// memory: uploaded at the start, downloaded at the end) in place.
// kInvalidArgument when the data does not fit the model or an optimizer
// option is out of range; kResourceExhausted when the backend runs out of
// memory; kCancelled when `cancel` becomes true (checked between batches),
// and params are then as they were. The result's seconds are read from
// `env`'s monotonic clock (the simulator passes a virtual one).
StatusOr<TrainResult> TrainLocal(Model& model, std::span<float> params, const DeviceDataset& data,
                                 const TrainOptions& options,
                                 const std::atomic<bool>* cancel = nullptr,
                                 Env* env = Env::Default());

// Mean loss and accuracy of `params` (host memory) over `data`.
StatusOr<EvalResult> Evaluate(Model& model, std::span<const float> params,
                              const DeviceDataset& data, uint32_t batch_size = 1000);

// Checks that data with `num_features` features per sample and
// `num_classes` classes fits the model.
Status CheckCompatible(const Model& model, uint64_t num_features, uint32_t num_classes);
inline Status CheckCompatible(const Model& model, const datasets::Dataset& data) {
  return CheckCompatible(model, data.num_features, data.num_classes);
}

}  // namespace cohort::train

#endif  // COHORT_TRAIN_TRAINER_H_
