// The client's protocol as a sans-I/O state machine: events in (a decoded
// message from the coordinator, training finished, time passed), actions out
// (messages to send, training to start or cancel, exit). The daemon binds it
// to a DEALER socket and a training thread; tests drive it directly.
#ifndef COHORT_CLIENT_SESSION_H_
#define COHORT_CLIENT_SESSION_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aggregation/fixed_point.h"
#include "aggregation/secagg.h"
#include "aggregation/secagg_stage.h"
#include "client/actions.h"
#include "client/control_variate.h"
#include "client/dp_ledger.h"
#include "client/fault_filter.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/rng.h"
#include "common/status.h"
#include "crypto/keys.h"
#include "crypto/merkle.h"
#include "net/envelope.h"
#include "proto/config.pb.h"
#include "proto/wire.pb.h"
#include "train/trainer.h"

namespace cohort::client {

// Called with this client's fixed-point encoded, weighted input of a
// securely aggregated round, before masking (debugging and tests).
using InputObserver = std::function<void(uint32_t round, std::span<const uint32_t> input)>;

// Builds the local model for the coordinator's ModelConfig; returns its
// parameter count, or why the local data cannot train it.
using ModelBuilder = std::function<StatusOr<size_t>(const config::ModelConfig&)>;

// Not thread-safe.
class Session {
 public:
  // `identity` (not owned, must outlive the session) signs the secure-
  // aggregation stages; its public key goes in Hello. `fault` (testing)
  // passes every Actions returned through a FaultFilter. `env` (not owned)
  // takes the session's log lines and supplies its randomness.
  Session(std::string name, uint64_t num_samples, ModelBuilder build_model,
          const crypto::Ed25519KeyPair* identity, FaultPlan fault = {}, InputObserver observer = {},
          Env* env = Env::Default());

  Actions Start(TimeMs now);
  // `envelope` comes from the coordinator; it is untrusted all the same.
  Actions OnMessage(const net::Envelope& envelope, TimeMs now);
  // The job for `task_id` ended; `local` holds the trained parameters and
  // `eval` the evaluation of the task's model on this client's test split,
  // where the task asked for one and the client has a test split.
  Actions OnTrainingDone(uint64_t task_id, const StatusOr<train::TrainResult>& result,
                         std::span<const float> local, TimeMs now,
                         const std::optional<train::EvalResult>& eval = std::nullopt);
  Actions OnTick(TimeMs now);
  // This client is stopping (its operator's signal): a Goodbye, so the
  // coordinator closes this client's part of the round at once.
  Actions Leave(TimeMs now);

