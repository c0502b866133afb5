#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/rng.h"

namespace cohort::train {

StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec, Backend* backend) {
  if (spec.arch != "mlp" && spec.arch != "logreg") {
    return InvalidArgumentError("model: unknown arch \"" + spec.arch + "\"");
  }
  if (spec.arch == "logreg" && !spec.hidden.empty()) {
    return InvalidArgumentError("model: logreg has no hidden layers");
  }
  if (spec.input_dim == 0 || spec.num_classes < 2) {
    return InvalidArgumentError("model: input_dim must be >= 1 and num_classes >= 2");
  }
  for (uint32_t h : spec.hidden) {
    if (h == 0) return InvalidArgumentError("model: a hidden layer has width 0");
  }
  return std::unique_ptr<Model>(new Model(spec, backend));
}

Model::Model(const ModelSpec& spec, Backend* backend) : spec_(spec), backend_(backend) {
  widths_.push_back(spec.input_dim);
  for (uint32_t h : spec.hidden) widths_.push_back(h);
  widths_.push_back(spec.num_classes);
  for (size_t l = 0; l + 1 < widths_.size(); ++l) {
    const std::string name = "fc" + std::to_string(l + 1);
    // PyTorch layout: weight is [out x in], row-major.
    layout_.Add(name + ".weight", widths_[l + 1], widths_[l]);
    layout_.Add(name + ".bias", widths_[l + 1], 1);
  }
  acts_.resize(widths_.size());
}

void Model::Init(std::span<float> params, uint64_t seed) const {
  Rng rng(DeriveSeed(seed, 0x1417));
  for (size_t l = 0; l + 1 < widths_.size(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(widths_[l]));
    for (size_t t : {2 * l, 2 * l + 1}) {
      for (float& v : layout_.View(params, t)) v = (2.0f * rng.UniformFloat() - 1.0f) * bound;
    }
  }
}

void Model::EnsureWorkspace(int batch) {
  if (batch <= capacity_) return;
  capacity_ = batch;
  for (size_t l = 1; l < widths_.size(); ++l) acts_[l].assign(size_t(batch) * widths_[l], 0.0f);
  uint32_t widest = *std::max_element(widths_.begin() + 1, widths_.end());
  delta_.assign(size_t(batch) * widest, 0.0f);
  delta_prev_.assign(size_t(batch) * widest, 0.0f);
}

void Model::Forward(std::span<const float> params, const float* x, int batch, float* logits) {
  EnsureWorkspace(batch);
  const float* in = x;
  const size_t layers = widths_.size() - 1;
  for (size_t l = 0; l < layers; ++l) {
    const int n_in = static_cast<int>(widths_[l]);
    const int n_out = static_cast<int>(widths_[l + 1]);
    float* out = (l + 1 == layers && logits != nullptr) ? logits : acts_[l + 1].data();
    const float* w = params.data() + layout_.tensors()[2 * l].offset;
    const float* b = params.data() + layout_.tensors()[2 * l + 1].offset;
    // Bias first, then accumulate X * W^T on top (beta = 1): one pass fewer.
    for (int i = 0; i < batch; ++i) std::memcpy(out + size_t(i) * n_out, b, n_out * sizeof(float));
    backend_->Gemm(false, true, batch, n_out, n_in, 1.0f, in, n_in, w, n_in, 1.0f, out, n_out);
    if (l + 1 < layers) {
      const size_t n = size_t(batch) * n_out;
      for (size_t i = 0; i < n; ++i) out[i] = out[i] > 0.0f ? out[i] : 0.0f;
    }
    in = out;
  }
  if (logits != nullptr && logits != acts_.back().data()) {
    // Keep a copy where the loss reads it.
    std::memcpy(acts_.back().data(), logits, size_t(batch) * widths_.back() * sizeof(float));
  }
}

