#include "coordinator/strategy_fednova.h"

#include <cmath>
#include <sstream>

namespace cohort::coordinator {

void ScaleByTauEff(std::span<const float> mean, double tau_eff, std::span<float> out) {
  for (size_t i = 0; i < mean.size(); ++i) {
    out[i] = static_cast<float>(tau_eff * static_cast<double>(mean[i]));
  }
}

StatusOr<std::unique_ptr<FedNovaStrategy>> FedNovaStrategy::Wrap(std::unique_ptr<Strategy> inner,
                                                                 const config::RunConfig& config) {
  if (!config.train().fednova()) {
    return InvalidArgumentError("train.fednova: the config does not ask for FedNova");
  }
  return std::unique_ptr<FedNovaStrategy>(new FedNovaStrategy(std::move(inner)));
}

Status FedNovaStrategy::SetTauEff(double tau_eff) {
  if (!std::isfinite(tau_eff) || tau_eff <= 0) {
    std::ostringstream why;
    why << "FedNova: tau_eff " << tau_eff << " is not a finite value > 0";
    tau_eff_.reset();
    return InvalidArgumentError(why.str());
  }
  tau_eff_ = tau_eff;
  return OkStatus();
}

Status FedNovaStrategy::Aggregate(std::span<const float> mean_delta, std::span<float> model) {
  if (!tau_eff_) return FailedPreconditionError("FedNova: Aggregate before SetTauEff");
  std::vector<float> delta(mean_delta.size());
  ScaleByTauEff(mean_delta, *tau_eff_, delta);
  tau_eff_.reset();
  return inner_->Aggregate(delta, model);
}

}  // namespace cohort::coordinator
