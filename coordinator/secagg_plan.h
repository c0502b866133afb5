// A run's secure rounds planned before they run: the cohort a round selects
// from the clients available, SecAgg+'s n, k and t for it, and how many
// clients may leave it at each stage before it must abort. The coordinator
// prints it at start-up, `cohort status` with a run's stored config, and
// `cohort plan` without starting anything.
#ifndef COHORT_COORDINATOR_SECAGG_PLAN_H_
#define COHORT_COORDINATOR_SECAGG_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::coordinator {

// The smallest cohort a round may have: rounds.min_clients, raised with
// secure aggregation to the smallest n that has a threshold for
// secagg.corrupt_fraction.
uint32_t MinRoundClients(const config::RunConfig& config);
// The first round after a (re)start waits for this many clients (fedbuff:
// each group has fedbuff.buffer_size).
uint32_t FirstRoundClients(const config::RunConfig& config);

struct SecureRoundPlan {
  uint32_t available = 0;  // Clients available to select from.
  uint32_t n = 0, k = 0, t = 0;
  bool complete = false;  // k = n - 1.
  // Clients that may leave at any one stage (and in all stages together)
  // whoever they are: each client needs t of its k neighbours to the end.
  uint32_t survives = 0;
};

// The round with `available` clients (kFailedPrecondition when fewer than
// the round needs, kInvalidArgument for a plain-aggregation config).
StatusOr<SecureRoundPlan> PlanSecureRound(const config::RunConfig& config, uint32_t available);

// What a person reads: the plan's lines, and a warning when a round
// tolerates no dropout that names the fields to change.
std::vector<std::string> DescribePlan(const config::RunConfig& config, uint32_t available);
std::optional<std::string> NoDropoutWarning(const config::RunConfig& config, uint32_t available);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_SECAGG_PLAN_H_
