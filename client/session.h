// The client's protocol as a sans-I/O state machine: events in (a decoded
// message from the coordinator, training finished, time passed), actions out
// (messages to send, training to start or cancel, exit). The daemon binds it
// to a DEALER socket and a training thread; tests drive it directly.
#ifndef COHORT_CLIENT_SESSION_H_
#define COHORT_CLIENT_SESSION_H_

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "net/envelope.h"
#include "proto/config.pb.h"
#include "proto/wire.pb.h"
#include "train/trainer.h"

namespace cohort::client {

struct Outbound {
  wire::Header header;
  std::vector<float> payload;  // Empty: none.
};

struct TrainTask {
  uint32_t round = 0;
  uint64_t task_id = 0;
  std::vector<float> global;
  train::TrainOptions options;
};

struct Actions {
  std::vector<Outbound> send;
  bool cancel_training = false;      // Stop the running job (if any) first.
  std::optional<TrainTask> train;    // Then start this one.
  std::optional<Status> exit;        // Stop with this status.
  std::vector<std::string> printed;  // Lines for stdout (fault injection).
};

// Builds the local model for the coordinator's ModelConfig; returns its
// parameter count, or why the local data cannot train it.
using ModelBuilder = std::function<StatusOr<size_t>(const config::ModelConfig&)>;

// Not thread-safe.
class Session {
 public:
  // `pause_before_update_round`: fault injection (0: off), see ClientOptions.
  Session(std::string name, uint64_t num_samples, ModelBuilder build_model,
          uint32_t pause_before_update_round = 0);

  Actions Start(TimeMs now);
  // `envelope` comes from the coordinator; it is untrusted all the same.
  Actions OnMessage(const net::Envelope& envelope, TimeMs now);
  // The job for `task_id` ended; `local` holds the trained parameters.
  Actions OnTrainingDone(uint64_t task_id, const StatusOr<train::TrainResult>& result,
                         std::span<const float> local, TimeMs now);
  Actions OnTick(TimeMs now);

  // When OnTick is next due.
  TimeMs NextWakeup() const;
  // Decoding limit for the coordinator's messages (0 before Welcome).
  size_t num_params() const { return num_params_; }
  bool welcomed() const { return welcomed_; }

 private:
  void SendHello(TimeMs now, Actions& a);
  void Send(wire::Header header, std::vector<float> payload, TimeMs now, Actions& a);
  TimeMs Interval() const;

  std::string name_;
  uint64_t num_samples_;
  ModelBuilder build_model_;
  uint32_t pause_round_;
  size_t num_params_ = 0;
  bool welcomed_ = false;
  TimeMs heartbeat_ms_ = 1000;
  TimeMs last_sent_ = 0;
  TimeMs last_heard_ = 0;
  // The task being trained (if any) and the last one finished.
  std::optional<TrainTask> running_;
  uint64_t last_completed_task_ = 0;
  bool finished_ = false;
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_SESSION_H_
