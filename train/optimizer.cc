#include "train/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace cohort::train {
namespace {

bool Finite(float v) { return std::isfinite(v); }

std::string Num(float v) { return fmt::format("{}", v); }

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
  if (!Finite(o.proximal_mu) || o.proximal_mu < 0) {
    return InvalidArgumentError("optimizer: proximal_mu " + Num(o.proximal_mu) +
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
                                                       size_t num_params, Backend* backend) {
  COHORT_RETURN_IF_ERROR(CheckOptimizerOptions(options));
  std::unique_ptr<Optimizer> o(new Optimizer(options, num_params, backend));
  const bool sgd = options.kind == OptimizerKind::kSgd;
  if (!sgd || options.momentum != 0.0f) {
    COHORT_ASSIGN_OR_RETURN(o->first_, DeviceArray<float>::Create(backend, num_params));
    backend->Zero(o->first_.data(), o->first_.bytes());
  }
  if (!sgd) {
    COHORT_ASSIGN_OR_RETURN(o->second_, DeviceArray<float>::Create(backend, num_params));
    backend->Zero(o->second_.data(), o->second_.bytes());
  }
  if (options.proximal_mu != 0.0f) {
    COHORT_ASSIGN_OR_RETURN(o->anchor_, DeviceArray<float>::Create(backend, num_params));
  }
  return o;
}

Status Optimizer::SetProximalAnchor(std::span<const float> anchor) {
  if (anchor.size() != num_params_) {
    return InvalidArgumentError("optimizer: a proximal anchor of " + std::to_string(anchor.size()) +
                                " values, built for " + std::to_string(num_params_));
  }
  if (anchor_.size() == 0) return OkStatus();
  backend_->Upload(anchor_.data(), anchor.data(), anchor_.bytes());
  anchor_set_ = true;
  return OkStatus();
}

Optimizer::Optimizer(const OptimizerOptions& options, size_t num_params, Backend* backend)
    : options_(options), num_params_(num_params), backend_(backend) {}

StatusOr<std::vector<float>> Optimizer::SaveState() const {
  const size_t n = first_.size();
  const bool adam = options_.kind != OptimizerKind::kSgd;
  std::vector<float> out((adam ? 2 : 1) * n);
  if (n == 0) return out;
  backend_->Download(out.data(), first_.data(), first_.bytes());
  if (adam) backend_->Download(out.data() + n, second_.data(), second_.bytes());
  COHORT_RETURN_IF_ERROR(backend_->Sync());
  return out;
}

Status Optimizer::RestoreState(std::span<const float> state, uint64_t steps) {
  const size_t n = first_.size();
  const bool adam = options_.kind != OptimizerKind::kSgd;
  const size_t want = (adam ? 2 : 1) * n;
  if (state.size() != want) {
    return InvalidArgumentError("optimizer: a saved state of " + std::to_string(state.size()) +
                                " values, this optimizer keeps " + std::to_string(want));
  }
  if (n == 0) return OkStatus();
  backend_->Upload(first_.data(), state.data(), first_.bytes());
  if (adam) backend_->Upload(second_.data(), state.data() + n, second_.bytes());
  steps_ = adam ? steps : std::max<uint64_t>(steps, 1);
  return OkStatus();
}

Status Optimizer::Step(std::span<float> params, std::span<const float> grads) {
  if (params.size() != num_params_ || grads.size() != num_params_) {
    return InvalidArgumentError("optimizer: step over " + std::to_string(params.size()) +
                                " params and " + std::to_string(grads.size()) +
                                " gradients, built for " + std::to_string(num_params_));
  }
  const OptimizerOptions& o = options_;
  ProximalArgs proximal;
  if (anchor_.size() != 0) {
    if (!anchor_set_) {
      return FailedPreconditionError("optimizer: proximal_mu " + Num(o.proximal_mu) +
                                     " needs the round's starting model (SetProximalAnchor)");
    }
    proximal = {anchor_.data(), o.proximal_mu};
  }
  if (o.kind == OptimizerKind::kSgd) {
    SgdArgs a{o.learning_rate, o.weight_decay, o.momentum, o.dampening,
              o.nesterov,      steps_ == 0,    proximal};
    backend_->SgdUpdate(params.data(), grads.data(), first_.data(), num_params_, a);
  } else {
    const double t = static_cast<double>(steps_ + 1);
    AdamArgs a{o.learning_rate,
               o.weight_decay,
               o.beta1,
               o.beta2,
               o.eps,
               o.kind == OptimizerKind::kAdamW,
               static_cast<float>(o.learning_rate / (1.0 - std::pow(double{o.beta1}, t))),
               static_cast<float>(std::sqrt(1.0 - std::pow(double{o.beta2}, t))),
               proximal};
    backend_->AdamUpdate(params.data(), grads.data(), first_.data(), second_.data(), num_params_,
                         a);
  }
  ++steps_;
  return OkStatus();
}

}  // namespace cohort::train
