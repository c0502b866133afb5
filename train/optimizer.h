// Optimizers over the flat parameter buffer: params and gradients share the
// model's layout, so a step is a few plain loops over one vector (llm.c's
// shape). The semantics are PyTorch's torch.optim.SGD, Adam and AdamW.
// Gradients come from Model::Backward (or, in data-parallel training, from
// an all-reduce of every worker's), never folded into the model.
#ifndef COHORT_TRAIN_OPTIMIZER_H_
#define COHORT_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "train/backend.h"

namespace cohort::train {

enum class OptimizerKind { kSgd, kAdam, kAdamW };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.05f;
  // Adam: L2 added to the gradient; AdamW: decoupled (p *= 1 - lr * wd).
  float weight_decay = 0.0f;
  // SGD.
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  // Adam and AdamW.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  // FedProx (any kind): the gradient gets + proximal_mu (p - anchor) before
  // the rule above, the anchor set by SetProximalAnchor. 0: no term.
  float proximal_mu = 0.0f;
};

// kInvalidArgument naming the option and its allowed range. Stricter than
// PyTorch, which also takes momentum >= 1 and eps = 0; like PyTorch,
// Nesterov only with momentum and no dampening.
Status CheckOptimizerOptions(const OptimizerOptions& options);

// Holds the optimizer state for one parameter vector (momentum buffer, or
// Adam's two moments and step count) in backend memory; the update runs on
// the backend. Not thread-safe.
class Optimizer {
 public:
  static StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerOptions& options,
                                                     size_t num_params, Backend* backend);

  // params -= update(grads), both in backend memory; grads are left as they
  // are. kInvalidArgument when a size differs from num_params;
  // kFailedPrecondition with proximal_mu > 0 and no anchor set.
  Status Step(std::span<float> params, std::span<const float> grads);

  // FedProx: the model the round started from (host memory, num_params
  // floats), which the proximal term pulls towards; copied. Needed before
  // the first Step when proximal_mu > 0, ignored otherwise.
  // kInvalidArgument on a size mismatch.
  Status SetProximalAnchor(std::span<const float> anchor);

  const OptimizerOptions& options() const { return options_; }
  uint64_t steps() const { return steps_; }

  // The state for a checkpoint, in host memory: SGD with momentum, the
  // momentum buffer (num_params floats); Adam and AdamW, exp_avg then
  // exp_avg_sq (2 x num_params); empty for a stateless optimizer. With
  // steps(), restoring it continues the run bit for bit.
  StatusOr<std::vector<float>> SaveState() const;
  // kInvalidArgument when `state` is not SaveState()'s size for this
  // optimizer; `steps` becomes steps() (SGD: at least 1, so the momentum
  // buffer counts as started).
  Status RestoreState(std::span<const float> state, uint64_t steps);
  // Plain SGD (no momentum, no weight decay, no proximal term) keeps no
  // state, so a model may fold its step into the weight-gradient GEMM
  // (Model::SgdStep).
  bool plain_sgd() const {
    return options_.kind == OptimizerKind::kSgd && options_.momentum == 0.0f &&
           options_.weight_decay == 0.0f && options_.proximal_mu == 0.0f;
  }

 private:
  Optimizer(const OptimizerOptions& options, size_t num_params, Backend* backend);

  OptimizerOptions options_;
  size_t num_params_;
  Backend* backend_;
  uint64_t steps_ = 0;
  DeviceArray<float> first_;   // SGD: momentum buffer; Adam: exp_avg.
  DeviceArray<float> second_;  // Adam: exp_avg_sq.
  DeviceArray<float> anchor_;  // FedProx: the round's starting model.
  bool anchor_set_ = false;
};

}  // namespace cohort::train

#endif  // COHORT_TRAIN_OPTIMIZER_H_
