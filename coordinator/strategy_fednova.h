// FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem
// in Heterogeneous Federated Optimization"), the server's half: a Strategy
// decorator, as DpStrategy is one. Each client k of a train.fednova run
// sends d_k = Δ_k / a_k, its delta divided by the normaliser of the local
// steps it took (aggregation/fednova.h), and a_k beside it: in the clear in
// a plain round, as one more slot of the masked vector in a secure one. The
// round engine's weighted mean of the d_k is Σ p_k d_k (p_k = n_k / Σ n);
// this decorator multiplies it by tau_eff = Σ p_k a_k, the paper's default
// "effective number of steps", and hands Δ = tau_eff Σ p_k d_k to the
// wrapped strategy's server step (FedAvg, FedAvgM, FedAdam, ...).
// Selection, tasks, evaluation and the server state are the wrapped
// strategy's. With every a_k equal, Δ is FedAvg's weighted mean.
#ifndef COHORT_COORDINATOR_STRATEGY_FEDNOVA_H_
#define COHORT_COORDINATOR_STRATEGY_FEDNOVA_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coordinator/strategy.h"

namespace cohort::coordinator {

class FedNovaStrategy final : public StrategyDecorator {
 public:
  // kInvalidArgument when `config` does not set train.fednova.
  static StatusOr<std::unique_ptr<FedNovaStrategy>> Wrap(std::unique_ptr<Strategy> inner,
                                                         const config::RunConfig& config);

  // The round's tau_eff, before Aggregate: finite and > 0, else
  // kInvalidArgument naming it (the engine then aborts the round). Aggregate
  // uses it once.
  Status SetTauEff(double tau_eff);

  // Strategy. Aggregate: kFailedPrecondition without SetTauEff; else the
  // wrapped strategy's step from tau_eff x `mean_delta` (each value in
  // double, rounded to float once).
  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override;

 private:
  explicit FedNovaStrategy(std::unique_ptr<Strategy> inner) : StrategyDecorator(std::move(inner)) {}

  std::optional<double> tau_eff_;  // The round's, until Aggregate.
};

// Δ = tau_eff x `mean` into `out` (same size), each value computed in
// double and rounded to float once.
void ScaleByTauEff(std::span<const float> mean, double tau_eff, std::span<float> out);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_STRATEGY_FEDNOVA_H_