BatchStats Model::SoftmaxCrossEntropy(const int32_t* y, int batch, float scale, bool want_grad) {
  BatchStats stats;
  const int c = static_cast<int>(widths_.back());
  float* logits = acts_.back().data();
  for (int i = 0; i < batch; ++i) {
    float* row = logits + size_t(i) * c;
    int argmax = 0;
    float max = row[0];
    for (int j = 1; j < c; ++j) {
      if (row[j] > max) {
        max = row[j];
        argmax = j;
      }
    }
    float sum = 0.0f;
    for (int j = 0; j < c; ++j) sum += std::exp(row[j] - max);
    const float log_sum = std::log(sum);
    stats.loss_sum += static_cast<double>(log_sum - (row[y[i]] - max));
    stats.correct += argmax == y[i] ? 1 : 0;
    if (want_grad) {
      float* d = delta_.data() + size_t(i) * c;
      for (int j = 0; j < c; ++j) d[j] = std::exp(row[j] - max - log_sum) * scale;
      d[y[i]] -= scale;
    }
  }
  return stats;
}

BatchStats Model::Evaluate(std::span<const float> params, const float* x, const int32_t* y,
                           int batch) {
  Forward(params, x, batch, nullptr);
  return SoftmaxCrossEntropy(y, batch, 1.0f, false);
}

BatchStats Model::Backprop(std::span<const float> params, const float* x, const int32_t* y,
                           int batch, float* out, float alpha, float beta) {
  Forward(params, x, batch, nullptr);
  BatchStats stats = SoftmaxCrossEntropy(y, batch, 1.0f / batch, true);
  for (size_t l = widths_.size() - 1; l-- > 0;) {
    const int n_in = static_cast<int>(widths_[l]);
    const int n_out = static_cast<int>(widths_[l + 1]);
    const float* in = l == 0 ? x : acts_[l].data();
    const TensorView& wt = layout_.tensors()[2 * l];
    const TensorView& bt = layout_.tensors()[2 * l + 1];
    // Input gradient first: when `out` is the parameters, it needs W before
    // the update.
    if (l > 0) {
      backend_->Gemm(false, false, batch, n_in, n_out, 1.0f, delta_.data(), n_out,
                     params.data() + wt.offset, n_in, 0.0f, delta_prev_.data(), n_in);
      const float* act = acts_[l].data();
      const size_t n = size_t(batch) * n_in;
      for (size_t i = 0; i < n; ++i) delta_prev_[i] = act[i] > 0.0f ? delta_prev_[i] : 0.0f;
    }
    backend_->Gemm(true, false, n_out, n_in, batch, alpha, delta_.data(), n_out, in, n_in, beta,
                   out + wt.offset, n_in);
    float* gb = out + bt.offset;
    if (beta == 0.0f) std::fill(gb, gb + n_out, 0.0f);
    for (int i = 0; i < batch; ++i) {
      const float* d = delta_.data() + size_t(i) * n_out;
      for (int j = 0; j < n_out; ++j) gb[j] += alpha * d[j];
    }
    if (l > 0) std::swap(delta_, delta_prev_);
  }
  return stats;
}

BatchStats Model::Backward(std::span<const float> params, const float* x, const int32_t* y,
                           int batch, std::span<float> grads) {
  COHORT_CHECK(grads.size() == params.size());
  return Backprop(params, x, y, batch, grads.data(), 1.0f, 0.0f);
}

BatchStats Model::SgdStep(std::span<float> params, const float* x, const int32_t* y, int batch,
                          float learning_rate) {
  return Backprop(params, x, y, batch, params.data(), -learning_rate, 1.0f);
}

BatchStats Model::TrainStep(std::span<float> params, const float* x, const int32_t* y, int batch,
                            Optimizer& optimizer) {
  if (optimizer.plain_sgd()) {
    return SgdStep(params, x, y, batch, optimizer.options().learning_rate);
  }
  if (grads_.size() != params.size()) grads_.assign(params.size(), 0.0f);
  BatchStats stats = Backward(params, x, y, batch, grads_);
  COHORT_CHECK(optimizer.Step(params, grads_).ok());
  return stats;
}

}  // namespace cohort::train
