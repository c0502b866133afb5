#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/check.h"
#include "common/rng.h"

namespace cohort::train {

StatusOr<std::unique_ptr<Model>> Model::Create(const NetSpec& spec, Backend* backend) {
  COHORT_ASSIGN_OR_RETURN(NetPlan plan, PlanNet(spec));
  std::unique_ptr<Model> model(new Model(spec, plan, backend));
  COHORT_ASSIGN_OR_RETURN(model->params_, DeviceArray<float>::Create(backend, model->num_params()));
  COHORT_ASSIGN_OR_RETURN(model->grads_, DeviceArray<float>::Create(backend, model->num_params()));
  return model;
}

Model::Model(const NetSpec& spec, const NetPlan& plan, Backend* backend)
    : spec_(spec), plan_(plan), backend_(backend) {
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    Layer l;
    l.plan = plan.layers[i];
    const Shape& in = l.plan.in;
    const Shape& out = l.plan.out;
    const LayerSpec& s = l.plan.spec;
    if (s.kind == LayerKind::kConv2d) {
      l.conv = ConvGeom{int(in.c),      int(in.h),  int(in.w),  int(s.kernel), int(s.stride),
                        int(s.padding), int(out.h), int(out.w), int(out.c)};
    }
    if (s.kind == LayerKind::kMaxPool2d) {
      l.pool = PoolGeom{int(in.c),     int(in.h),  int(in.w), int(s.kernel),
                        int(s.stride), int(out.h), int(out.w)};
    }
    if (l.plan.weight_rows > 0) {
      // PyTorch's nn.Sequential names; weight [out x fan_in] row-major.
      const std::string name = std::to_string(i);
      l.weight = layout_.total();
      layout_.Add(name + ".weight", l.plan.weight_rows, l.plan.weight_cols);
      l.bias = layout_.total();
      layout_.Add(name + ".bias", l.plan.bias, 1);
    }
    layers_.push_back(std::move(l));
  }
}

void Model::Init(std::span<float> params, uint64_t seed) const {
  COHORT_CHECK(params.size() == num_params());
  Rng rng(DeriveSeed(seed, 0x1417));
  for (const Layer& l : layers_) {
    if (l.plan.weight_rows == 0) continue;
    const float bound = 1.0f / std::sqrt(static_cast<float>(l.plan.weight_cols));
    const size_t end = l.bias + l.plan.bias;
    for (size_t i = l.weight; i < end; ++i) params[i] = (2.0f * rng.UniformFloat() - 1.0f) * bound;
  }
}

Status Model::SetParams(std::span<const float> host) {
  if (host.size() != num_params()) {
    return InvalidArgumentError("model: " + std::to_string(host.size()) +
                                " parameters given, the model has " + std::to_string(num_params()));
  }
  backend_->Upload(params_.data(), host.data(), params_.bytes());
  return OkStatus();
}

Status Model::GetParams(std::span<float> host) {
  if (host.size() != num_params()) {
    return InvalidArgumentError("model: room for " + std::to_string(host.size()) +
                                " parameters, the model has " + std::to_string(num_params()));
  }
  backend_->Download(host.data(), params_.data(), params_.bytes());
  return backend_->Sync();
}

Status Model::Reserve(int batch) {
  if (batch <= capacity_) return OkStatus();
  const size_t b = static_cast<size_t>(batch);
  uint64_t widest = 0, widest_dcols = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    const uint64_t out = l.plan.out.size();
    widest = std::max(widest, out);
    const bool first_relu = i == 0 && l.plan.spec.kind == LayerKind::kRelu;
    if (!l.plan.in_place() || first_relu) {
      COHORT_ASSIGN_OR_RETURN(l.out, DeviceArray<float>::Create(backend_, b * out));
    }
    if (l.plan.spec.kind == LayerKind::kConv2d) {
      const uint64_t cols = l.conv.workspace();
      COHORT_ASSIGN_OR_RETURN(l.saved, DeviceArray<float>::Create(backend_, b * cols));
      if (i > 0) widest_dcols = std::max(widest_dcols, cols);
    }
    if (l.plan.spec.kind == LayerKind::kMaxPool2d) {
      COHORT_ASSIGN_OR_RETURN(l.argmax, DeviceArray<int32_t>::Create(backend_, b * out));
    }
  }
  COHORT_ASSIGN_OR_RETURN(delta_, DeviceArray<float>::Create(backend_, b * widest));
  COHORT_ASSIGN_OR_RETURN(spare_, DeviceArray<float>::Create(backend_, b * widest));
  COHORT_ASSIGN_OR_RETURN(conv_scratch_, DeviceArray<float>::Create(backend_, b * widest_dcols));
  capacity_ = batch;
  return OkStatus();
}

float* Model::Output(size_t i, const float* x) const {
  for (;; --i) {
    const Layer& l = layers_[i];
    if (l.out.data() != nullptr) return l.out.data();
    // An in-place layer: its input's buffer (a leading flatten reads x).
    if (i == 0) return const_cast<float*>(x);
  }
}

