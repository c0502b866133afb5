// The round engine: the coordinator's protocol as a sans-I/O state machine.
// Events go in (a decoded message from a peer, the passage of time); messages
// to send come out. The daemon binds it to ZeroMQ; tests drive it directly.
//
// A round: wait until enough clients are available, let the strategy
// (coordinator/strategy.h) select a cohort, send each the global model,
// collect updates until all selected clients answered or the deadline
// passed, average them, let the strategy step the model and evaluate it,
// commit to the RunStore in one transaction.
//
// With secure aggregation (secagg.aggregation SECAGG or SECAGG_PLUS) the
// collection step is the five-stage protocol of aggregation/secagg.h: the
// key exchange runs while clients train, updates arrive masked, and the
// engine only ever holds their sum (round_engine_secagg.cc).
#ifndef COHORT_COORDINATOR_ROUND_ENGINE_H_
#define COHORT_COORDINATOR_ROUND_ENGINE_H_

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aggregation/aggregator.h"
#include "aggregation/fixed_point.h"
#include "aggregation/secagg.h"
#include "aggregation/secagg_stage.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/status.h"
#include "coordinator/client_registry.h"
#include "coordinator/messages.h"
#include "coordinator/protocol_engine.h"
#include "coordinator/round_timings.h"
#include "coordinator/strategy.h"
#include "coordinator/strategy_dp.h"
#include "coordinator/strategy_fednova.h"
#include "coordinator/strategy_scaffold.h"
#include "crypto/keys.h"
#include "net/envelope.h"
#include "proto/config.pb.h"
#include "proto/wire.pb.h"
#include "store/run_store.h"

namespace cohort::coordinator {

// Not thread-safe. Never aborts on anything a peer sends.
class RoundEngine final : public ProtocolEngine {
 public:
  // Opens the run in `store`: creates it (initial model from `init_model`)
  // when the store is empty, otherwise resumes after its last committed round.
  // kFailedPrecondition when the store holds a run with another config.
  // `env` (not owned; outlives the engine) measures durations, draws task
  // ids and nonces, and takes the log lines.
  static StatusOr<std::unique_ptr<RoundEngine>> Create(const config::RunConfig& config,
                                                       std::vector<float> init_model,
                                                       store::RunStore* store, Evaluator evaluator,
                                                       std::string code_version,
                                                       Env* env = Env::Default());

  // Who the transport says sent a message (client_registry.h).
  using AuthenticatedPeer = coordinator::AuthenticatedPeer;
  // A decoded message from `peer`, authenticated as `sender` (null: the
  // transport authenticates no one). Untrusted: a bad message gets an Error
  // reply naming the problem, and the sender (if selected) is dropped from
  // the round.
  std::vector<Outgoing> OnMessage(const std::string& peer, const net::Envelope& envelope,
                                  TimeMs now, const AuthenticatedPeer* sender = nullptr) override;
  // A message that could not be decoded.
  std::vector<Outgoing> OnMalformed(const std::string& peer, const Status& why) override;
  // `name`'s key left the allowlist (the daemon reloaded it): a registered
  // client is sent a Reject saying `why`, is not selected again, and leaves
  // the round in progress as a dropout at its stage. The transport must
  // refuse its messages from now on. Nothing for an unregistered name.
  std::vector<Outgoing> Revoke(const std::string& name, const std::string& why,
                               TimeMs now) override;
  // Time passed: deadlines, client timeouts, starting rounds.
  std::vector<Outgoing> OnTick(TimeMs now) override;

  // When the engine next needs OnTick (absent: only a message can wake it).
  std::optional<TimeMs> NextWakeup() const override;
  bool done() const override { return phase_ == Phase::kDone; }
  // After done(): every client heard from within the client timeout, dropped
  // from a round or not, has acknowledged Finished, so the daemon can close
  // without cutting anyone off.
  bool all_acknowledged_finish(TimeMs now) const override {
    return clients_.AllAcknowledgedFinish(now);
  }
  uint32_t last_committed_round() const override { return round_; }
  // A round waiting to start (or to run again) with fewer reachable
  // (active, unbanned) clients than it needs waits until one speaks again:
  // the registered clients it waits for, by name; empty when it is not
  // waiting so. A FedBuff group, whose clients are fixed, closes instead.
  std::vector<std::string> AwaitedAbsentClients() const;
  std::span<const float> global_model() const { return global_; }
  size_t num_params() const override { return global_.size(); }
  // Rounds committed since the last call (for the daemon's per-round line).
  std::vector<store::RoundRecord> TakeCommitted() override { return std::exchange(committed_, {}); }
  // Limits for decoding a message from a client.
  net::Limits limits() const override;
  // The first error the store returned, if any (the daemon stops on it).
  const Status& store_error() const override { return store_error_; }
  // Clients proven to misbehave, with why: excluded from the rest of the
  // run (FedBuffEngine carries a group's into its own list).
  const std::map<std::string, std::string>& banned() const { return banned_; }

