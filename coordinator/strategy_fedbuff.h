// FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered
// Asynchronous Aggregation"), the server's step: a Strategy decorator, as
// FedNovaStrategy is one. A group of fedbuff.buffer_size clients trained
// from model version v; when its mean is folded in, the model is at
// version v + tau (tau: the groups applied since). The paper weighs such
// an update by s(tau) = 1 / sqrt(1 + tau) (its polynomial staleness
// function with exponent 1/2); this decorator hands s(tau) x the group's
// mean to the wrapped strategy's server step (FedAvg: x += lr s(tau) Δ;
// FedAvgM, FedAdam, ... likewise from the weighted Δ). Selection, tasks,
// evaluation and the server state are the wrapped strategy's. tau 0: the
// mean as it is, FedAvg's step.
#ifndef COHORT_COORDINATOR_STRATEGY_FEDBUFF_H_
#define COHORT_COORDINATOR_STRATEGY_FEDBUFF_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "coordinator/strategy.h"

namespace cohort::coordinator {

// s(tau) = 1 / sqrt(1 + tau), in double.
double FedBuffStalenessWeight(uint32_t staleness);

// Δ = s(tau) x `mean` into `out` (same size), each value computed in double
// and rounded to float once.
void ScaleByStaleness(std::span<const float> mean, uint32_t staleness, std::span<float> out);

class FedBuffStrategy final : public StrategyDecorator {
 public:
  // kInvalidArgument when `config` has no fedbuff section.
  static StatusOr<std::unique_ptr<FedBuffStrategy>> Wrap(std::unique_ptr<Strategy> inner,
                                                         const config::RunConfig& config);

  // The staleness of the group about to be folded in, before Aggregate;
  // Aggregate uses it once.
  void SetStaleness(uint32_t staleness) { staleness_ = staleness; }

  // Strategy. Aggregate: kFailedPrecondition without SetStaleness; else the
  // wrapped strategy's step from s(tau) x `mean_delta`.
  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override;

 private:
  explicit FedBuffStrategy(std::unique_ptr<Strategy> inner) : StrategyDecorator(std::move(inner)) {}

  std::optional<uint32_t> staleness_;  // The group's, until Aggregate.
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_STRATEGY_FEDBUFF_H_
