#include "coordinator/secagg_plan.h"

#include <algorithm>

#include "aggregation/secagg_params.h"
#include "aggregation/secagg_stage.h"
#include "coordinator/strategy.h"
#include "spdlog/fmt/fmt.h"

namespace cohort::coordinator {
namespace {

bool Secure(const config::RunConfig& config) {
  return config.secagg().aggregation() != config::PLAIN;
}

StatusOr<aggregation::SecAggParams> ParamsFor(const config::RunConfig& config, uint32_t n) {
  const auto& sc = config.secagg();
  return aggregation::ChooseSecAggParams(n, sc.expected_dropout(), sc.corrupt_fraction(),
                                         sc.aggregation() == config::SECAGG, 1);
}

// The cohort the run's strategy selects from `available` clients.
StatusOr<uint32_t> CohortSize(const config::RunConfig& config, uint32_t available) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy, MakeStrategy(config, Evaluator()));
  CohortRequest request;
  request.round = 1;
  request.needed = MinRoundClients(config);
  request.min_clients = MinRoundClients(config);
  for (uint32_t i = 0; i < available; ++i) request.active.push_back(fmt::format("c{:07}", i));
  return static_cast<uint32_t>(strategy->SelectCohort(request).size());
}

}  // namespace

uint32_t MinRoundClients(const config::RunConfig& config) {
  const uint32_t floor = config.rounds().min_clients();
  if (!Secure(config)) return floor;
  // 2 when no client is assumed to collude with the coordinator, 3 at the
  // default corrupt fraction.
  uint32_t n = std::max<uint32_t>(2, floor);
  while (n < 64 && !ParamsFor(config, n).ok()) ++n;
  return n;
}

uint32_t FirstRoundClients(const config::RunConfig& config) {
  // FedBuff: every group is one aggregation of fedbuff.buffer_size.
  if (config.has_fedbuff()) return config.fedbuff().buffer_size();
  return std::max(config.rounds().start_clients(), MinRoundClients(config));
}

StatusOr<SecureRoundPlan> PlanSecureRound(const config::RunConfig& config, uint32_t available) {
  if (!Secure(config)) return InvalidArgumentError("the run aggregates in plain: no secure rounds");
  const uint32_t least = MinRoundClients(config);
  if (available < least) {
    return FailedPreconditionError(fmt::format(
        "{} clients available: a round needs at least {} (rounds.min_clients{})", available, least,
        least > config.rounds().min_clients() ? ", raised for secagg.corrupt_fraction" : ""));
  }
  SecureRoundPlan plan;
  plan.available = available;
  COHORT_ASSIGN_OR_RETURN(plan.n, CohortSize(config, available));
  COHORT_ASSIGN_OR_RETURN(aggregation::SecAggParams p, ParamsFor(config, plan.n));
  plan.k = p.k;
  plan.t = p.t;
  plan.complete = p.k + 1 == p.n;
  plan.survives = p.k - p.t;
  return plan;
}

std::vector<std::string> DescribePlan(const config::RunConfig& config, uint32_t available) {
  if (!Secure(config)) return {"plain aggregation: the coordinator sees each client's update"};
  auto plan = PlanSecureRound(config, available);
  if (!plan.ok()) return {std::string(plan.status().message())};
  std::string stages;
  for (aggregation::SecAggStage s : aggregation::kSecAggStages) {
    stages += fmt::format("{}{} {}", stages.empty() ? "" : ", ", aggregation::StageName(s),
                          plan->survives);
  }
  std::vector<std::string> lines = {
      fmt::format("secure round with {} clients available: cohort n={}, {} k={}, threshold t={}",
                  available, plan->n, plan->complete ? "complete graph" : "SecAgg+ graph", plan->k,
                  plan->t),
      fmt::format("  dropouts it survives at each stage: {} (each client needs t={} of its k={} "
                  "neighbours to stay to the end)",
                  stages, plan->t, plan->k)};
  if (!plan->complete) {
    lines.push_back(fmt::format(
        "  beyond that, clients leaving at random at secagg.expected_dropout={} abort a round "
        "with probability at most 2^-10",
        config.secagg().expected_dropout()));
  }
  return lines;
}

std::optional<std::string> NoDropoutWarning(const config::RunConfig& config, uint32_t available) {
  auto plan = PlanSecureRound(config, available);
  if (!plan.ok() || plan->survives > 0) return std::nullopt;
  // The smallest cohort that survives one dropout.
  std::string larger;
  for (uint32_t n = plan->n + 1; n <= plan->n + 64; ++n) {
    auto p = ParamsFor(config, n);
    if (p.ok() && p->k > p->t) {
      larger = fmt::format(" (n={} survives {})", n, p->k - p->t);
      break;
    }
  }
  // FedBuff: each group is one secure aggregation of fedbuff.buffer_size
  // (rounds.start_clients is refused there).
  return fmt::format(
      "a secure {} of n={} tolerates no dropout (t={} of k={}): one client leaving aborts it. "
      "Raise {}{}, or lower secagg.corrupt_fraction (now {})",
      config.has_fedbuff() ? "fedbuff group" : "round", plan->n, plan->t, plan->k,
      config.has_fedbuff() ? "fedbuff.buffer_size (and fedbuff.concurrency, a multiple of it)"
                           : "rounds.min_clients and rounds.start_clients",
      larger, config.secagg().corrupt_fraction());
}

}  // namespace cohort::coordinator