  // Central differential privacy (config privacy): the run secret that keys
  // the noise and the secret cohort order (coordinator/noise_key.h loads
  // it). A privacy run starts no round without it: the round is refused
  // with store_error() kFailedPrecondition.
  void SetNoiseKey(SecretBytes key);
  // Why a run is done before rounds.num_rounds ("privacy budget spent:
  // ε=... > ..."); empty otherwise.
  const std::string& finish_reason() const override { return finish_reason_; }

  // Debugging and tests: called with each securely aggregated round's
  // unmasked sum (fixed point, mod 2^32) and the names whose inputs it holds.
  using SumObserver = std::function<void(uint32_t round, std::span<const uint32_t> sum,
                                         const std::vector<std::string>& names)>;
  void set_sum_observer(SumObserver observer) { sum_observer_ = std::move(observer); }

 private:
  enum class Phase { kWaiting, kTraining, kDone };
  using Client = ClientRegistry::Client;
  // A selected client's life in a round. Every participant starts
  // kTraining; only the transitions below change `state`:
  //
  //   kTraining --Accept--> kAccepted --Leave--> kLeftAfterInput
  //       |                  (secure rounds only: it still owes the later
  //       |                   stages; its input counts whatever follows)
  //       +--Leave(kDropped: silent, late, reconnected, said goodbye)--> kDropped
  //       +--Leave(kRejected: a bad update or message, misbehaviour)--> kRejected
  //   Void (the round is aborted): all but kDropped, kRejected --> kDropped
  //
  // A plain round waits on kTraining only; a secure one on kTraining and
  // kAccepted (in_round()). Proven misbehaviour (`misbehaved`, a ban) is a
  // fact beside the state: a client whose input is in the sum stays counted.
  struct Participant {
    enum class State { kTraining, kAccepted, kLeftAfterInput, kDropped, kRejected };
    std::string name;
    State state = State::kTraining;
    std::string reason;  // Why it left, was dropped or rejected, or is banned.
    bool misbehaved = false;
    // Registered count at selection: the update's weight for the whole
    // round, whatever a later Hello claims.
    uint64_t num_samples = 0;
    std::string data_sha256;             // The registered client's shard digest (Hello).
    std::vector<uint64_t> label_counts;  // Its samples per class (opt-in Hello).
    double train_loss = 0, train_accuracy = 0, train_seconds = 0;
    // A plain round's federated evaluation (0 samples: none).
    uint64_t eval_samples = 0;
    double eval_loss = 0, eval_accuracy = 0;
    // A plain FedNova round: the update's normaliser a_k.
    double fednova_norm = 0;
    // Secure aggregation: the last stage this client completed, and the
    // stage at which it left the round (kNone: it did not).
    aggregation::SecAggStage answered = aggregation::SecAggStage::kNone;
    aggregation::SecAggStage left_at = aggregation::SecAggStage::kNone;

    // Whether its update (or masked input) is in the round's sum.
    bool counts() const { return state == State::kAccepted || state == State::kLeftAfterInput; }
    // Whether it still takes part in the round (a secure round waits on it).
    bool in_round() const { return state == State::kTraining || state == State::kAccepted; }
    // kTraining -> kAccepted: its update is in the sum.
    void Accept();
    // Out of the round at `stage` (kNone in a plain round) as `outcome`
    // (kDropped or kRejected), unless its input is in: then kLeftAfterInput,
    // and the reason says where it left.
    void Leave(State outcome, std::string reason, aggregation::SecAggStage stage);
    // The round is aborted: no input counts.
    void Void(const std::string& why);
  };

  RoundEngine(const config::RunConfig& config, store::RunStore* store, Env* env);

