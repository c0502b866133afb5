// The coordinator's messages to clients, built in one place. Every header
// the round engine sends is made here (wire version set, fields filled), so
// a field or the wire version changes in this file only; the engine decides
// what to send and to whom, never how a message looks.
#ifndef COHORT_COORDINATOR_MESSAGES_H_
#define COHORT_COORDINATOR_MESSAGES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aggregation/secagg.h"
#include "common/env.h"
#include "proto/config.pb.h"
#include "proto/wire.pb.h"
#include "store/run_store.h"

namespace cohort::coordinator {

// A message to send. `payload` (may be empty) is the round's model snapshot,
// shared by every task of the round; it stays alive as long as any message
// holding it, so the transport can send it without copying.
struct Outgoing {
  std::string peer;
  wire::Header header;
  std::shared_ptr<const std::vector<float>> payload;
};

// A header of the wire version this build speaks, with no body yet.
wire::Header NewHeader();
// `header` addressed to `peer`.
Outgoing To(const std::string& peer, wire::Header header);

// The refusal of a bad or unexpected message; `round` is the round the
// coordinator is in (the one training, else the last committed).
Outgoing ErrorMessage(const std::string& peer, wire::ErrorCode code, std::string message,
                      uint32_t round);
// The refusal of a Hello (a name or key the run does not accept).
Outgoing RejectMessage(const std::string& peer, const std::string& reason);
// The answer to an accepted Hello: the run (its name and `run_nonce`,
// store::RunInfo::run_nonce), the model and the heartbeat.
Outgoing WelcomeMessage(const std::string& peer, const std::string& name,
                        const config::RunConfig& config, uint32_t num_params,
                        const std::string& run_nonce);
// A new run's nonce: 16 bytes from `env`'s RandomBytes, as 32 hex digits.
std::string NewRunNonce(Env& env);
// The nonce of a run about to be created over `existing` (the store's run,
// if any): a run that had committed no round yet and is replaced by
// another config keeps its nonce, since its clients may have noised its
// first round before the restart (client/dp_ledger.h); else a new one.
std::string KeptOrNewRunNonce(const std::optional<store::RunInfo>& existing, Env& env);
Outgoing HeartbeatAckMessage(const std::string& peer);
// The run is over after `rounds` committed rounds.
Outgoing FinishedMessage(const std::string& peer, uint32_t rounds);

// A client's task for `round`: `task` as the strategy configured it (seed,
// training settings), completed with the session (round, task id), the
// deadline and, in a secure round, the protocol's setup (`setup` non-null).
Outgoing TaskMessage(const std::string& peer, uint32_t round, uint64_t task_id,
                     wire::RoundTask task, float deadline_s, const aggregation::SecAggSetup* setup,
                     std::shared_ptr<const std::vector<float>> model);
// The key exchange's start, sent ahead of the task so it overlaps training.
Outgoing SecAggStartMessage(const std::string& peer, uint32_t round, uint64_t task_id,
                            const aggregation::SecAggSetup& setup);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_MESSAGES_H_
