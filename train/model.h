// Models: a layout over the flat parameter buffer plus forward/backward on a
// batch. `logreg` is an MLP with no hidden layer.
#ifndef COHORT_TRAIN_MODEL_H_
#define COHORT_TRAIN_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "train/backend.h"
#include "train/layout.h"

namespace cohort::train {

struct ModelSpec {
  std::string arch = "mlp";  // "mlp" or "logreg"
  uint32_t input_dim = 784;
  uint32_t num_classes = 10;
  std::vector<uint32_t> hidden;  // mlp only.
};

// SGD hyper-parameters (PyTorch's semantics: g += wd * p; buf = m * buf + g;
// p -= lr * buf).
struct SgdOptions {
  float learning_rate = 0.05f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

struct BatchStats {
  double loss_sum = 0;  // Summed over the batch's samples.
  uint64_t correct = 0;
};

// Softmax cross-entropy MLP with ReLU. Holds its activation workspace, so one
// instance per thread; parameters live outside, in the flat buffer.
class Model {
 public:
  // kInvalidArgument for an unknown arch or zero sizes.
  static StatusOr<std::unique_ptr<Model>> Create(const ModelSpec& spec, Backend* backend);

  const ParamLayout& layout() const { return layout_; }
  size_t num_params() const { return layout_.total(); }
  const ModelSpec& spec() const { return spec_; }

  // PyTorch's nn.Linear default: weights and biases ~ U(-1/sqrt(fan_in), +).
  void Init(std::span<float> params, uint64_t seed) const;

  // Logits for `batch` rows of `x` go to `logits` (batch x num_classes).
  void Forward(std::span<const float> params, const float* x, int batch, float* logits);

  // Loss and accuracy of `batch` rows without updating anything.
  BatchStats Evaluate(std::span<const float> params, const float* x, const int32_t* y, int batch);

  // One SGD step on the batch (mean loss over the batch). `velocity` must have
  // num_params() floats when momentum > 0 and is ignored otherwise.
  BatchStats TrainStep(std::span<float> params, std::span<float> velocity, const float* x,
                       const int32_t* y, int batch, const SgdOptions& sgd, bool first_step);

 private:
  Model(const ModelSpec& spec, Backend* backend);
  void EnsureWorkspace(int batch);
  // Softmax cross-entropy on logits_ (in place -> dlogits scaled by `scale`).
  BatchStats SoftmaxCrossEntropy(const int32_t* y, int batch, float scale, bool want_grad);

  ModelSpec spec_;
  Backend* backend_;
  ParamLayout layout_;
  std::vector<uint32_t> widths_;  // input, hidden..., classes
  int capacity_ = 0;
  std::vector<std::vector<float>> acts_;  // acts_[l]: batch x widths_[l]
  std::vector<float> delta_, delta_prev_;
  std::vector<float> grads_;
};

}  // namespace cohort::train

#endif  // COHORT_TRAIN_MODEL_H_