  // OnMessage's work, which it wraps in the round's byte counts.
  std::vector<Outgoing> Dispatch(const std::string& peer, const net::Envelope& envelope, TimeMs now,
                                 const AuthenticatedPeer* sender);
  // Counts the messages about to go out in the round's traffic.
  void CountSent(const std::vector<Outgoing>& out);

  // The reply refusing a Hello (ClientRegistry::CheckHello), or nothing;
  // `identity` gets its key.
  std::optional<Outgoing> RefuseHello(const std::string& peer, const wire::Hello& hello,
                                      const AuthenticatedPeer* sender,
                                      std::optional<crypto::Ed25519Public>& identity) const;
  void OnHello(const std::string& peer, const wire::Hello& hello, const AuthenticatedPeer* sender,
               TimeMs now, std::vector<Outgoing>& out);
  // A registered client's Hello while a round trains: a selected one that
  // changed its sample count is banned, one that reconnected leaves a
  // secure round or gets its plain task again.
  void HelloInRound(const std::string& peer, const wire::Hello& hello, bool recount,
                    bool reconnected, TimeMs now, std::vector<Outgoing>& out);
  void OnUpdate(const std::string& peer, const net::Envelope& envelope, TimeMs now,
                std::vector<Outgoing>& out);
  // Why client `name`'s update `u` is not for the open round's sum, and
  // whether the refusal names the update's task (not for a second copy of
  // one that counted); nullopt: admitted, with its participant in `p`.
  struct UpdateRefusal {
    wire::ErrorCode code;
    std::string why;
    bool names_task = true;
  };
  std::optional<UpdateRefusal> AdmitUpdate(const std::string& name, const wire::Update& u,
                                           Participant*& p);
  // Starts a round when the strategy selects a cohort from the clients
  // available.
  void MaybeStartRound(TimeMs now, std::vector<Outgoing>& out);
  // The clients a round needs before it starts, bans discounted.
  uint32_t ClientsNeeded() const;
  // Sets up the aggregation of a round of `cohort` and sends its tasks.
  void StartRound(const std::vector<std::string>& cohort, TimeMs now, std::vector<Outgoing>& out);
  void CloseRound(TimeMs now, std::vector<Outgoing>& out);
  // Why re-running a plain round short of rounds.min_clients could not reach
  // it (an update a check refused would be refused again), so the round is
  // committed aborted (the next round's seeds differ); "" if a re-run could.
  std::string WhyARerunIsFutile() const;
  // "not counted: c2 (missed the round deadline), c3 (update refused: ...)":
  // the participants whose updates are not in the round and why, the first
  // three by name, then how many more. (A round short of min_clients has
  // at least one: its cohort was at least min_clients.)
  std::string NotCounted() const;
  // Applies `mean` (null: an aborted round, model unchanged), evaluates and
  // commits the round, then starts the next one or finishes the run.
  // `spent_seconds`: coordinator time already spent aggregating.
  // `abort_reason` says why, for a null `mean`. A model or metric that is
  // not finite is never committed: such a round is aborted instead.
  void CommitRound(TimeMs now, const aggregation::RoundMean* mean, double spent_seconds,
                   const std::string& abort_reason, std::vector<Outgoing>& out);
  // The strategy's server step on `mean` (with FedNova's tau_eff from it),
  // then its evaluation of the result; on an error (a value or metric that
  // is not finite) the model and the strategy's state stay as they were.
  Status StepModel(const aggregation::RoundMean& mean, EvalMetrics& metrics);
  // A plain update's metrics (and FedNova normaliser) onto its participant.
  void KeepPlainMetrics(const wire::Update& u, uint32_t round, Participant& p) const;
  // The round's per-client records; sums the weighted training loss of the
  // clients whose updates count.
  std::vector<store::ClientRoundRecord> ClientRecords(double& loss_sum, double& weight_sum) const;
  // The round's training loss as the store keeps it: -1 under distributed
  // DP (not known), the masked mean's in a secure round, the median of the
  // counted clients' under a robust rule, else their sample-weighted mean.
  double RoundTrainLoss(const aggregation::RoundMean* mean,
                        const std::vector<store::ClientRoundRecord>& clients, double loss_sum,
                        double weight_sum) const;