  // When OnTick is next due.
  TimeMs NextWakeup() const;
  // Decoding limit for the coordinator's messages (0 before Welcome).
  size_t num_params() const { return num_params_; }
  // Identity keys allowed in a secure-aggregation cohort (--peers); a setup
  // naming any other key is refused. Empty (the default): no check.
  // The SHA-256 (hex) of this client's training shard, for the run's
  // lineage: sent in Hello, unless the client is pinned to distributed DP
  // (set_dp_noise_multiplier). Empty (the default): none sent.
  void set_data_sha256(std::string digest) { data_sha256_ = std::move(digest); }
  // Samples per class, sent in Hello where the client opted in (empty:
  // none sent).
  void set_label_counts(std::vector<uint64_t> counts) { label_counts_ = std::move(counts); }
  void set_peers(std::vector<crypto::Ed25519Public> peers) {
    std::sort(peers.begin(), peers.end());
    peers_ = std::move(peers);
  }
  // Refuse every task that is not securely aggregated: the update is then
  // never sent in the clear, whatever the coordinator asks. Implied by
  // set_peers (a site that checks its cohorts wants them to matter).
  void set_require_secure(bool require) { require_secure_ = require; }
  // SCAFFOLD (train.scaffold): keep this client's control variate c_i in
  // `state_dir` (client/control_variate.h), read at the first SCAFFOLD task
  // and replaced atomically before each update is sent. Unset (the
  // simulator): c_i lives in this session only. A task of the round of the
  // last update sent (that round run again) trains from the c_i of before
  // it. A variate file that cannot be read (corrupt, another model's size)
  // is never overwritten: each SCAFFOLD task is then left with a Goodbye
  // naming the file.
  //
  // Distributed DP: the ledger of the rounds this client noised an update
  // for (client/dp_ledger.h) is kept there too. Unset: in this session
  // only, so a restarted client forgets it.
  void set_state_dir(const std::string& state_dir);
  // The coordinator's public key this client pinned (raw bytes; empty, the
  // default: none, as with --insecure). With the run's name from Welcome it
  // names the run in distributed DP's ledger: a distributed-DP task of a
  // round of that run this client already noised an update for is left
  // with a Goodbye, as a dropout (a repeat would let the coordinator
  // average the noise away); so is every distributed-DP task while the
  // ledger file cannot be read.
  void set_coordinator_key(std::string key) { coordinator_key_ = std::move(key); }
  // Distributed DP: this client's own noise multiplier (sigma; 0, the
  // default: none). The setup says the grid s, the clip norm C and each
  // share's variance, sized by the coordinator for m survivors, but not m
  // or sigma; with sigma pinned here, m = (s sigma C)^2 / share variance,
  // and a setup whose cohort is smaller than that (its n shares together
  // carry less than the target noise) is refused before the key exchange,
  // as is a survivor list shorter than m (this client does not sign it).
  // A pinned multiplier also refuses any round that is not securely
  // aggregated (it would carry no noise at all).
  // Distributed DP: the most noised updates this client makes, over every
  // run and coordinator its ledger holds (with a state directory, across
  // restarts). A coordinator that renumbers or renames rounds to average
  // away the noise gets at most this many noised copies. 0: no cap.
  void set_dp_max_rounds(uint32_t rounds) { dp_max_rounds_ = rounds; }
  void set_dp_noise_multiplier(double sigma) {
    dp_noise_multiplier_ = sigma;
    if (sigma > 0) require_secure_ = true;
  }
  // c_i after the last update sent (empty before the first SCAFFOLD task).
  std::span<const float> control_variate() const {
    return variate_ ? std::span<const float>(variate_->after) : std::span<const float>();
  }
  bool welcomed() const { return welcomed_; }
  // This client's own planning figure for the fraction of a cohort that may
  // collude with the coordinator (default 0.1): it refuses a secure-
  // aggregation setup whose threshold is weaker than this requires.
  void set_min_corrupt_fraction(double fraction) { min_corrupt_fraction_ = fraction; }
  // The longest this client waits for the coordinator's next secure-
  // aggregation message before it leaves the round (default 600 s; ten
  // times that for the survivor list, which waits for the others'
  // training). Within it, the wait is twice the coordinator's stated stage
  // timeout (round deadline for the survivor list) plus 30 s. A
  // coordinator cannot hold a round open to compute between two stages for
  // longer than this.
  void set_secagg_stage_limit_ms(TimeMs limit) { secagg_stage_limit_ms_ = limit; }

