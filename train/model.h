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
#include "train/optimizer.h"

namespace cohort::train {

struct ModelSpec {
  std::string arch = "mlp";  // "mlp" or "logreg"
  uint32_t input_dim = 784;
  uint32_t num_classes = 10;
  std::vector<uint32_t> hidden;  // mlp only.
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

  // The gradient of the batch's mean loss, in the parameter layout, into
  // `grads` (num_params() floats, overwritten).
  BatchStats Backward(std::span<const float> params, const float* x, const int32_t* y, int batch,
                      std::span<float> grads);

  // Plain SGD (p -= lr * gradient), folded into the weight-gradient GEMMs:
  // no gradient buffer and no extra pass. Same result as Backward and an
  // SGD step, to float rounding.
  BatchStats SgdStep(std::span<float> params, const float* x, const int32_t* y, int batch,
                     float learning_rate);

  // One optimizer step on the batch: SgdStep where the optimizer is plain
  // SGD, else Backward into the model's gradient buffer and optimizer.Step.
  BatchStats TrainStep(std::span<float> params, const float* x, const int32_t* y, int batch,
                       Optimizer& optimizer);

 private:
  Model(const ModelSpec& spec, Backend* backend);
  void EnsureWorkspace(int batch);
  // Forward, loss and backward; writes out = beta * out + alpha * gradient
  // (out: the gradient buffer with alpha 1, beta 0; or the parameters
  // themselves with alpha -lr, beta 1).
  BatchStats Backprop(std::span<const float> params, const float* x, const int32_t* y, int batch,
                      float* out, float alpha, float beta);
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
