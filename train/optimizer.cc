#include "train/optimizer.h"

#include <cmath>
#include <string>

namespace cohort::train {
namespace {

bool Finite(float v) { return std::isfinite(v); }

std::string Num(float v) { return std::to_string(v); }

}  // namespace

Status CheckOptimizerOptions(const OptimizerOptions& o) {
  if (!Finite(o.learning_rate) || o.learning_rate < 0) {
    return InvalidArgumentError("optimizer: learning_rate " + Num(o.learning_rate) +
                                " must be finite and >= 0");
  }
  if (!Finite(o.weight_decay) || o.weight_decay < 0) {
    return InvalidArgumentError("optimizer: weight_decay " + Num(o.weight_decay) +
                                " must be finite and >= 0");
  }
  if (o.kind == OptimizerKind::kSgd) {
    if (!Finite(o.momentum) || o.momentum < 0 || o.momentum >= 1) {
      return InvalidArgumentError("optimizer: momentum " + Num(o.momentum) + " must be in [0, 1)");
    }
    if (!Finite(o.dampening) || o.dampening < 0 || o.dampening > 1) {
      return InvalidArgumentError("optimizer: dampening " + Num(o.dampening) +
                                  " must be in [0, 1]");
    }
    if (o.nesterov && (o.momentum == 0 || o.dampening != 0)) {
      return InvalidArgumentError("optimizer: nesterov needs momentum > 0 and dampening 0");
    }
    return OkStatus();
  }
  if (!Finite(o.beta1) || o.beta1 < 0 || o.beta1 >= 1) {
    return InvalidArgumentError("optimizer: beta1 " + Num(o.beta1) + " must be in [0, 1)");
  }
  if (!Finite(o.beta2) || o.beta2 < 0 || o.beta2 >= 1) {
    return InvalidArgumentError("optimizer: beta2 " + Num(o.beta2) + " must be in [0, 1)");
  }
  if (!Finite(o.eps) || o.eps <= 0) {
    return InvalidArgumentError("optimizer: eps " + Num(o.eps) + " must be finite and > 0");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerOptions& options,
                                                       size_t num_params) {
  COHORT_RETURN_IF_ERROR(CheckOptimizerOptions(options));
  return std::unique_ptr<Optimizer>(new Optimizer(options, num_params));
}

Optimizer::Optimizer(const OptimizerOptions& options, size_t num_params)
    : options_(options), num_params_(num_params) {
  const bool sgd = options.kind == OptimizerKind::kSgd;
  if (!sgd || options.momentum != 0.0f) first_.assign(num_params, 0.0f);
  if (!sgd) second_.assign(num_params, 0.0f);
}

Status Optimizer::Step(std::span<float> params, std::span<const float> grads) {
  if (params.size() != num_params_ || grads.size() != num_params_) {
    return InvalidArgumentError("optimizer: step over " + std::to_string(params.size()) +
                                " params and " + std::to_string(grads.size()) +
                                " gradients, built for " + std::to_string(num_params_));
  }
  if (options_.kind == OptimizerKind::kSgd) {
    SgdStep(params, grads);
  } else {
    AdamStep(params, grads);
  }
  ++steps_;
  return OkStatus();
}

// torch.optim.SGD: g += wd p; b = g on the first step, else
// b = m b + (1 - dampening) g; g = g + m b (Nesterov) or b; p -= lr g.
void Optimizer::SgdStep(std::span<float> params, std::span<const float> grads) {
  const float lr = options_.learning_rate, wd = options_.weight_decay;
  const float m = options_.momentum, keep = 1.0f - options_.dampening;
  float* p = params.data();
  const float* g = grads.data();
  const size_t n = params.size();
  if (m == 0.0f) {
    for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float* b = first_.data();
  const bool first = steps_ == 0;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * p[i];
    b[i] = first ? gi : m * b[i] + keep * gi;
    p[i] -= lr * (options_.nesterov ? gi + m * b[i] : b[i]);
  }
}

// torch.optim.Adam / AdamW (amsgrad off, maximize off):
// Adam:  g += wd p.   AdamW: p *= 1 - lr wd.
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void Optimizer::AdamStep(std::span<float> params, std::span<const float> grads) {
  const float lr = options_.learning_rate, wd = options_.weight_decay;
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const bool decoupled = options_.kind == OptimizerKind::kAdamW;
  const double t = static_cast<double>(steps_ + 1);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(double{b1}, t)));
  const float root_correction = static_cast<float>(std::sqrt(1.0 - std::pow(double{b2}, t)));
  float* p = params.data();
  const float* g = grads.data();
  float* m = first_.data();
  float* v = second_.data();
  const size_t n = params.size();
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (decoupled) {
      p[i] *= 1.0f - lr * wd;
    } else {
      gi += wd * p[i];
    }
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / root_correction + eps);
  }
}

}  // namespace cohort::train
