#include "coordinator/strategy_fedavg.h"

#include <algorithm>
#include <cmath>

#include "aggregation/aggregator.h"
#include "common/rng.h"

namespace cohort::coordinator {

FedAvg::FedAvg(const config::RunConfig& config, Evaluator evaluator)
    : config_(config), evaluator_(std::move(evaluator)) {}

std::vector<std::string> FedAvg::SelectCohort(const CohortRequest& request) const {
  std::vector<std::string> available;
  for (const std::string& name : request.active) {
    if (request.banned == nullptr || request.banned->count(name) == 0) available.push_back(name);
  }
  if (available.size() < request.needed) return {};
  // Seeded by (seed, round) over the sorted names: a replayed round with the
  // same clients available selects the same cohort.
  Rng rng(DeriveSeed(config_.seed(), request.round, 0x5e1ec7));
  rng.Shuffle(std::span<std::string>(available));
  const auto& rc = config_.rounds();
  size_t k = static_cast<size_t>(std::ceil(rc.fraction() * available.size()));
  k = std::max<size_t>(k, request.min_clients);
  if (rc.max_clients_per_round() != 0) k = std::min<size_t>(k, rc.max_clients_per_round());
  k = std::min(k, available.size());
  available.resize(k);
  std::sort(available.begin(), available.end());
  return available;
}

void FedAvg::ConfigureTask(uint32_t round, const std::string& client, wire::RoundTask& task) const {
  // Seeded per client and round: a task sent again trains the same way.
  task.set_train_seed(DeriveSeed(config_.seed(), round, Fnv1a64(client)));
  *task.mutable_train() = config_.train();
}

Status FedAvg::Aggregate(std::span<const float> mean_delta, std::span<float> model) {
  // Momentum 0: the optimizer's plain step, which never touches `unused`.
  std::vector<float> unused;
  aggregation::ApplyServerUpdate({config_.server().learning_rate(), 0.0f}, mean_delta, model,
                                 unused);
  return OkStatus();
}

StatusOr<std::optional<EvalMetrics>> FedAvg::Evaluate(std::span<const float> model) const {
  if (!evaluator_) return std::optional<EvalMetrics>();
  COHORT_ASSIGN_OR_RETURN(EvalMetrics metrics, evaluator_(model));
  return std::optional<EvalMetrics>(metrics);
}

Status FedAvg::LoadState(const store::Checkpoint& checkpoint) {
  if (!checkpoint.velocity.empty()) {
    return DataLossError("checkpoint of round " + std::to_string(checkpoint.round) +
                         ": a server velocity of " + std::to_string(checkpoint.velocity.size()) +
                         " values, but FedAvg (server.momentum 0) keeps no server state");
  }
  return OkStatus();
}

void FedAvg::SaveState(store::Checkpoint& checkpoint) const { checkpoint.velocity.clear(); }

StatusOr<std::unique_ptr<Strategy>> NewFedAvg(const config::RunConfig& config,
                                              Evaluator evaluator) {
  return std::unique_ptr<Strategy>(new FedAvg(config, std::move(evaluator)));
}

}  // namespace cohort::coordinator
