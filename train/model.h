// A sequential network (linear, conv2d, max_pool2d, relu, flatten) with a
// softmax cross-entropy head, run as a handful of backend ops over one flat
// parameter buffer. Presets (logreg, mlp, lenet5) are layer lists built by
// config::NetFromConfig; shapes come from PlanNet (common/net_shape.h).
#ifndef COHORT_TRAIN_MODEL_H_
#define COHORT_TRAIN_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/net_shape.h"
#include "common/status.h"
#include "train/backend.h"
#include "train/layout.h"
#include "train/optimizer.h"

namespace cohort::train {

// The model's parameters, gradient and activations live in backend memory;
// one instance per training thread.
class Model {
 public:
  // kInvalidArgument for a net PlanNet refuses; kResourceExhausted when the
  // backend cannot hold the parameters and gradient.
  static StatusOr<std::unique_ptr<Model>> Create(const NetSpec& spec, Backend* backend);

  const ParamLayout& layout() const { return layout_; }
  size_t num_params() const { return layout_.total(); }
  const NetSpec& spec() const { return spec_; }
  const NetPlan& plan() const { return plan_; }
  uint64_t input_features() const { return spec_.input.size(); }
  uint32_t num_classes() const { return spec_.num_classes; }
  Backend* backend() const { return backend_; }

  // PyTorch's default for nn.Linear and nn.Conv2d: weights and biases
  // ~ U(-1/sqrt(fan_in), +1/sqrt(fan_in)). Host memory.
  void Init(std::span<float> host_params, uint64_t seed) const;

  // The parameters and the last gradient, num_params() floats each in
  // backend memory.
  std::span<float> params() { return {params_.data(), params_.size()}; }
  std::span<const float> grads() const { return {grads_.data(), grads_.size()}; }
  // Copies between the host and params(); Get waits for queued steps.
  Status SetParams(std::span<const float> host);
  Status GetParams(std::span<float> host);

  // Allocates the activations for batches of up to `batch` samples once;
  // the calls below need batch <= that. kResourceExhausted on a full device.
  Status Reserve(int batch);

  // The calls below take backend memory: x holds `batch` samples as Gather
  // writes them (channel-last), y their labels; the batch's summed loss and
  // correct count are added to stats[0] and stats[1].
  void Evaluate(const float* x, const int32_t* y, int batch, double* stats);
  // Called during Backward each time a layer's gradient is written: from
  // then on grads()[offset, num_params()) is final (layers own ascending
  // ranges of the flat buffer, and the backward pass runs from the last).
  using GradientReady = std::function<void(size_t offset)>;
  // The offsets Backward passes to `ready`, in the order it does (each
  // parameter layer's first parameter, the last layer's first).
  std::vector<size_t> GradientReadyOffsets() const;
  // The gradient of the batch's mean loss into grads().
  void Backward(const float* x, const int32_t* y, int batch, double* stats,
                const GradientReady& ready = {});
  // Plain SGD (p -= lr * gradient), folded into the weight-gradient GEMMs:
  // no gradient buffer and no extra pass. Same result as Backward and an
  // SGD step, to float rounding.
  void SgdStep(const float* x, const int32_t* y, int batch, float learning_rate, double* stats);
  // SgdStep where the optimizer is plain SGD, else Backward and
  // optimizer.Step.
  void TrainStep(const float* x, const int32_t* y, int batch, Optimizer& optimizer, double* stats);
  // The logits of the last Evaluate: batch x num_classes, backend memory.
  const float* logits() const { return Output(layers_.size() - 1, nullptr); }

 private:
  struct Layer {
    LayerPlan plan;
    ConvGeom conv;
    PoolGeom pool;
    size_t weight = 0, bias = 0;  // Offsets into the parameters.
    DeviceArray<float> out;       // Empty for in-place layers.
    DeviceArray<float> saved;     // conv2d: what ConvBackward needs.
    DeviceArray<int32_t> argmax;  // max_pool2d.
  };

  Model(const NetSpec& spec, const NetPlan& plan, Backend* backend);
  float* Output(size_t i, const float* x) const;
  void Forward(const float* params, const float* x, int batch);
  void ForwardLayer(Layer& l, const float* params, const float* in, float* out, int batch);
  // Forward, loss and backward; writes out = beta * out + alpha * gradient
  // (out: the gradient buffer with alpha 1, beta 0; or the parameters
  // themselves with alpha -lr, beta 1).
  void Backprop(const float* x, const int32_t* y, int batch, float* out, float alpha, float beta,
                double* stats, const GradientReady& ready = {});
  // One layer's backward: d (its output's gradient) -> din (its input's, when
  // not null); parameter gradients into out as in Backprop. Returns the
  // buffer now holding the input's gradient.
  float* BackwardLayer(Layer& l, const float* in, float* d, float* din, int batch, float* out,
                       float alpha, float beta);

  NetSpec spec_;
  NetPlan plan_;
  Backend* backend_;
  ParamLayout layout_;
  std::vector<Layer> layers_;
  DeviceArray<float> params_, grads_;
  int capacity_ = 0;
  DeviceArray<float> delta_, spare_, conv_scratch_;
};

}  // namespace cohort::train

#endif  // COHORT_TRAIN_MODEL_H_
