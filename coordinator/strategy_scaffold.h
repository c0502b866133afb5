// SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II), the server's
// half: a Strategy decorator, as FedNovaStrategy is one. It holds the
// server's control variate c (one value per parameter, zeros at the start),
// which the engine sends with every task after the model. Each client i of
// a train.scaffold round sends [y_i - x | Δc_i] (aggregation/scaffold.h);
// the engine averages the first half by sample count as ever and sums the
// second unweighted (in the clear, or inside the masked vector), then hands
// the sum here (SetVariateSum) before the server step:
//   x: the wrapped strategy's step on the weighted mean of y_i - x
//      (FedAvg with server.learning_rate 1: NIID-Bench's weighted average
//      of the local models);
//   c <- c + (1 / N) Σ_{i in S} Δc_i, N the clients registered with the
//      coordinator when the round started, never fewer than an earlier
//      round's (the engine stores it with the round, for a resume); the
//      paper's |S| / N times the mean; NIID-Bench's n_parties.
// c moves only on CommitAggregate, and travels in every checkpoint after
// the wrapped strategy's velocity (store::Checkpoint::velocity), so a
// resumed run goes on with the same c, bit for bit.
#ifndef COHORT_COORDINATOR_STRATEGY_SCAFFOLD_H_
#define COHORT_COORDINATOR_STRATEGY_SCAFFOLD_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coordinator/strategy.h"

namespace cohort::coordinator {

class ScaffoldStrategy final : public StrategyDecorator {
 public:
  // kInvalidArgument when `config` does not set train.scaffold.
  static StatusOr<std::unique_ptr<ScaffoldStrategy>> Wrap(std::unique_ptr<Strategy> inner,
                                                          const config::RunConfig& config);

  // c, the server's control variate (empty until LoadState, SaveState or
  // Aggregate learns the model's size; zeros then).
  std::span<const float> variate() const { return variate_; }
  // The round's Σ Δc_i over the accepted clients, and N, before Aggregate
  // (used once). kInvalidArgument when N is 0 or a value is not finite.
  Status SetVariateSum(std::vector<double> sum, uint64_t population);

  // Strategy. Aggregate: kFailedPrecondition without SetVariateSum or when
  // its size is not the model's; else the wrapped strategy's step, and the
  // next c staged for CommitAggregate.
  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override;
  void CommitAggregate() override;
  // c is the last model-sized block of checkpoint.velocity; kDataLoss,
  // naming the round, when the velocity is shorter than the model.
  Status LoadState(const store::Checkpoint& checkpoint) override;
  void SaveState(store::Checkpoint& checkpoint) const override;

 private:
  explicit ScaffoldStrategy(std::unique_ptr<Strategy> inner)
      : StrategyDecorator(std::move(inner)) {}

  std::vector<float> variate_;                // c.
  std::optional<std::vector<double>> sum_;    // The round's Σ Δc_i, until Aggregate.
  uint64_t population_ = 0;                   // Its N.
  std::optional<std::vector<float>> staged_;  // Aggregate's c, until committed.
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_STRATEGY_SCAFFOLD_H_