  // Whether the round still waits on `p`.
  bool Waiting(const Participant& p) const;
  // While the run waits: how many more clients it needs, and which field says so.
  void SayWhatTheRoundWaitsFor() const;
  // The client on `peer` left on purpose: a dropout at its stage, now.
  void OnGoodbye(const std::string& peer, const wire::Goodbye& goodbye, TimeMs now,
                 std::vector<Outgoing>& out);
  // Takes `p` out of the round (Participant::Leave at the stage in
  // progress); an update already accepted stays in the sum. Progress() then
  // closes whatever that lets close.
  void Exclude(Participant& p, Participant::State outcome, std::string reason);
  // Closes the round, or the protocol stage, that no longer waits on anyone.
  void Progress(TimeMs now, std::vector<Outgoing>& out);
  // Sums the accepted updates and commits the round.
  void FinishRound(TimeMs now, double started, std::vector<Outgoing>& out);

  // Federated evaluation (rounds.federated_eval_every): whether the run has
  // it (its masked vectors carry the evaluation's slots), and whether round
  // `round`'s clients evaluate the model they receive.
  bool federated_eval() const { return config_.rounds().federated_eval_every() > 0; }
  bool EvaluatesRound(uint32_t round) const;
  // The masked vector's length: the model and the metric slots.
  size_t secure_length() const;
  // An update's values before the slots: the model's delta, and with
  // SCAFFOLD the control variate's change after it.
  size_t update_values() const { return global_.size() * (scaffold_ != nullptr ? 2 : 1); }
  // The round's test-sample-weighted federated evaluation into `record`.
  void RecordFederatedEval(const aggregation::RoundMean& mean, store::RoundRecord& record) const;

  // Secure aggregation (round_engine_secagg.cc).
  bool secure() const;
  // The protocol server of a secure round in progress, else null.
  aggregation::SecAggServer* secagg() const {
    return aggregator_ ? aggregator_->secagg() : nullptr;
  }
  // rounds.min_clients, at least 3 with secure aggregation.
  uint32_t MinClients() const;
  Status StartSecAgg(std::span<const std::string> cohort);
  Status StartPlain();
  // The name of the secure-aggregation stage in progress.
  const char* SecAggStageName() const;
  void OnSecAggMessage(const std::string& peer, const net::Envelope& envelope, TimeMs now,
                       std::vector<Outgoing>& out);
  // Closes every stage whose clients all answered or whose deadline passed.
  void AdvanceSecAgg(TimeMs now, std::vector<Outgoing>& out);
  // Ends stages 1-5 (messages for the next stage into `out`); an error aborts.
  Status CloseSecAggStage(TimeMs now, std::vector<Outgoing>& out);
  void BroadcastSecAgg(const wire::Header& h, std::vector<Outgoing>& out);
  // To cohort member `index`, unless it left the round.
  void SendSecAgg(uint32_t index, wire::Header h, std::vector<Outgoing>& out);
  // Names the clients the protocol caught misbehaving, and puts them out.
  void TakeSecAggBlame();
  // Records proven misbehaviour on the participant and bans the client.
  void Ban(Participant& p, const std::string& why);
  // Bans from the client records of rounds 1..round_ (on resume).
  Status LoadBans();
  // SCAFFOLD: N from the stored rounds (on resume): the highest recorded.
  Status LoadScaffoldPopulation();
  // Privacy (dp_): the accountant rebuilt from the stored rounds (on
  // resume); whether the budget allows a round of `cohort` (else the run
  // finishes, saying so, with Finished to every client); the round's
  // sampling rate and ε into its record.
  Status LoadPrivacy();
  // Distributed DP (privacy.mechanism DISTRIBUTED_SKELLAM): chooses the
  // grid for a model of `num_params` values and hands it to dp_; the
  // start-up error when no grid keeps the 32-bit sum from wrapping.
  Status SetUpDistributedDp(size_t num_params);
  bool PrivacyAllows(size_t cohort, const CohortRequest& request, std::vector<Outgoing>& out);
  void RecordPrivacy(store::RoundRecord& record);
  // FedNova (fednova_): the round's tau_eff, from the masked sum's slot or
  // the plain updates' normalisers, handed to the decorator before the step.
  Status PrepareFedNova(const aggregation::RoundMean& mean);
  // A secure round's decoded tau_eff, clamped (with a warning) into what
  // the counted clients' honest normalisers can average to: one client's
  // slot can move it anywhere, also below 0 by wrapping the 32-bit sum.
  double ClampSecureTauEff(double tau_eff) const;
  // SCAFFOLD (scaffold_): the round's Σ Δc_i, from the second half of
  // `mean`'s delta (a secure sum's decoded back from the 1 / n weights),
  // handed to the decorator; `delta` becomes the first half.
  Status PrepareScaffold(const aggregation::RoundMean& mean, std::span<const float>& delta);
  void AbortRound(TimeMs now, const std::string& why, std::vector<Outgoing>& out);
  Participant* SecAggSender(const std::string& peer, uint32_t round, uint64_t task_id,
                            aggregation::SecAggStage stage, const std::string& what, TimeMs now,
                            std::vector<Outgoing>& out);
  int LiveWaiting() const;
  // The checks every update passes, plain or masked.
  Status CheckUpdate(const wire::Update& u, const net::Envelope& envelope, const Participant& p,
                     bool masked) const;
  bool AllResolved() const;
  // The secure round's setup for cohort member `name` (messages.h sends it).
  aggregation::SecAggSetup SecAggSetupFor(const std::string& name) const;
  // What every client of a secure round does to its input before masking,
  // in each setup and bound into the session context.
  aggregation::InputRules InputRules() const;
  // The task of `name` for the round in progress, as the strategy sets it.
  Outgoing MakeTask(const std::string& peer, const std::string& name) const;
  // ErrorMessage naming the round the engine is in.
  Outgoing MakeError(const std::string& peer, wire::ErrorCode code, std::string message) const;
  Participant* FindParticipant(const std::string& name);