void Model::ForwardLayer(Layer& l, const float* params, const float* in, float* out, int batch) {
  const LayerPlan& p = l.plan;
  switch (p.spec.kind) {
    case LayerKind::kLinear: {
      const int n_in = int(p.in.c), n_out = int(p.out.c);
      // Bias first, then accumulate X * W^T on top (beta = 1): one pass fewer.
      backend_->BroadcastRows(params + l.bias, batch, n_out, out);
      backend_->Gemm(false, true, batch, n_out, n_in, 1.0f, in, n_in, params + l.weight, n_in, 1.0f,
                     out, n_out);
      break;
    }
    case LayerKind::kConv2d:
      backend_->ConvForward(in, params + l.weight, params + l.bias, l.conv, batch, l.saved.data(),
                            out);
      break;
    case LayerKind::kMaxPool2d:
      backend_->MaxPool(in, l.pool, batch, out, l.argmax.data());
      break;
    case LayerKind::kRelu:
      backend_->Relu(in, out, size_t(batch) * p.out.size());
      break;
    case LayerKind::kFlatten:
      break;
  }
}

void Model::Forward(const float* params, const float* x, int batch) {
  COHORT_CHECK(batch >= 1 && batch <= capacity_);
  const float* in = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    float* out = Output(i, x);
    ForwardLayer(layers_[i], params, in, out, batch);
    in = out;
  }
}

void Model::Evaluate(const float* x, const int32_t* y, int batch, double* stats) {
  Forward(params_.data(), x, batch);
  backend_->SoftmaxCrossEntropy(Output(layers_.size() - 1, x), y, batch, int(num_classes()), 0.0f,
                                nullptr, stats);
}

float* Model::BackwardLayer(Layer& l, const float* in, float* d, float* din, int batch, float* out,
                            float alpha, float beta) {
  const LayerPlan& p = l.plan;
  switch (p.spec.kind) {
    case LayerKind::kLinear: {
      const int n_in = int(p.in.c), n_out = int(p.out.c);
      const float* w = params_.data() + l.weight;
      // Input gradient first: when `out` is the parameters, it needs W
      // before the update.
      if (din != nullptr) {
        backend_->Gemm(false, false, batch, n_in, n_out, 1.0f, d, n_out, w, n_in, 0.0f, din, n_in);
      }
      backend_->Gemm(true, false, n_out, n_in, batch, alpha, d, n_out, in, n_in, beta,
                     out + l.weight, n_in);
      backend_->ColumnSums(d, batch, n_out, alpha, beta, out + l.bias);
      return din;
    }
    case LayerKind::kConv2d:
      backend_->ConvBackward(l.saved.data(), params_.data() + l.weight, d, l.conv, batch,
                             conv_scratch_.data(), din, out + l.weight, out + l.bias, alpha, beta);
      return din;
    case LayerKind::kMaxPool2d:
      if (din != nullptr) backend_->MaxPoolBackward(d, l.argmax.data(), l.pool, batch, din);
      return din;
    case LayerKind::kRelu:
      // Its output is its input's buffer (or its own, first in the net).
      backend_->ReluBackward(l.out.data() != nullptr ? l.out.data() : in, d,
                             size_t(batch) * p.out.size());
      return d;
    case LayerKind::kFlatten:
      return d;
  }
  return d;
}

void Model::Backprop(const float* x, const int32_t* y, int batch, float* out, float alpha,
                     float beta, double* stats, const GradientReady& ready) {
  Forward(params_.data(), x, batch);
  float* d = delta_.data();
  float* spare = spare_.data();
  backend_->SoftmaxCrossEntropy(Output(layers_.size() - 1, x), y, batch, int(num_classes()),
                                1.0f / batch, d, stats);
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* in = i == 0 ? x : Output(i - 1, x);
    // No gradient flows into the input.
    float* din = i == 0 ? nullptr : spare;
    float* now = BackwardLayer(layers_[i], in, d, din, batch, out, alpha, beta);
    if (ready && layers_[i].plan.weight_rows > 0) ready(layers_[i].weight);
    if (now == spare) std::swap(d, spare);
    if (now == nullptr) break;
  }
}

std::vector<size_t> Model::GradientReadyOffsets() const {
  std::vector<size_t> out;
  for (size_t i = layers_.size(); i-- > 0;) {
    if (layers_[i].plan.weight_rows > 0) out.push_back(layers_[i].weight);
  }
  return out;
}

void Model::Backward(const float* x, const int32_t* y, int batch, double* stats,
                     const GradientReady& ready) {
  Backprop(x, y, batch, grads_.data(), 1.0f, 0.0f, stats, ready);
}

void Model::SgdStep(const float* x, const int32_t* y, int batch, float learning_rate,
                    double* stats) {
  Backprop(x, y, batch, params_.data(), -learning_rate, 1.0f, stats);
}

void Model::TrainStep(const float* x, const int32_t* y, int batch, Optimizer& optimizer,
                      double* stats) {
  if (optimizer.plain_sgd()) {
    SgdStep(x, y, batch, optimizer.options().learning_rate, stats);
    return;
  }
  Backward(x, y, batch, stats);
  COHORT_CHECK(optimizer.Step(params(), grads()).ok());
}

}  // namespace cohort::train