 private:
  void SendHello(TimeMs now, Actions& a);
  // Secure aggregation of the current task.
  struct SecAggRound {
    uint32_t round = 0;
    uint64_t task_id = 0;
    uint64_t train_seed = 0;  // From the task; seeds the stochastic rounding.
    std::string setup;        // The SecAggSetup it started from, serialized.
    aggregation::FixedPoint fixed_point;
    double weight = 0;          // num_samples / total_weight.
    bool eval_slots = false;    // The vector carries the federated evaluation's slots.
    float l2_clip = 0;          // The setup's bound on the delta's L2 norm; 0: none.
    bool fednova_slot = false;  // The vector ends with the FedNova normaliser's slot.
    // SCAFFOLD: the variate's change follows the delta, encoded with this
    // weight (1 / n, so the coordinator decodes its unweighted sum); 0: none.
    double variate_weight = 0;
    // Distributed DP (aggregation::SecAggSetup's dp_*): the delta is
    // encoded by privacy::EncodeSkellam; dp_scale 0: not.
    double dp_clip_norm = 0, dp_scale = 0, dp_l2_bound = 0, dp_share_variance = 0;
    // Adaptive clipping under distributed DP: the word after the delta is
    // the bit [||delta|| <= dp_clip_norm] on this grid, noised with this
    // share (privacy::EncodeClipBit); dp_count_scale 0: no such word.
    double dp_count_scale = 0, dp_count_share_variance = 0;
    // With this client's own noise multiplier: the fewest survivors whose
    // noise shares carry it (DpSurvivorsNeeded); a shorter survivor list is
    // refused. 0: no floor.
    uint32_t dp_survivors = 0;
    crypto::Digest task_digest{};  // Its task must hash to this (TaskDigest).
    std::unique_ptr<aggregation::SecAggClient> client;
    bool checked_in = false;  // U3 confirmed: ready to mask.
    // What this client waits for from the coordinator, and since when
    // (-1: nothing; see set_secagg_stage_limit_ms).
    const char* awaiting = nullptr;
    TimeMs awaiting_since = -1;
    TimeMs awaiting_limit = 0;
    TimeMs stage_limit = 0, survivors_limit = 0;  // From the setup, within the client's.
    std::optional<std::vector<uint32_t>> input;   // Encoded, awaiting U3.
    wire::Update update;                          // Its header.
    // The masked input left: from then on the sum may count it without
    // this client (the others' shares unmask it), so leaving the round
    // keeps c_i's change.
    bool input_sent = false;
  };
  // Starts the session of a secure task (from SecAggStart or the task);
  // on a refusal it prints why and leaves no session.
  // `scaffold`: the masked vector carries the control variate's change.
  void StartSecureTask(uint32_t round, uint64_t task_id, const wire::SecAggSetup& setup,
                       bool scaffold, TimeMs now, Actions& a);
  // With --peers: the setup's whole roster, against its root and --peers.
  Status CheckRoster(const aggregation::SecAggSetup& setup) const;
  Status StartSecAgg(uint32_t round, uint64_t task_id, const wire::SecAggSetup& setup,
                     bool scaffold, TimeMs now, Actions& a);
  void OnSecAggMessage(const wire::Header& h, TimeMs now, Actions& a);
  // Sends the client machine's reply to a stage message (Handle), and waits
  // for the coordinator's next; the unmask response ends the session.
  void SendReply(const aggregation::SecAggClientMessage& reply, TimeMs now, Actions& a);
  // StartSecAgg's checks of a setup: how many of the cohort may collude
  // (the coordinator's bound, this client's and --peers'), and the encoding
  // bounds and the roster proof's depth.
  StatusOr<double> CorruptBound(const aggregation::SecAggSetup& s) const;
  Status CheckSetupSums(const aggregation::SecAggSetup& s) const;
  // set_dp_noise_multiplier's check of a distributed-DP setup's cohort.
  Status CheckDpCohort(const aggregation::SecAggSetup& s) const;
  // And of adaptive clipping's count word: its noise with the update's must
  // not spend more than the pinned noise multiplier alone.
  Status CheckDpCountShare(const aggregation::SecAggSetup& s) const;
  uint32_t DpSurvivorsNeeded(const aggregation::SecAggSetup& s) const;
  Status CheckDpSurvivors(size_t survivors) const;
  // OnMessage's handlers, one per body.
  void OnWelcome(const wire::Welcome& w, Actions& a);
  bool AcceptTask(const wire::RoundTask& t, const net::Envelope& env, Actions& a);
  bool BindSecureTask(const wire::RoundTask& t, const net::Envelope& env, TimeMs now, Actions& a);
  void OnTask(const wire::RoundTask& t, const net::Envelope& env, TimeMs now, Actions& a);
  void OnSecAggStart(const wire::SecAggStart& st, TimeMs now, Actions& a);
  void OnError(const wire::Error& e, TimeMs now, Actions& a);
  void OnFinished(const wire::Finished& f, TimeMs now, Actions& a);
  // The update of a finished task: masked (the secure session sends it
  // once its shares are checked) or plain.
  // Warns when the fixed-point encoding changes what it carries: update
  // values beyond secagg.clip, a loss beyond kMaxSecureLoss. `global`
  // empty: `local` is the delta itself (already norm-bounded).
  void WarnAboutClipping(uint32_t round, std::span<const float> local,
                         std::span<const float> global, float clip, double loss) const;
  // secagg.l2_clip: `bounded` becomes the delta scaled to the bound where
  // its norm exceeds it (and says so in the log), else stays empty; false
  // when the delta is not finite.
  // `before` empty: `after` is the delta itself.
  bool BoundNorm(uint32_t round, std::span<const float> after, std::span<const float> before,
                 std::vector<float>& bounded) const;
  // train.fednova: the normaliser of the steps `result` took (aggregation/
  // fednova.h); kInvalidArgument when there were none or too many to carry.
  StatusOr<double> FedNovaNormOf(const TrainTask& task, const train::TrainResult& result) const;
  // `fednova_norm` > 0: the update is (local - global) / fednova_norm, and
  // the normaliser goes with it (in the clear, or as the vector's last slot).
  // SCAFFOLD's c_i+ kept (else the round left, saying why), then the
  // secure or plain update.
  void SendUpdate(const TrainTask& task, const train::TrainResult& result,
                  const std::optional<train::EvalResult>& eval, std::span<const float> local,
                  double fednova_norm, TimeMs now, Actions& a);
  // `delta_c` (SCAFFOLD's Δc_i; empty: none) follows the delta.
  void SendSecureUpdate(const TrainTask& task, const train::TrainResult& result,
                        const std::optional<train::EvalResult>& eval, std::span<const float> local,
                        double fednova_norm, std::span<const float> delta_c, TimeMs now,
                        Actions& a);
  // The delta as the secure update encodes it, when it is not local -
  // global as it is (FedNova's normalised delta, or one scaled to
  // secagg.l2_clip) in `sent`; false when it is not finite.
  bool SecureDelta(const TrainTask& task, std::span<const float> local, double fednova_norm,
                   std::vector<float>& sent) const;
  // The slots after the delta, into `slots` (room for all): the training
  // metrics, the evaluation's (zeros where it did not evaluate), FedNova's
  // normaliser, as the setup has them. Returns how many.
  size_t SecureSlots(const train::TrainResult& result, const std::optional<train::EvalResult>& eval,
                     double fednova_norm, std::span<float> slots) const;
  // SCAFFOLD under secure aggregation: Δc_i encoded with the variate's
  // weight, inserted after the delta (as many values as Δc_i) in `encoded`.
  // Without distributed DP: the delta (`bounded` when the norm bound scaled
  // it, else local - global) and the slots in fixed point, after a warning
  // about what the encoding clips. False (and Refuse) on NaN or Inf.
  bool EncodeFixedPointInput(const TrainTask& task, std::span<const float> local,
                             std::vector<float>& bounded, std::span<const float> tail, double loss,
                             Rng& rng, std::vector<uint32_t>& encoded, Actions& a);
  // Distributed DP: the delta (local - global) clipped, rounded and noised
  // with a fresh secret seed (env RandomBytes) into encoded[0, local.size()),
  // the slots after it in fixed point. False (and Refuse) when it cannot.
  bool EncodeDistributedDp(const TrainTask& task, std::span<const float> local,
                           std::span<const float> tail, Rng& rng, std::vector<uint32_t>& encoded,
                           Actions& a);
  // Distributed DP's ledger: OK when this client has not noised an update
  // for `round` of the current run; else why it must not (a repeat, or a
  // ledger that cannot be read, naming the file).
  Status CheckDpLedger(uint32_t round) const;
  // Counts the noised update of `round` in the ledger before it is masked;
  // false (and Refuse) on a repeat or when the ledger cannot be written.
  bool RecordDpContribution(uint32_t round, Actions& a);
  Status DpRepeatError(uint32_t round) const;
  Status DpBudgetError(uint32_t round) const;
  DpRunId RunId() const { return DpRunIdOf(coordinator_key_, run_name_, run_nonce_); }
  void InsertVariate(uint32_t round, std::span<const float> delta_c, Rng& rng,
                     std::vector<uint32_t>& encoded) const;
  void SendPlainUpdate(const TrainTask& task, const train::TrainResult& result,
                       const std::optional<train::EvalResult>& eval, std::span<const float> local,
                       double fednova_norm, std::span<const float> delta_c, TimeMs now, Actions& a);
  // SCAFFOLD: c_i (loaded from the state directory the first time), and
  // c - c_i with the task's c into `task`; an error names the file.
  Status PrepareScaffold(TrainTask& task);
  // SCAFFOLD after training: c_i+ kept (saved first) and Δc_i into
  // `delta_c`; an error leaves c_i as it was.
  // SCAFFOLD: the update of task `task_id` moved c_i and will not count
  // (the coordinator refused it, in an error naming its task, or this
  // client left its secure round before its masked input was sent): c_i
  // goes back to what that round trained from, as the coordinator's c never
  // has the change. Any other task (or 0): nothing.
  void RollBackVariate(uint64_t task_id);
  // A task or SecAggStart comes while the secure session of an earlier task
  // has not sent its masked input (its key exchange stalled and the round
  // went on without it): that update can no longer count, so c_i goes back
  // before the next task trains from it.
  void DropUnsentInput();
  Status AdvanceVariate(const TrainTask& task, const train::TrainResult& result,
                        std::span<const float> local, std::vector<float>& delta_c);
  // Leaves task `task_id` before or after training with a Goodbye saying
  // `why` (and the end of its secure session, if any).
  void LeaveTaskSaying(uint32_t round, uint64_t task_id, const std::string& why, Actions& a);
  void SendMaskedInput(TimeMs now, Actions& a);
  // Sends a stage message and starts the wait for the coordinator's next
  // one (`what`), which must come within the stage limit.
  void SendSecAgg(wire::Header header, const char* what, TimeMs now, Actions& a);
  void Refuse(const Status& why, Actions& a);
  // Training of `task_id` failed: a Goodbye for its round, saying `why`
  // (and the end of its secure session, if any).
  void LeaveTask(uint64_t task_id, const Status& why, Actions& a);
  void Send(wire::Header header, std::vector<float> payload, TimeMs now, Actions& a);
  TimeMs Interval() const;

