// `cohort plan`: a run's secure rounds planned without starting anything
// (coordinator/secagg_plan.h): what the coordinator prints at start-up, for
// the number of clients given.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "coordinator/secagg_plan.h"

namespace cohort::cli {
namespace {

struct PlanFlags {
  std::string config;
  int64_t clients = -1;  // -1: not given (the first round's).
};

Status RunPlan(const PlanFlags& f) {
  if (f.clients != -1 && (f.clients < 1 || f.clients > 10000000)) {
    return InvalidArgumentError("--clients " + std::to_string(f.clients) +
                                ": must be between 1 and 10000000");
  }
  StatusOr<config::RunConfig> loaded = LoadConfig(f.config, 0);
  if (!loaded.ok()) return loaded.status().WithContext("--config");
  const config::RunConfig& config = *loaded;
  const uint32_t clients =
      f.clients == -1 ? coordinator::FirstRoundClients(config) : static_cast<uint32_t>(f.clients);
  if (config.secagg().aggregation() != config::PLAIN) {
    COHORT_RETURN_IF_ERROR(
        coordinator::PlanSecureRound(config, clients).status().WithContext("--clients"));
  }
  for (const std::string& line : coordinator::DescribePlan(config, clients))
    std::printf("%s\n", line.c_str());
  if (auto warning = coordinator::NoDropoutWarning(config, clients))
    std::printf("warning: %s\n", warning->c_str());
  return OkStatus();
}

}  // namespace

Command AddPlanCommand(CLI::App& app, const std::string& log_level) {
  auto* plan = app.add_subcommand(
      "plan", "Print a run's secure-aggregation plan (n, k, t, dropouts survived) and exit");
  auto f = std::make_shared<PlanFlags>();
  plan->add_option("--config", f->config, "Run config (text proto)")->required();
  plan->add_option("--clients", f->clients,
                   "Clients available (default: the first round's, rounds.start_clients)");
  return {plan, [f, &log_level] {
            InitLogging("plan", "", log_level);
            return Report(RunPlan(*f), "plan");
          }};
}

}  // namespace cohort::cli
