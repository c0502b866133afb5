// FedAvgM (Hsu et al. 2019): FedAvg with server momentum,
//   velocity = momentum * velocity + mean_delta;  model += lr * velocity.
// The velocity (the model's size; empty until the first step) is its state,
// saved in every checkpoint.
#include "aggregation/aggregator.h"
#include "common/bytes.h"
#include "coordinator/strategy_fedavg.h"

namespace cohort::coordinator {
namespace {

class FedAvgM : public FedAvg {
 public:
  using FedAvg::FedAvg;

  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override {
    staged_ = velocity_;
    aggregation::ApplyServerUpdate(
        {config().server().learning_rate(), config().server().momentum()}, mean_delta, model,
        staged_);
    if (!AllFinite(staged_)) return FailedPreconditionError("the aggregated model is not finite");
    return OkStatus();
  }
  void CommitAggregate() override { velocity_ = std::move(staged_); }

  Status LoadState(const store::Checkpoint& checkpoint) override {
    if (!checkpoint.velocity.empty() && checkpoint.velocity.size() != checkpoint.model.size()) {
      return DataLossError("checkpoint of round " + std::to_string(checkpoint.round) +
                           ": a server velocity of " + std::to_string(checkpoint.velocity.size()) +
                           " values for " + std::to_string(checkpoint.model.size()) +
                           " parameters");
    }
    velocity_ = checkpoint.velocity;
    return OkStatus();
  }
  void SaveState(store::Checkpoint& checkpoint) const override { checkpoint.velocity = velocity_; }

 private:
  std::vector<float> velocity_;
  std::vector<float> staged_;  // Aggregate's velocity, until committed.
};

}  // namespace

StatusOr<std::unique_ptr<Strategy>> NewFedAvgM(const config::RunConfig& config,
                                               Evaluator evaluator) {
  return std::unique_ptr<Strategy>(new FedAvgM(config, std::move(evaluator)));
}

}  // namespace cohort::coordinator
