// One synchronous data-parallel step: every rank's gradient over its own
// samples, weighted by its part of the global batch, summed across the ranks
// (collective/collective.h over the host, or the backend's own collectives),
// checked, and applied by every rank alike, so the replicas stay identical.
// `cohort worker` and `cohort launch` (worker/) and the ranks of a site
// (client/site.h) train with it; they differ only in how a rank's part is
// chosen (the caller's business) and in when the gradient is weighted
// (GradientWeighting, which changes the float rounding, so each keeps its
// own).
#ifndef COHORT_TRAIN_DP_STEP_H_
#define COHORT_TRAIN_DP_STEP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collective/bucket_reducer.h"
#include "collective/collective.h"
#include "common/env.h"
#include "common/status.h"
#include "train/backend.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace cohort::train {

// When a rank's gradient is weighted by its share of the global batch. Both
// give the mean gradient over the global batch; they round differently.
enum class GradientWeighting {
  // Before the sum: each micro-batch's mean gradient times k / count (k its
  // samples, count the global batch's, which every rank knows). The sum is
  // the mean. `cohort worker`, whose ranks split one global batch.
  kShareBeforeSum,
  // Before the sum, each micro-batch's mean gradient times k (a gradient
  // sum); the ranks' sample counts travel in the same all-reduce, and after
  // it the sum is multiplied by 1 / (their total). A step in which no rank
  // had a sample changes nothing. Sites, whose ranks draw from their own
  // shards and do not know each other's parts.
  kSumThenDivide,
};

// Where the ranks' gradients are summed.
enum class GradientSum {
  // The communicator, over host memory: where backend memory is host
  // memory (Backend::HostMemory, the CPU backend) the gradient is weighted
  // and all-reduced in place in backend memory, else through a host copy.
  kHost,
  // The backend on device buffers (Backend::AllReduceSum, NCCL), in a group
  // the caller has joined. kShareBeforeSum only; the gradient is not checked
  // for non-finite values (nothing crosses to the host).
  kDevice,
};

struct DataParallelStepOptions {
  GradientWeighting weighting = GradientWeighting::kShareBeforeSum;
  GradientSum sum = GradientSum::kHost;
  // The most samples one Backward takes; a rank's part is taken in
  // micro-batches of this size, their weighted gradients added up (gradient
  // accumulation). At least 1.
  size_t micro_batch = 1;
  // The gradients' all-reduce (kHost): exact mode, wire type, deadline (the
  // deadline is the device all-reduce's too).
  collective::CollectiveOptions collective;
  // kHost with more than one rank: above 0, the gradient travels in buckets
  // of about this many bytes (BucketCuts), each all-reduced on a thread of
  // its own as soon as the last micro-batch's backward pass has written it.
  // The all-reduces' float sums then differ from one all-reduce's.
  size_t bucket_bytes = 0;
  // Every rank's Step may pass a cancel flag; it travels with the gradient,
  // so every rank sees a cancel at the same step.
  bool cancellable = false;
  // With one rank, whose part is one micro-batch at every step (the caller
  // knows): Step is LocalStep (no sum; plain SGD folded into the backward
  // pass, Model::TrainStep), not a weighted gradient and a separate update.
  bool local_when_alone = false;
  // Not owned: its clock times the wait for the ranks' sum
  // (StepReport::comm_seconds). Null: not timed.
  Env* env = nullptr;
};

// What one Step did, the same on every rank.
struct StepReport {
  // Non-empty when a rank's gradient was not finite (NaN or infinity): those
  // ranks, "1, 3". No update was taken.
  std::string non_finite_ranks;
  bool cancelled = false;  // A rank's cancel flag was set; no update.
  bool stepped = false;    // The optimizer took the step.
  // Exact mode: gradient values that saturated in this rank's all-reduce.
  uint64_t saturated = 0;
  // Seconds this rank waited for the sum (the all-reduce, or the buckets
  // still in flight after the backward pass); 0 without options.env.
  double comm_seconds = 0;
};

// Where the gradient buckets end: a cut wherever the layers since the last
// cut hold at least `bucket_bytes`, and at 0 (offsets into the flat
// gradient, in the order the backward pass reaches them; the same on every
// rank).
std::vector<size_t> BucketCuts(const Model& model, size_t bucket_bytes);

