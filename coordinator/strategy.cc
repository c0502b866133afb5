#include "coordinator/strategy.h"

#include <cmath>

#include "common/bytes.h"

namespace cohort::coordinator {

// Each strategy's factory, defined in its own file (strategy_<name>.cc).
using StrategyFactory = StatusOr<std::unique_ptr<Strategy>> (*)(const config::RunConfig&,
                                                                Evaluator);
StatusOr<std::unique_ptr<Strategy>> NewFedAvg(const config::RunConfig&, Evaluator);
StatusOr<std::unique_ptr<Strategy>> NewFedAvgM(const config::RunConfig&, Evaluator);
StatusOr<std::unique_ptr<Strategy>> NewFedAdam(const config::RunConfig&, Evaluator);
StatusOr<std::unique_ptr<Strategy>> NewFedYogi(const config::RunConfig&, Evaluator);
StatusOr<std::unique_ptr<Strategy>> NewFedAdagrad(const config::RunConfig&, Evaluator);

namespace {

struct Registration {
  bool (*wanted)(const config::RunConfig& config);
  StrategyFactory make;
};

// One line per strategy. The first whose `wanted` holds is made, so the more
// specific come first; the config format says which (server.optimizer,
// server.momentum).
constexpr Registration kStrategies[] = {
    {[](const config::RunConfig& c) { return c.server().optimizer() == config::FEDADAM; },
     NewFedAdam},
    {[](const config::RunConfig& c) { return c.server().optimizer() == config::FEDYOGI; },
     NewFedYogi},
    {[](const config::RunConfig& c) { return c.server().optimizer() == config::FEDADAGRAD; },
     NewFedAdagrad},
    {[](const config::RunConfig& c) { return c.server().momentum() != 0; }, NewFedAvgM},
    {[](const config::RunConfig&) { return true; }, NewFedAvg},
};

}  // namespace

StatusOr<std::optional<EvalMetrics>> StepAndEvaluate(Strategy& strategy,
                                                     std::span<const float> mean_delta,
                                                     std::span<float> model) {
  COHORT_RETURN_IF_ERROR(strategy.Aggregate(mean_delta, model));
  if (!AllFinite(model)) return FailedPreconditionError("the aggregated model is not finite");
  auto evaluated = strategy.Evaluate(model);
  if (!evaluated.ok()) {
    return FailedPreconditionError("evaluation failed: " + evaluated.status().message());
  }
  if (evaluated->has_value() &&
      (!std::isfinite((*evaluated)->loss) || !std::isfinite((*evaluated)->accuracy))) {
    return FailedPreconditionError("the new model's test loss is not finite");
  }
  return evaluated;
}

StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const config::RunConfig& config,
                                                 Evaluator evaluator) {
  for (const Registration& r : kStrategies) {
    if (r.wanted(config)) return r.make(config, std::move(evaluator));
  }
  return InvalidArgumentError("no strategy takes this config");
}

}  // namespace cohort::coordinator
