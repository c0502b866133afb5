#include "coordinator/strategy_fedbuff.h"

#include <cmath>
#include <vector>

namespace cohort::coordinator {

double FedBuffStalenessWeight(uint32_t staleness) {
  return 1.0 / std::sqrt(1.0 + static_cast<double>(staleness));
}

void ScaleByStaleness(std::span<const float> mean, uint32_t staleness, std::span<float> out) {
  const double s = FedBuffStalenessWeight(staleness);
  for (size_t i = 0; i < mean.size(); ++i) {
    out[i] = static_cast<float>(s * static_cast<double>(mean[i]));
  }
}

StatusOr<std::unique_ptr<FedBuffStrategy>> FedBuffStrategy::Wrap(std::unique_ptr<Strategy> inner,
                                                                 const config::RunConfig& config) {
  if (!config.has_fedbuff()) {
    return InvalidArgumentError("fedbuff: the config does not ask for buffered aggregation");
  }
  return std::unique_ptr<FedBuffStrategy>(new FedBuffStrategy(std::move(inner)));
}

Status FedBuffStrategy::Aggregate(std::span<const float> mean_delta, std::span<float> model) {
  if (!staleness_) return FailedPreconditionError("FedBuff: Aggregate before SetStaleness");
  std::vector<float> delta(mean_delta.size());
  ScaleByStaleness(mean_delta, *staleness_, delta);
  staleness_.reset();
  return inner_->Aggregate(delta, model);
}

}  // namespace cohort::coordinator