// Every rank of `comm` says yes or no (`mine`: whose gradient was not
// finite, whose config differs, ...), and every rank gets the same list of
// those that said yes, "1, 3" ("" when none): an integer all-reduce.
StatusOr<std::string> FlaggedRanks(collective::Communicator& comm, bool mine,
                                   const collective::CollectiveOptions& options);

// One per training run (or task) and rank; not thread-safe. Every rank of
// the communicator's group creates one with the same options and calls Step
// in step with the others.
class DataParallelStep {
 public:
  // `model`, `data` and `comm` (not owned) outlive the step. Reserves the
  // model's activations for a micro-batch. kInvalidArgument for kDevice with
  // kSumThenDivide or a micro-batch of 0; kResourceExhausted from the
  // backend.
  static StatusOr<std::unique_ptr<DataParallelStep>> Create(Model* model, const DeviceDataset* data,
                                                            collective::Communicator* comm,
                                                            const DataParallelStepOptions& options);
  ~DataParallelStep();
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;

  // One step over this rank's samples order[lo, hi) (`order`: sample
  // indices into the data, in backend memory; lo == hi is a rank with no
  // part this step, which still takes part in the sum) of a global batch of
  // `count` samples (kShareBeforeSum). The batches' summed loss and correct
  // count are added to `stats` (backend memory, two doubles). `cancel`: see
  // `cancellable`. An error when a peer fails or is silent (naming it);
  // otherwise the report, the same on every rank.
  StatusOr<StepReport> Step(const uint32_t* order, size_t lo, size_t hi, size_t count,
                            Optimizer& optimizer, double* stats,
                            const std::atomic<bool>* cancel = nullptr);
  // This rank alone: order[lo, hi) (at most a micro-batch) as one batch,
  // Model::TrainStep (local SGD's step).
  Status LocalStep(const uint32_t* order, size_t lo, size_t hi, Optimizer& optimizer,
                   double* stats);

  // Gradient buckets all-reduced during the backward pass (0: one
  // all-reduce after it).
  size_t buckets() const { return reducer_ ? cuts_.size() : 0; }

 private:
  DataParallelStep(Model* model, const DeviceDataset* data, collective::Communicator* comm,
                   const DataParallelStepOptions& options);
  // Samples order[begin, begin + k) as the batch in x_ and y_.
  void Gather(const uint32_t* order, size_t begin, size_t k);
  // options_.env's clock, or 0 without one.
  double Now() const;
  // The weight of a micro-batch of k samples in a global batch of count.
  float Weight(size_t k, size_t count) const;
  // grads()[from, to) times `weight` into sum_: the first micro-batch sets,
  // later ones add.
  void AddWeighted(size_t from, size_t to, float weight, bool first);
  // This rank's weighted gradient into sum_[0, np), with the buckets handed
  // to the reducer as the last micro-batch's backward pass writes them;
  // whether it is finite.
  bool LocalGradient(const uint32_t* order, size_t lo, size_t hi, size_t count);
  // The host path's sum and checks; the device path's.
  StatusOr<StepReport> HostStep(const uint32_t* order, size_t lo, size_t hi, size_t count,
                                Optimizer& optimizer, const std::atomic<bool>* cancel);
  StatusOr<StepReport> DeviceStep(const uint32_t* order, size_t lo, size_t hi, size_t count,
                                  Optimizer& optimizer);

  Model* model_;
  Backend* backend_;
  const DeviceDataset* data_;
  collective::Communicator* comm_;
  DataParallelStepOptions options_;
  size_t np_ = 0;
  // After the gradient in sum_: [samples (kSumThenDivide)] [cancel
  // (cancellable)] [ranks whose gradient is not finite], summed with it.
  size_t samples_slot_ = 0, cancel_slot_ = 0, non_finite_slot_ = 0, length_ = 0;
  DeviceArray<float> x_, reduced_;
  DeviceArray<int32_t> y_;
  double* stats_ = nullptr;  // The running Step's.
  // kHost: where the sum is built: reduced_ itself where backend memory is
  // host memory, else host_ (then uploaded into reduced_); micro_ is the
  // host copy of a later micro-batch's gradient. kDevice sums in reduced_.
  float* sum_ = nullptr;
  std::vector<float> host_, micro_;
  std::vector<size_t> cuts_;
  std::optional<collective::BucketReducer> reducer_;
};

}  // namespace cohort::train

#endif  // COHORT_TRAIN_DP_STEP_H_