  Env* env_;
  std::string name_;
  uint64_t num_samples_;
  std::string data_sha256_;
  std::vector<uint64_t> label_counts_;
  ModelBuilder build_model_;
  const crypto::Ed25519KeyPair* identity_;
  FaultFilter outgoing_;  // Every Actions returned passes through it.
  InputObserver observer_;
  std::vector<crypto::Ed25519Public> peers_;  // Sorted; empty: no check.
  double min_corrupt_fraction_ = 0.1;
  TimeMs secagg_stage_limit_ms_ = 600000;
  std::optional<SecAggRound> secagg_;
  uint64_t secure_task_ = 0;  // The current task, if securely aggregated.
  bool require_secure_ = false;
  size_t num_params_ = 0;
  config::ModelConfig model_config_;  // The Welcome's, that the model was built from.
  bool welcomed_ = false;
  TimeMs heartbeat_ms_ = 1000;
  TimeMs last_sent_ = 0;
  TimeMs last_heard_ = 0;
  // The task being trained (if any) and the last one finished.
  std::optional<TrainTask> running_;
  uint64_t last_completed_task_ = 0;
  bool finished_ = false;
  // SCAFFOLD: where c_i is kept (empty: memory only), and c_i once read.
  std::string variate_path_;
  std::optional<ClientVariate> variate_;
  uint64_t variate_task_ = 0;  // The task whose update moved it last.
  // Distributed DP: the run's name and nonce (Welcome), the pinned
  // coordinator key, and the ledger of rounds noised.
  std::string run_name_;
  std::string run_nonce_;
  std::string coordinator_key_;
  DpLedger dp_ledger_;
  double dp_noise_multiplier_ = 0;
  uint32_t dp_max_rounds_ = 0;
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_SESSION_H_
