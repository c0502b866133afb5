// The round engine: the coordinator's protocol as a sans-I/O state machine.
// Events go in (a decoded message from a peer, the passage of time); messages
// to send come out. The daemon binds it to ZeroMQ; tests drive it directly.
//
// A round: wait until enough clients are available, select a seeded cohort,
// send each the global model, collect updates until all selected clients
// answered or the deadline passed, aggregate (FedAvg + server optimizer),
// evaluate on the test set, commit to the RunStore in one transaction.
#ifndef COHORT_COORDINATOR_ROUND_ENGINE_H_
#define COHORT_COORDINATOR_ROUND_ENGINE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "aggregation/aggregator.h"
#include "common/clock.h"
#include "common/status.h"
#include "coordinator/run_store.h"
#include "net/envelope.h"
#include "proto/config.pb.h"
#include "proto/wire.pb.h"

namespace cohort::coordinator {

// A message to send. `payload` (may be empty) is the round's model snapshot,
// shared by every task of the round; it stays alive as long as any message
// holding it, so the transport can send it without copying.
struct Outgoing {
  std::string peer;
  wire::Header header;
  std::shared_ptr<const std::vector<float>> payload;
};

struct EvalMetrics {
  double loss = 0;
  double accuracy = 0;
};
// Evaluates a global model; empty function: no central evaluation.
using Evaluator = std::function<StatusOr<EvalMetrics>(std::span<const float> params)>;

// Not thread-safe. Never aborts on anything a peer sends.
class RoundEngine {
 public:
  // Opens the run in `store`: creates it (initial model from `init_model`)
  // when the store is empty, otherwise resumes after its last committed round.
  // kFailedPrecondition when the store holds a run with another config.
  static StatusOr<std::unique_ptr<RoundEngine>> Create(const config::RunConfig& config,
                                                       std::vector<float> init_model,
                                                       RunStore* store, Evaluator evaluator,
                                                       std::string code_version, TimeMs now);

  // A decoded message from `peer`. Untrusted: a bad message gets an Error
  // reply naming the problem, and the sender (if selected) is dropped from
  // the round.
  std::vector<Outgoing> OnMessage(const std::string& peer, const net::Envelope& envelope,
                                  TimeMs now);
  // A message that could not be decoded.
  std::vector<Outgoing> OnMalformed(const std::string& peer, const Status& why);
  // Time passed: deadlines, client timeouts, starting rounds.
  std::vector<Outgoing> OnTick(TimeMs now);

  // When the engine next needs OnTick (absent: only a message can wake it).
  std::optional<TimeMs> NextWakeup() const;
  bool done() const { return phase_ == Phase::kDone; }
  // After done(): every available client has acknowledged Finished, so the
  // daemon can close without cutting anyone off.
  bool all_acknowledged_finish() const;
  uint32_t last_committed_round() const { return round_; }
  std::span<const float> global_model() const { return global_; }
  size_t num_params() const { return global_.size(); }
  // Rounds committed since the last call (for the daemon's per-round line).
  std::vector<RoundRecord> TakeCommitted() { return std::exchange(committed_, {}); }
  // Limits for decoding a message from a client.
  net::Limits limits() const;
  // The first error the store returned, if any (the daemon stops on it).
  const Status& store_error() const { return store_error_; }

 private:
  enum class Phase { kWaiting, kTraining, kDone };
  struct Client {
    std::string peer;
    TimeMs last_seen = 0;
    bool active = true;
    uint64_t num_samples = 0;
  };
  struct Participant {
    std::string name;
    enum class State { kPending, kOk, kDropped, kRejected } state = State::kPending;
    std::string reason;
    uint64_t num_samples = 0;
    double train_loss = 0, train_accuracy = 0, train_seconds = 0;
  };

  RoundEngine(const config::RunConfig& config, RunStore* store, Evaluator evaluator);

  void OnHello(const std::string& peer, const wire::Hello& hello, TimeMs now,
               std::vector<Outgoing>& out);
  void OnUpdate(const std::string& peer, const net::Envelope& envelope, TimeMs now,
                std::vector<Outgoing>& out);
  void MaybeStartRound(TimeMs now, std::vector<Outgoing>& out);
  void CloseRound(TimeMs now, std::vector<Outgoing>& out);
  void Drop(Participant& p, Participant::State state, std::string reason);
  bool AllResolved() const;
  Outgoing MakeTask(const std::string& peer, const std::string& name) const;
  Outgoing MakeError(const std::string& peer, wire::ErrorCode code, std::string message) const;
  Participant* FindParticipant(const std::string& name);
  const std::string* NameOf(const std::string& peer) const;

  config::RunConfig config_;
  RunStore* store_;
  Evaluator evaluator_;
  std::vector<float> global_;
  std::vector<float> velocity_;
  uint32_t round_ = 0;  // Last committed.
  Phase phase_ = Phase::kWaiting;
  bool first_round_ = true;
  std::map<std::string, Client> clients_;  // By name.
  std::map<std::string, std::string> peer_to_name_;
  std::set<std::string> acknowledged_finish_;  // Names, after done().

  // The round in progress.
  uint64_t task_id_ = 0;
  uint64_t task_counter_ = 0;
  TimeMs round_started_ = 0;
  TimeMs deadline_ = 0;
  double round_start_wall_ = 0;
  std::vector<Participant> participants_;                 // Sorted by name.
  std::shared_ptr<const std::vector<float>> task_model_;  // Sent with every task.
  std::unique_ptr<aggregation::Aggregator> aggregator_;
  std::vector<RoundRecord> committed_;
  Status store_error_;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_ROUND_ENGINE_H_
