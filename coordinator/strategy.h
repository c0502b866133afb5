// The strategy: what a federated algorithm decides in a round, in the shape
// of Flower's `Strategy` (configure_fit, aggregate_fit, evaluate). The round
// engine runs the protocol (registration, collection, secure aggregation,
// the commit) and asks the strategy which clients train, with which task
// config, and how the mean of their updates moves the global model.
//
// A strategy is one class in its own file (strategy_<name>.cc) and one line
// in MakeStrategy (strategy.cc): FedAvg, FedAvgM, and the adaptive server
// optimizers FedAdam, FedYogi and FedAdagrad (strategy_fedopt.cc).
#ifndef COHORT_COORDINATOR_STRATEGY_H_
#define COHORT_COORDINATOR_STRATEGY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/wire.pb.h"
#include "store/run_store.h"

namespace cohort::coordinator {

struct EvalMetrics {
  double loss = 0;
  double accuracy = 0;
};
// Evaluates a global model; empty function: no central evaluation.
using Evaluator = std::function<StatusOr<EvalMetrics>(std::span<const float> params)>;

// What the engine knows when a round may start.
struct CohortRequest {
  uint32_t round = 0;  // The round to select for: last committed + 1.
  // The fewest available clients the round starts with (rounds.start_clients
  // for the coordinator's first round), and the smallest cohort it may have
  // (rounds.min_clients, at least 3 with secure aggregation).
  uint32_t needed = 0;
  uint32_t min_clients = 0;
  std::vector<std::string> active;  // Registered and active clients, sorted by name.
  // Clients proven misbehaving (name -> why): never selected.
  const std::map<std::string, std::string>* banned = nullptr;
};

// One per run, owned by the engine. Not thread-safe; never touches the clock,
// a socket or the store (the engine hands it what it needs).
class Strategy {
 public:
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  // configure_fit, the cohort: the clients of the round, sorted by name;
  // empty when too few are available (the engine then waits). Deterministic
  // in the request, so a replayed round selects the same cohort.
  virtual std::vector<std::string> SelectCohort(const CohortRequest& request) const = 0;
  // configure_fit, the task: the training config and seed of `client`'s
  // task in `round`.
  virtual void ConfigureTask(uint32_t round, const std::string& client,
                             wire::RoundTask& task) const = 0;

  // aggregate_fit, the server step: `model` holds the global model and gets
  // the one `mean_delta` (the weighted mean of the round's updates, the
  // model's size) leads to. The strategy's own state moves only on
  // CommitAggregate(), which the engine calls once it keeps that model (an
  // aborted round leaves the state as it was); a later Aggregate discards a
  // step not committed. kFailedPrecondition when the state is not finite.
  virtual Status Aggregate(std::span<const float> mean_delta, std::span<float> model) = 0;
  virtual void CommitAggregate() = 0;

  // evaluate: the central evaluation of a global model; nullopt when the run
  // has none. An evaluator's error is returned as it is.
  virtual StatusOr<std::optional<EvalMetrics>> Evaluate(std::span<const float> model) const = 0;

  // The strategy's state travels in the checkpoint (store::Checkpoint::
  // velocity, optimizer_steps), so a resumed run steps as one never stopped.
  // LoadState: kDataLoss, naming the round, for a state of the wrong shape.
  virtual Status LoadState(const store::Checkpoint& checkpoint) = 0;
  virtual void SaveState(store::Checkpoint& checkpoint) const = 0;

 protected:
  Strategy() = default;
};

// A Strategy around another (DpStrategy, FedNovaStrategy, ScaffoldStrategy):
// every call goes to the wrapped strategy unless the decorator overrides it.
class StrategyDecorator : public Strategy {
 public:
  std::vector<std::string> SelectCohort(const CohortRequest& request) const override {
    return inner_->SelectCohort(request);
  }
  void ConfigureTask(uint32_t round, const std::string& client,
                     wire::RoundTask& task) const override {
    inner_->ConfigureTask(round, client, task);
  }
  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override {
    return inner_->Aggregate(mean_delta, model);
  }
  void CommitAggregate() override { inner_->CommitAggregate(); }
  StatusOr<std::optional<EvalMetrics>> Evaluate(std::span<const float> model) const override {
    return inner_->Evaluate(model);
  }
  Status LoadState(const store::Checkpoint& checkpoint) override {
    return inner_->LoadState(checkpoint);
  }
  void SaveState(store::Checkpoint& checkpoint) const override { inner_->SaveState(checkpoint); }

 protected:
  explicit StrategyDecorator(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}

  std::unique_ptr<Strategy> inner_;
};

// The server step both engines take: `strategy` steps `model` (a copy of
// the global model) by `mean_delta` and evaluates the result. The step's
// own error as it is; kFailedPrecondition, saying why, for a model or an
// evaluation that is not finite, or an evaluation that fails. The caller
// commits (CommitAggregate) only on success.
StatusOr<std::optional<EvalMetrics>> StepAndEvaluate(Strategy& strategy,
                                                     std::span<const float> mean_delta,
                                                     std::span<float> model);

// The strategy `config` asks for (server.optimizer FEDADAM, FEDYOGI or
// FEDADAGRAD; else server.momentum != 0: FedAvgM; else FedAvg), evaluating
// with `evaluator`. kInvalidArgument for a config no strategy takes.
StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const config::RunConfig& config,
                                                 Evaluator evaluator = {});

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_STRATEGY_H_
