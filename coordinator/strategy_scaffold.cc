#include "coordinator/strategy_scaffold.h"

#include <cmath>

#include "aggregation/scaffold.h"

namespace cohort::coordinator {

StatusOr<std::unique_ptr<ScaffoldStrategy>> ScaffoldStrategy::Wrap(
    std::unique_ptr<Strategy> inner, const config::RunConfig& config) {
  if (!config.train().scaffold()) {
    return InvalidArgumentError("train.scaffold: the config does not ask for SCAFFOLD");
  }
  return std::unique_ptr<ScaffoldStrategy>(new ScaffoldStrategy(std::move(inner)));
}

Status ScaffoldStrategy::SetVariateSum(std::vector<double> sum, uint64_t population) {
  sum_.reset();
  if (population == 0) return InvalidArgumentError("SCAFFOLD: no clients to average over (N = 0)");
  for (double v : sum) {
    if (!std::isfinite(v)) {
      return InvalidArgumentError(
          "SCAFFOLD: the round's sum of control variate changes is not "
          "finite");
    }
  }
  sum_ = std::move(sum);
  population_ = population;
  return OkStatus();
}

Status ScaffoldStrategy::Aggregate(std::span<const float> mean_delta, std::span<float> model) {
  if (!sum_) return FailedPreconditionError("SCAFFOLD: Aggregate before SetVariateSum");
  const std::vector<double> sum = std::move(*sum_);
  sum_.reset();
  if (variate_.empty()) variate_.assign(model.size(), 0.0f);
  if (sum.size() != variate_.size()) {
    return FailedPreconditionError("SCAFFOLD: a variate sum of " + std::to_string(sum.size()) +
                                   " values for " + std::to_string(variate_.size()) +
                                   " parameters");
  }
  std::vector<float> next(variate_.size());
  COHORT_RETURN_IF_ERROR(aggregation::ScaffoldServerVariate(variate_, sum, population_, next));
  COHORT_RETURN_IF_ERROR(inner_->Aggregate(mean_delta, model));
  staged_ = std::move(next);
  return OkStatus();
}

void ScaffoldStrategy::CommitAggregate() {
  inner_->CommitAggregate();
  if (staged_) variate_ = std::move(*staged_);
  staged_.reset();
}

Status ScaffoldStrategy::LoadState(const store::Checkpoint& checkpoint) {
  const size_t n = checkpoint.model.size();
  if (checkpoint.velocity.size() < n) {
    return DataLossError("checkpoint of round " + std::to_string(checkpoint.round) +
                         ": a server velocity of " + std::to_string(checkpoint.velocity.size()) +
                         " values has no room for SCAFFOLD's control variate of " +
                         std::to_string(n));
  }
  store::Checkpoint inner = checkpoint;
  inner.velocity.resize(checkpoint.velocity.size() - n);
  COHORT_RETURN_IF_ERROR(inner_->LoadState(inner));
  variate_.assign(checkpoint.velocity.end() - static_cast<ptrdiff_t>(n), checkpoint.velocity.end());
  staged_.reset();
  return OkStatus();
}

void ScaffoldStrategy::SaveState(store::Checkpoint& checkpoint) const {
  inner_->SaveState(checkpoint);
  if (variate_.empty()) {
    checkpoint.velocity.insert(checkpoint.velocity.end(), checkpoint.model.size(), 0.0f);
  } else {
    checkpoint.velocity.insert(checkpoint.velocity.end(), variate_.begin(), variate_.end());
  }
}

}  // namespace cohort::coordinator