  config::RunConfig config_;
  store::RunStore* store_;
  // Selection, the task's config, the server step and its state, evaluation.
  std::unique_ptr<Strategy> strategy_;
  // strategy_ itself when the config has privacy (it wraps the strategy the
  // config picks), else null.
  DpStrategy* dp_ = nullptr;
  // The FedNova decorator inside strategy_ (train.fednova), else null.
  FedNovaStrategy* fednova_ = nullptr;
  // The SCAFFOLD decorator inside strategy_ (train.scaffold), else null;
  // its N for the round in progress: the clients registered at its start,
  // or more (N never falls, and a resumed run starts from the stored N).
  ScaffoldStrategy* scaffold_ = nullptr;
  uint64_t scaffold_population_ = 0;
  std::string finish_reason_;
  std::vector<float> global_;
  uint32_t round_ = 0;  // Last committed.
  // A plain round short of updates is run again, at most this many times in
  // all; then it is committed aborted, so a run always ends.
  static constexpr uint32_t kMaxRoundAttempts = 3;
  uint32_t attempts_ = 0;  // Tries of round_ + 1 that fell short.
  Phase phase_ = Phase::kWaiting;
  bool first_round_ = true;
  ClientRegistry clients_;
  // Clients the protocol proved misbehaving, with the reason: never selected
  // again in this run. Rebuilt from the store's client records on resume.
  std::map<std::string, std::string> banned_;

  // The round in progress.
  uint64_t task_id_ = 0;
  Env* env_;
  std::string run_nonce_;  // store::RunInfo::run_nonce, sent in every Welcome.
  uint64_t task_counter_ = 0;
  TimeMs round_started_ = 0;
  TimeMs deadline_ = 0;
  double round_start_wall_ = 0;
  std::vector<Participant> participants_;                 // Sorted by name.
  std::shared_ptr<const std::vector<float>> task_model_;  // Sent with every task.
  // The round's sum (aggregation/aggregator.h): plain or secure, as the
  // config says; the engine hands it updates and asks for the mean.
  std::unique_ptr<aggregation::Aggregator> aggregator_;
  std::vector<store::RoundRecord> committed_;
  Status store_error_;

  // Secure aggregation state of the round in progress (kNone: none).
  aggregation::SecAggStage stage_ = aggregation::SecAggStage::kNone;
  TimeMs stage_deadline_ = 0;
  aggregation::SecAggParams secagg_params_;
  aggregation::FixedPoint fixed_point_;
  std::vector<crypto::Ed25519Public> cohort_identities_;
  std::array<uint8_t, 32> secagg_nonce_{};
  // The round's task (aggregation::TaskDigest of the train settings, the
  // evaluate flag and task_model_), bound into every client's session.
  crypto::Digest task_digest_{};
  double cohort_weight_ = 0;        // Sum of the cohort's registered samples.
  double aggregation_seconds_ = 0;  // Coordinator time spent summing, this round.
  RoundTimings timings_;            // Its stages' seconds and bytes, each client's bytes.
  SumObserver sum_observer_;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_ROUND_ENGINE_H_
