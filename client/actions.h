// What the client's session (session.h) asks its driver to do: messages to
// send, training to start or cancel, an exit, lines to print. Plain values;
// the daemon carries them out, tests read them.
#ifndef COHORT_CLIENT_ACTIONS_H_
#define COHORT_CLIENT_ACTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "net/envelope.h"
#include "proto/wire.pb.h"
#include "train/trainer.h"

namespace cohort::client {

struct Outbound {
  wire::Header header;
  std::vector<float> payload;   // Empty: none.
  std::vector<uint32_t> words;  // A masked update's payload instead (secure aggregation).
};

// `out` as the coordinator decodes it from the wire (a masked update's
// words as the payload's bits): how an in-process engine receives it.
net::Envelope AsEnvelope(Outbound&& out);

struct TrainTask {
  uint32_t round = 0;
  uint64_t task_id = 0;
  std::vector<float> global;
  train::TrainOptions options;
  bool secure = false;  // Securely aggregated: never send a plaintext update.
  // Federated evaluation: evaluate `global` on the client's own test split
  // before training (LocalTrainer::Evaluate); the result goes with the update.
  bool evaluate = false;
  // train.fednova: the update is the delta divided by the normaliser of the
  // steps taken (aggregation/fednova.h), which goes with it.
  bool fednova = false;
  // train.scaffold: the server's control variate c (after the task's model); the
  // update then carries c_i+ - c_i after the delta (aggregation/scaffold.h).
  // options.scaffold_correction holds c - c_i.
  bool scaffold = false;
  std::vector<float> server_variate;
  std::vector<float> client_variate;  // c_i the task starts from.
};

struct Actions {
  std::vector<Outbound> send;
  bool cancel_training = false;      // Stop the running job (if any) first.
  std::optional<TrainTask> train;    // Then start this one.
  std::optional<Status> exit;        // Stop with this status.
  std::vector<std::string> printed;  // Lines for stdout (fault injection).
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_ACTIONS_H_
