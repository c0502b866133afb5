// FedAvg (McMahan et al. 2017): a seeded cohort of rounds.fraction of the
// available clients, each training with the run's train config, and the
// global model moved by server.learning_rate times the weighted mean delta.
// It keeps no state. Strategies that change only the server step (FedAvgM)
// derive from it, as they do in Flower.
#ifndef COHORT_COORDINATOR_STRATEGY_FEDAVG_H_
#define COHORT_COORDINATOR_STRATEGY_FEDAVG_H_

#include "coordinator/strategy.h"

namespace cohort::coordinator {

class FedAvg : public Strategy {
 public:
  FedAvg(const config::RunConfig& config, Evaluator evaluator);

  std::vector<std::string> SelectCohort(const CohortRequest& request) const override;
  void ConfigureTask(uint32_t round, const std::string& client,
                     wire::RoundTask& task) const override;
  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override;
  void CommitAggregate() override {}
  StatusOr<std::optional<EvalMetrics>> Evaluate(std::span<const float> model) const override;
  // A checkpoint with server state is not FedAvg's: kDataLoss.
  Status LoadState(const store::Checkpoint& checkpoint) override;
  void SaveState(store::Checkpoint& checkpoint) const override;

 protected:
  const config::RunConfig& config() const { return config_; }

 private:
  config::RunConfig config_;
  Evaluator evaluator_;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_STRATEGY_FEDAVG_H_
