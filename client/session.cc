#include "client/session.h"

#include <fmt/format.h>
#include <sodium.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <variant>

#include "aggregation/fednova.h"
#include "aggregation/scaffold.h"
#include "aggregation/secagg_wire.h"
#include "client/control_variate.h"
#include "common/bytes.h"
#include "common/rng.h"
#include "privacy/skellam.h"
#include "train/model_config.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::client {

net::Envelope AsEnvelope(Outbound&& out) {
  net::Envelope e;
  e.header = std::move(out.header);
  if (!out.payload.empty()) e.payloads.push_back(std::move(out.payload));
  if (!out.words.empty()) {
    std::vector<float> bits(out.words.size());
    std::memcpy(bits.data(), out.words.data(), bits.size() * sizeof(float));
    e.payloads.push_back(std::move(bits));
  }
  return e;
}

namespace {

// Text from the coordinator (the run's name, an error, a rejection, a model
// it names) as a log line shows it: one line of printable ASCII, its first
// `most` bytes and "..." if there were more, so a coordinator cannot forge
// lines of this client's log.
std::string Printable(const std::string& text, size_t most = 64) {
  std::string out;
  for (char c : text.substr(0, most)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > most) out += "...";
  return out.empty() ? "\"\"" : out;
}

// Welcome.run_nonce: 32 hex digits from this build's coordinators.
constexpr size_t kMaxRunNonceBytes = 64;

Status CheckTask(const wire::RoundTask& task, const net::Envelope& env, size_t num_params) {
  if (task.round() == 0) return InvalidArgumentError("task for round 0");
  // SCAFFOLD: the server's control variate follows the model.
  const size_t expected = num_params * (task.train().scaffold() ? 2 : 1);
  if (env.payloads.size() != 1 || env.payloads[0].size() != expected) {
    return InvalidArgumentError("task model has " +
                                std::to_string(env.payloads.empty() ? 0 : env.payloads[0].size()) +
                                " values, expected " + std::to_string(expected));
  }
  if (!AllFinite(env.payloads[0])) return InvalidArgumentError("task model has NaN or Inf");
  const auto& t = task.train();
  if (t.local_epochs() == 0 || t.local_epochs() > 1000 || t.batch_size() == 0 ||
      t.batch_size() > 65536 || !std::isfinite(t.learning_rate()) || t.learning_rate() <= 0) {
    return InvalidArgumentError("task has out-of-range training settings");
  }
  // Checked here, not when training starts: a secure round would otherwise
  // lose this client as a silent dropout.
  Status optimizer = train::CheckOptimizerOptions(train::OptimizerFromConfig(t));
  if (!optimizer.ok()) return InvalidArgumentError("task: " + std::string(optimizer.message()));
  return OkStatus();
}

// train.fednova: a normaliser this client can compute (heavy-ball SGD, the
// config validator's rule), and a secure setup with its slot exactly then.
Status CheckFedNovaTask(const wire::RoundTask& task) {
  const auto& t = task.train();
  if (task.has_secagg() && task.secagg().fednova_slot() != t.fednova()) {
    return InvalidArgumentError("task: train.fednova and the secagg setup's fednova_slot disagree");
  }
  if (t.fednova() && (t.optimizer() != config::SGD || t.nesterov() || t.dampening() != 0 ||
                      t.proximal_mu() != 0)) {
    return InvalidArgumentError(
        "task: train.fednova needs optimizer SGD without nesterov, dampening or proximal_mu");
  }
  return OkStatus();
}

// train.scaffold: SGD's steps (the config validator's rule), without FedNova.
Status CheckScaffoldTask(const wire::RoundTask& task) {
  const auto& t = task.train();
  if (t.scaffold() && (t.optimizer() != config::SGD || t.fednova())) {
    return InvalidArgumentError("task: train.scaffold needs optimizer SGD and no train.fednova");
  }
  return OkStatus();
}

wire::Header Header() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

}  // namespace

Session::Session(std::string name, uint64_t num_samples, ModelBuilder build_model,
                 const crypto::Ed25519KeyPair* identity, FaultPlan fault, InputObserver observer,
                 Env* env)
    : env_(env),
      name_(std::move(name)),
      num_samples_(num_samples),
      build_model_(std::move(build_model)),
      identity_(identity),
      outgoing_(std::move(fault), name_, identity, env),
      observer_(std::move(observer)) {}

void Session::Refuse(const Status& why, Actions& a) {
  const uint32_t round = secagg_ ? secagg_->round : 0;
  env_->Log().warn("round {}: secure aggregation: leaving the round: {}", round, why.message());
  a.printed.push_back("secagg refused in round " + std::to_string(round) + ": " + why.message());
  if (secagg_) {
    // The coordinator closes this client's part of the round now, rather
    // than at the stage's timeout; the client stays for the next round.
    wire::Header h = Header();
    h.mutable_goodbye()->set_task_id(secagg_->task_id);
    h.mutable_goodbye()->set_reason("refused the round's secure aggregation: " +
                                    std::string(why.message()));
    a.send.push_back({std::move(h), {}, {}});
    if (!secagg_->input_sent) RollBackVariate(secagg_->task_id);
  }
  secagg_.reset();
}

void Session::LeaveTask(uint64_t task_id, const Status& why, Actions& a) {
  if (secagg_ && secagg_->task_id == task_id) secagg_.reset();
  // The coordinator closes this client's part of the round now, as a
  // dropout, rather than at its deadline; the client stays for the next.
  wire::Header h = Header();
  h.mutable_goodbye()->set_task_id(task_id);
  h.mutable_goodbye()->set_reason("training failed: " + std::string(why.message()));
  a.send.push_back({std::move(h), {}, {}});
}

void Session::Send(wire::Header header, std::vector<float> payload, TimeMs now, Actions& a) {
  last_sent_ = now;
  a.send.push_back({std::move(header), std::move(payload), {}});
}

void Session::SendHello(TimeMs now, Actions& a) {
  wire::Header h = Header();
  h.mutable_hello()->set_client_name(name_);
  h.mutable_hello()->set_num_samples(num_samples_);
  h.mutable_hello()->set_code_version(COHORT_VERSION);
  // Not for a client pinned to distributed DP: the digest would let the
  // coordinator, which it does not trust, confirm a guess of its data.
  if (dp_noise_multiplier_ <= 0) h.mutable_hello()->set_data_sha256(data_sha256_);
  for (uint64_t c : label_counts_) h.mutable_hello()->add_label_counts(c);
  if (identity_ != nullptr) {
    h.mutable_hello()->set_identity_key(identity_->public_key.data(), identity_->public_key.size());
    h.mutable_hello()->set_wants_roster(!peers_.empty());
  }
  Send(std::move(h), {}, now, a);
}

// Unwelcomed clients retry hello quickly (the send fails while unconnected).
TimeMs Session::Interval() const {
  return welcomed_ ? heartbeat_ms_ : std::min<TimeMs>(heartbeat_ms_, 250);
}

TimeMs Session::NextWakeup() const { return last_sent_ + Interval(); }

Actions Session::Start(TimeMs now) {
  Actions a;
  last_heard_ = now;
  SendHello(now, a);
  outgoing_.Apply(a);
  return a;
}

Actions Session::Leave(TimeMs now) {
  Actions a;
  if (!welcomed_ || finished_) return a;
  wire::Header h = Header();
  h.mutable_goodbye();
  Send(std::move(h), {}, now, a);
  return a;
}

Actions Session::OnTick(TimeMs now) {
  Actions a;
  if (secagg_ && secagg_->awaiting && now - secagg_->awaiting_since > secagg_->awaiting_limit) {
    // A client-side deadline: whatever the coordinator does between two
    // stages must fit in it (issue 29).
    Refuse(DeadlineExceededError(std::string("the coordinator sent no ") + secagg_->awaiting +
                                 " within " + std::to_string(secagg_->awaiting_limit / 1000) +
                                 " s; leaving the round"),
           a);
  }
  if (finished_ || now - last_sent_ < Interval()) return a;
  // Until welcomed, or when the coordinator has gone quiet, say hello.
  if (!welcomed_ || now - last_heard_ > 3 * heartbeat_ms_) {
    SendHello(now, a);
  } else {
    wire::Header h = Header();
    h.mutable_heartbeat();
    Send(std::move(h), {}, now, a);
  }
  outgoing_.Apply(a);
  return a;
}

Actions Session::OnTrainingDone(uint64_t task_id, const StatusOr<train::TrainResult>& result,
                                std::span<const float> local, TimeMs now,
                                const std::optional<train::EvalResult>& eval) {
  Actions a;
  if (!running_ || running_->task_id != task_id) return a;  // Replaced meanwhile.
  TrainTask task = std::move(*running_);
  running_.reset();
  if (!result.ok()) {
    env_->Log().error("round {}: training failed: {}; leaving the round", task.round,
                      result.status().message());
    LeaveTask(task.task_id, result.status(), a);
    outgoing_.Apply(a);
    return a;
  }
  last_completed_task_ = task_id;
  env_->Log().info("round {}: trained {} samples in {:.2f} s, loss {:.4f}", task.round,
                   result->samples, result->seconds, result->mean_loss);
  // Only what the task asked for: an evaluation it did not ask for stays
  // here, and so does one the coordinator would refuse.
  std::optional<train::EvalResult> asked = task.evaluate ? eval : std::nullopt;
  if (asked && !(std::isfinite(asked->loss) && asked->loss >= 0 && asked->accuracy >= 0 &&
                 asked->accuracy <= 1)) {
    env_->Log().warn(
        "round {}: the evaluation's loss {} or accuracy {} is out of range; it is "
        "not sent",
        task.round, asked->loss, asked->accuracy);
    asked.reset();
  }
  if (asked) {
    env_->Log().info(
        "round {}: evaluated the round's model on {} test samples: loss {:.4f}, "
        "accuracy {:.4f}",
        task.round, asked->samples, asked->loss, asked->accuracy);
  }
  double fednova_norm = 0;
  if (task.fednova) {
    StatusOr<double> norm = FedNovaNormOf(task, *result);
    if (!norm.ok()) {
      env_->Log().error("round {}: {}; leaving the round", task.round, norm.status().message());
      LeaveTask(task.task_id, norm.status(), a);
      outgoing_.Apply(a);
      return a;
    }
    fednova_norm = *norm;
    env_->Log().info("round {}: FedNova: {} steps, normaliser {:.6g}", task.round, result->steps,
                     fednova_norm);
  }
  SendUpdate(task, *result, asked, local, fednova_norm, now, a);
  outgoing_.Apply(a);
  return a;
}

void Session::SendUpdate(const TrainTask& task, const train::TrainResult& result,
                         const std::optional<train::EvalResult>& eval, std::span<const float> local,
                         double fednova_norm, TimeMs now, Actions& a) {
  // A securely aggregated task never sends a plaintext update: when the
  // session was refused or abandoned, nothing is sent at all, and c_i
  // stays as the round found it.
  if (task.secure && (!secagg_ || secagg_->task_id != task.task_id)) return;
  std::vector<float> delta_c;
  if (task.scaffold) {
    if (Status advanced = AdvanceVariate(task, result, local, delta_c); !advanced.ok()) {
      LeaveTaskSaying(task.round, task.task_id, std::string(advanced.message()), a);
      return;
    }
  }
  if (task.secure) {
    SendSecureUpdate(task, result, eval, local, fednova_norm, delta_c, now, a);
  } else {
    SendPlainUpdate(task, result, eval, local, fednova_norm, delta_c, now, a);
  }
}

void Session::set_state_dir(const std::string& state_dir) {
  variate_path_ = ControlVariatePath(state_dir);
  dp_ledger_ = DpLedger(DpLedgerPath(state_dir));
}

Status Session::PrepareScaffold(TrainTask& task) {
  const std::vector<float> zeros(num_params_, 0.0f);
  if (!variate_) {
    if (variate_path_.empty()) {
      variate_ = ClientVariate{0, zeros, zeros, RunId()};
    } else {
      COHORT_ASSIGN_OR_RETURN(ClientVariate loaded, LoadControlVariate(variate_path_, num_params_));
      if (loaded.round > 0 && loaded.run == RunId()) {
        env_->Log().info("SCAFFOLD: control variate c_i from {} (last update in round {})",
                         variate_path_, loaded.round);
      }
      variate_ = std::move(loaded);
    }
  }
  if (variate_->run != RunId()) {
    // Another run's c_i (or one from before files named their run): this
    // run's c started at zero, and so does its c_i.
    if (variate_->round > 0) {
      env_->Log().warn(
          "SCAFFOLD: the control variate c_i {}is another run's (its last update was in that "
          "run's round {}); run {} starts c_i at zero",
          variate_path_.empty() ? "" : "in " + variate_path_ + " ", variate_->round,
          Printable(run_name_));
    }
    variate_ = ClientVariate{0, zeros, zeros, RunId()};
    variate_task_ = 0;
  }
  task.client_variate = variate_->For(task.round);
  task.options.scaffold_correction.resize(num_params_);
  for (size_t j = 0; j < num_params_; ++j) {
    task.options.scaffold_correction[j] = task.server_variate[j] - task.client_variate[j];
  }
  return OkStatus();
}

Status Session::AdvanceVariate(const TrainTask& task, const train::TrainResult& result,
                               std::span<const float> local, std::vector<float>& delta_c) {
  ClientVariate next{task.round, task.client_variate, std::vector<float>(num_params_), RunId()};
  delta_c.resize(num_params_);
  COHORT_RETURN_IF_ERROR(aggregation::ScaffoldClientVariate(
      task.global, local, task.server_variate, task.client_variate, result.steps,
      task.options.optimizer.learning_rate, next.after, delta_c));
  // An earlier update's refusal that came while this task trained
  // (RollBackVariate) moved c_i back under it: Δc_i = -c + (x - y) / (K lr)
  // does not depend on c_i, so the change goes onto the c_i this round
  // should have started from, and only its correction was off.
  if (variate_ && variate_->For(task.round) != task.client_variate) {
    next.before = variate_->For(task.round);
    for (size_t j = 0; j < num_params_; ++j) next.after[j] = next.before[j] + delta_c[j];
  }
  // Kept before it is sent: a client that restarts after sending goes on
  // from the c_i its update counted.
  if (!variate_path_.empty()) COHORT_RETURN_IF_ERROR(SaveControlVariate(variate_path_, next));
  variate_ = std::move(next);
  variate_task_ = task.task_id;
  return OkStatus();
}

void Session::RollBackVariate(uint64_t task_id) {
  if (!variate_ || task_id == 0 || task_id != variate_task_) return;
  ClientVariate back = *variate_;
  back.after = back.before;
  if (!variate_path_.empty()) {
    if (Status saved = SaveControlVariate(variate_path_, back); !saved.ok()) {
      // As AdvanceVariate: memory and file stay as they were, together.
      env_->Log().error("SCAFFOLD: cannot take back round {}'s c_i change: {}", back.round,
                        saved.message());
      return;
    }
  }
  variate_ = std::move(back);
  variate_task_ = 0;  // Taken back once.
  env_->Log().warn(
      "SCAFFOLD: round {}'s update did not count, so c_i goes back to what the round trained "
      "from",
      variate_->round);
}

void Session::DropUnsentInput() {
  // The session of the task that comes now (started by its SecAggStart)
  // has made no update yet: RollBackVariate leaves it.
  if (secagg_ && !secagg_->input_sent) RollBackVariate(secagg_->task_id);
}

void Session::LeaveTaskSaying(uint32_t round, uint64_t task_id, const std::string& why,
                              Actions& a) {
  env_->Log().error("round {}: {}; leaving the round", round, why);
  a.printed.push_back("round " + std::to_string(round) + ": " + why + "; leaving the round");
  if (secagg_ && secagg_->task_id == task_id) secagg_.reset();
  wire::Header h = Header();
  h.mutable_goodbye()->set_task_id(task_id);
  h.mutable_goodbye()->set_reason(why);
  a.send.push_back({std::move(h), {}, {}});
}

void Session::WarnAboutClipping(uint32_t round, std::span<const float> local,
                                std::span<const float> global, float clip, double loss) const {
  size_t clipped = 0;
  float largest = 0;
  const size_t n = global.empty() ? local.size() : std::min(local.size(), global.size());
  for (size_t i = 0; i < n; ++i) {
    const float d = std::fabs(global.empty() ? local[i] : local[i] - global[i]);
    if (d > clip) {
      ++clipped;
      largest = std::max(largest, d);
    }
  }
  if (clipped > 0) {
    env_->Log().warn(
        "round {}: secagg.clip {} clipped {} of {} update values (the largest was {:.4g}): the "
        "sum holds the clipped values; raise secagg.clip or lower train.learning_rate",
        round, clip, clipped, local.size(), largest);
  }
  if (loss > aggregation::kMaxSecureLoss) {
    env_->Log().warn(
        "round {}: training loss {:.4f} is above {}, the most a secure sum carries: the "
        "coordinator counts it as {} in its train_loss",
        round, loss, aggregation::kMaxSecureLoss, aggregation::kMaxSecureLoss);
  }
}

StatusOr<double> Session::FedNovaNormOf(const TrainTask& task,
                                        const train::TrainResult& result) const {
  if (result.steps == 0) {
    return InvalidArgumentError(
        "train.fednova: the trainer reports no local steps (a Python fit must return "
        "metrics['steps']), so the update has no normaliser");
  }
  // The coordinator refuses more steps than its native trainer takes on
  // this client's samples (a model.external run's fits count their own).
  const uint64_t most =
      aggregation::FedNovaMaxSteps(task.options.epochs, task.options.batch_size, num_samples_);
  if (!model_config_.has_external() && result.steps > most) {
    return InvalidArgumentError(fmt::format(
        "train.fednova: {} steps, more than the {} of train.local_epochs {} x ceil({} samples / "
        "train.batch_size {}), the most the coordinator accepts (a Python fit must batch by "
        "task.batch_size over the num_samples it declared)",
        result.steps, most, task.options.epochs, num_samples_, task.options.batch_size));
  }
  const double norm = aggregation::FedNovaNorm(result.steps, task.options.optimizer.momentum);
  if (!(norm >= 1 && norm <= aggregation::kMaxFedNovaNorm)) {
    return InvalidArgumentError(fmt::format(
        "train.fednova: {} steps with momentum {:g} give the normaliser {:g}, above the {:g} an "
        "update carries; lower train.local_epochs or raise train.batch_size",
        result.steps, task.options.optimizer.momentum, norm, aggregation::kMaxFedNovaNorm));
  }
  return norm;
}

bool Session::SecureDelta(const TrainTask& task, std::span<const float> local, double fednova_norm,
                          std::vector<float>& sent) const {
  std::span<const float> before = task.global;
  if (fednova_norm > 0) {
    sent.resize(local.size());
    if (!aggregation::NormaliseDelta(local, task.global, fednova_norm, sent)) return false;
    before = {};
  }
  if (secagg_->l2_clip <= 0) return true;
  std::vector<float> bounded;
  const std::span<const float> after = sent.empty() ? local : std::span<const float>(sent);
  if (!BoundNorm(task.round, after, before, bounded)) return false;
  if (!bounded.empty()) sent = std::move(bounded);
  return true;
}

size_t Session::SecureSlots(const train::TrainResult& result,
                            const std::optional<train::EvalResult>& eval, double fednova_norm,
                            std::span<float> slots) const {
  const float clip = secagg_->fixed_point.clip;
  // Under distributed DP only the noised delta (and its count word) is what
  // the coordinator may learn: the metric and evaluation slots, means of
  // this client's data no noise covers, stay zero whatever the setup asks.
  const bool noised = secagg_->dp_scale > 0;
  if (!noised) {
    aggregation::MetricsToSlots({result.mean_loss, result.accuracy, result.seconds}, clip,
                                slots.first(aggregation::kSecureMetricSlots));
  }
  size_t n = aggregation::kSecureMetricSlots;
  if (secagg_->eval_slots) {
    if (eval && !noised) {
      aggregation::EvalToSlots(eval->samples, num_samples_, eval->loss, eval->accuracy, clip,
                               slots.subspan(n, aggregation::kSecureEvalSlots));
    }
    n += aggregation::kSecureEvalSlots;
  }
  if (secagg_->fednova_slot) slots[n++] = aggregation::FedNovaToSlot(fednova_norm, clip);
  return n;
}

void Session::SendSecureUpdate(const TrainTask& task, const train::TrainResult& result,
                               const std::optional<train::EvalResult>& eval,
                               std::span<const float> local, double fednova_norm,
                               std::span<const float> delta_c, TimeMs now, Actions& a) {
  // FedNova's normalisation, then the norm bound (secagg.l2_clip), then the
  // per-coordinate clip of the encoding: the warning counts what the
  // encoding will clip.
  std::vector<float> bounded;
  if (!SecureDelta(task, local, fednova_norm, bounded)) {
    Refuse(InvalidArgumentError("local update has NaN or Inf"), a);
    return;
  }
  // The metrics (and the rest) ride in the masked vector, after the delta:
  // the coordinator learns only their weighted means.
  float slots[aggregation::kSecureMetricSlots + aggregation::kSecureEvalSlots +
              aggregation::kSecureFedNovaSlots] = {};
  const size_t num_slots = SecureSlots(result, eval, fednova_norm, slots);
  // Weighted, clipped and rounded to the fixed-point grid, straight from
  // the two models (no float copy of the delta); the rounding draws from
  // its own RNG, never from the mask PRG.
  // Adaptive clipping under distributed DP: the bit's word after the delta.
  const size_t count_words = secagg_->dp_count_scale > 0 ? 1 : 0;
  std::vector<uint32_t> encoded(local.size() + count_words + num_slots);
  Rng rng(DeriveSeed(secagg_->train_seed, 0xf17ed));
  // The coordinator cannot check a masked vector, so the client does: a
  // diverged update leaves the round (a dropout) instead of being encoded.
  const std::span<const float> tail(slots, num_slots);
  if (secagg_->dp_scale > 0
          ? !EncodeDistributedDp(task, local, tail, rng, encoded, a)
          : !EncodeFixedPointInput(task, local, bounded, tail, result.mean_loss, rng, encoded, a)) {
    return;
  }
  // Counted before it can leave: once masked and sent, the coordinator can
  // unmask it through the other clients' shares, without asking this one.
  if (secagg_->dp_scale > 0 && !RecordDpContribution(task.round, a)) return;
  if (secagg_->variate_weight > 0) {
    if (delta_c.size() != local.size()) {
      Refuse(InvalidArgumentError("train.scaffold: the setup expects the control variate's change"),
             a);
      return;
    }
    InsertVariate(task.round, delta_c, rng, encoded);
  }
  if (observer_) observer_(task.round, encoded);
  secagg_->input = std::move(encoded);
  wire::Update masked;
  masked.set_round(task.round);
  masked.set_task_id(task.task_id);
  masked.set_num_samples(num_samples_);
  masked.set_masked(true);
  secagg_->update = masked;
  if (secagg_->checked_in) SendMaskedInput(now, a);
}

bool Session::EncodeFixedPointInput(const TrainTask& task, std::span<const float> local,
                                    std::vector<float>& bounded, std::span<const float> tail,
                                    double loss, Rng& rng, std::vector<uint32_t>& encoded,
                                    Actions& a) {
  WarnAboutClipping(task.round, bounded.empty() ? local : bounded,
                    bounded.empty() ? task.global : std::span<const float>(),
                    secagg_->fixed_point.clip, loss);
  if (!bounded.empty()) {
    // Clipped: the scaled delta and the slots, encoded as one vector.
    bounded.insert(bounded.end(), tail.begin(), tail.end());
    aggregation::EncodeFixedPoint(bounded, secagg_->weight, secagg_->fixed_point, rng, encoded);
  } else if (!aggregation::EncodeDelta(local, task.global, tail, secagg_->weight,
                                       secagg_->fixed_point, rng, encoded)) {
    Refuse(InvalidArgumentError("local update has NaN or Inf"), a);
    return false;
  }
  return true;
}

bool Session::EncodeDistributedDp(const TrainTask& task, std::span<const float> local,
                                  std::span<const float> tail, Rng& rng,
                                  std::vector<uint32_t>& encoded, Actions& a) {
  std::vector<float> delta(local.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = local[i] - task.global[i];
  // A fresh secret per round: a seed anyone else could derive (the run
  // seed's) would let them subtract this client's noise from the sum.
  SecretBytes seed(privacy::SkellamSampler::kSeedBytes);
  env_->RandomBytes(seed.bytes());
  auto sampler = privacy::SkellamSampler::Create(std::move(seed));
  Status encoded_ok = sampler.ok() ? privacy::EncodeSkellam(
                                         delta, secagg_->dp_clip_norm, secagg_->dp_scale,
                                         secagg_->dp_l2_bound, secagg_->dp_share_variance, rng,
                                         *sampler, std::span<uint32_t>(encoded).first(delta.size()))
                                   : sampler.status();
  if (!encoded_ok.ok()) {
    Refuse(encoded_ok, a);
    return false;
  }
  size_t next = delta.size();
  if (secagg_->dp_count_scale > 0) {
    // Adaptive clipping's bit, against the C the delta was clipped at, with
    // its own noise share from the same secret stream.
    const bool unclipped = privacy::WithinL2Norm(delta, secagg_->dp_clip_norm);
    encoded[next++] = privacy::EncodeClipBit(unclipped, secagg_->dp_count_scale,
                                             secagg_->dp_count_share_variance, *sampler);
  }
  // The slots: weighted means in fixed point, as without distributed DP.
  aggregation::EncodeFixedPoint(tail, secagg_->weight, secagg_->fixed_point, rng,
                                std::span<uint32_t>(encoded).subspan(next));
  env_->Log().info(
      "round {}: distributed DP: update clipped to L2 norm {:g} and noised with Skellam of "
      "variance {:.6g} per coordinate (std {:.4g} units) before masking",
      task.round, secagg_->dp_clip_norm, secagg_->dp_share_variance,
      std::sqrt(secagg_->dp_share_variance) / secagg_->dp_scale);
  return true;
}

Status Session::DpRepeatError(uint32_t round) const {
  return FailedPreconditionError("already contributed a noised update to round " +
                                 std::to_string(round) + " of run " + Printable(run_name_) +
                                 ": refusing a repeat, which would let the coordinator average "
                                 "away the noise");
}

Status Session::DpBudgetError(uint32_t round) const {
  return ResourceExhaustedError(
      "this client has noised " + std::to_string(dp_max_rounds_) +
      " updates, the most --dp-max-rounds allows: refusing round " + std::to_string(round) +
      " of run " + Printable(run_name_) +
      " (the cap holds whatever a coordinator numbers or names its rounds)");
}

namespace {

// Never reset: an empty ledger would hand every noised round out again.
Status UnreadableLedger(const Status& s) {
  return FailedPreconditionError(
      s.message() +
      "; this client noises no update until its operator repairs or removes the file "
      "(removing it forgets which rounds were noised)");
}

}  // namespace

Status Session::CheckDpLedger(uint32_t round) const {
  StatusOr<bool> contains = dp_ledger_.Contains(RunId(), round);
  if (!contains.ok()) return UnreadableLedger(contains.status());
  if (*contains) return DpRepeatError(round);
  if (dp_max_rounds_ == 0) return OkStatus();
  StatusOr<size_t> total = dp_ledger_.Total();
  if (!total.ok()) return UnreadableLedger(total.status());
  return *total >= dp_max_rounds_ ? DpBudgetError(round) : OkStatus();
}

bool Session::RecordDpContribution(uint32_t round, Actions& a) {
  StatusOr<size_t> recorded = dp_ledger_.Record(RunId(), round, dp_max_rounds_);
  if (recorded.status().code() == StatusCode::kAlreadyExists) {
    Refuse(DpRepeatError(round), a);
    return false;
  }
  if (recorded.status().code() == StatusCode::kResourceExhausted) {
    Refuse(DpBudgetError(round), a);
    return false;
  }
  if (!recorded.ok()) {
    Refuse(FailedPreconditionError(recorded.status().message() +
                                   "; the noised update is not sent, since it could not be "
                                   "counted"),
           a);
    return false;
  }
  env_->Log().info(
      "round {}: distributed DP: counted in {} ({} rounds of run {} noised so far)", round,
      dp_ledger_.path().empty() ? "this process's ledger (no --state-dir)" : dp_ledger_.path(),
      *recorded, Printable(run_name_));
  return true;
}

void Session::InsertVariate(uint32_t round, std::span<const float> delta_c, Rng& rng,
                            std::vector<uint32_t>& encoded) const {
  WarnAboutClipping(round, delta_c, {}, secagg_->fixed_point.clip, 0);
  // [delta | Δc_i | slots]: Δc_i weighed by 1 / n, not n_i / W, so the
  // coordinator decodes its unweighted sum (aggregation/scaffold.h).
  std::vector<uint32_t> variate(delta_c.size());
  aggregation::EncodeFixedPoint(delta_c, secagg_->variate_weight, secagg_->fixed_point, rng,
                                variate);
  encoded.insert(encoded.begin() + static_cast<ptrdiff_t>(delta_c.size()), variate.begin(),
                 variate.end());
}

bool Session::BoundNorm(uint32_t round, std::span<const float> after, std::span<const float> before,
                        std::vector<float>& bounded) const {
  std::vector<float> delta(after.size()), zeros;
  if (before.empty()) {
    zeros.resize(after.size());
    before = zeros;
  }
  const double norm = aggregation::BoundL2Norm(after, before, secagg_->l2_clip, delta);
  if (!std::isfinite(norm)) return false;
  if (norm <= secagg_->l2_clip) return true;  // Encoded from the models as it is.
  env_->Log().info(
      "round {}: secagg.l2_clip {} scaled the update (L2 norm {:.4g}) by {:.4g} before "
      "masking",
      round, secagg_->l2_clip, norm, secagg_->l2_clip / norm);
  bounded = std::move(delta);
  return true;
}

void Session::SendPlainUpdate(const TrainTask& task, const train::TrainResult& result,
                              const std::optional<train::EvalResult>& eval,
                              std::span<const float> local, double fednova_norm,
                              std::span<const float> delta_c, TimeMs now, Actions& a) {
  std::vector<float> delta(local.begin(), local.end());
  if (fednova_norm > 0) {
    // A delta that is not finite goes as it is: the coordinator refuses it.
    (void)aggregation::NormaliseDelta(local, task.global, fednova_norm, delta);
  } else {
    for (size_t i = 0; i < delta.size(); ++i) delta[i] -= task.global[i];
  }
  wire::Header h = Header();
  wire::Update& update = *h.mutable_update();
  update.set_round(task.round);
  update.set_task_id(task.task_id);
  update.set_num_samples(num_samples_);
  update.set_train_loss(result.mean_loss);
  update.set_train_accuracy(result.accuracy);
  update.set_train_seconds(result.seconds);
  if (eval && eval->samples > 0) {
    update.set_eval_samples(eval->samples);
    update.set_eval_loss(eval->loss);
    update.set_eval_accuracy(eval->accuracy);
  }
  if (fednova_norm > 0) update.set_fednova_norm(fednova_norm);
  delta.insert(delta.end(), delta_c.begin(), delta_c.end());  // SCAFFOLD: [delta | Δc_i].
  Send(std::move(h), std::move(delta), now, a);
}

void Session::OnWelcome(const wire::Welcome& w, Actions& a) {
  if (num_params_ == 0) {
    auto built = build_model_(w.model());
    if (!built.ok()) {  // Its message may quote the coordinator's config.
      a.exit =
          Status(built.status().code(), Printable(std::string(built.status().message()), 1024));
      return;
    }
    num_params_ = *built;
    model_config_ = w.model();
  } else if (aggregation::CanonicalBytes(w.model()) != aggregation::CanonicalBytes(model_config_)) {
    // A coordinator that restarted under another model (its resume check
    // allows none, so another run): this client trains the one it built.
    a.exit = FailedPreconditionError(
        "welcome: the coordinator's model config differs from the one this client built its "
        "model from (did the coordinator restart with another config?): restart the client to "
        "build the new model");
    return;
  }
  if (w.num_params() != num_params_) {
    a.exit =
        FailedPreconditionError("coordinator's model has " + std::to_string(w.num_params()) +
                                " parameters, the local build has " + std::to_string(num_params_));
    return;
  }
  if (std::isfinite(w.heartbeat_s()) && w.heartbeat_s() > 0) {
    heartbeat_ms_ = std::clamp<TimeMs>(static_cast<TimeMs>(w.heartbeat_s() * 1000), 50, 60000);
  }
  if (w.run_nonce().size() > kMaxRunNonceBytes) {
    a.exit = InvalidArgumentError("welcome: run_nonce has " + std::to_string(w.run_nonce().size()) +
                                  " bytes, at most " + std::to_string(kMaxRunNonceBytes));
    return;
  }
  if (!welcomed_) {
    env_->Log().info("registered with run {} (nonce {})", Printable(w.run_name()),
                     Printable(w.run_nonce()));
  } else if (w.run_name() != run_name_ || w.run_nonce() != run_nonce_) {
    // Distributed DP's ledger counts the rounds of another run apart: say so
    // (a coordinator that changes its nonce gets fresh ledger entries, as
    // one that renames its run does; --dp-max-rounds still holds).
    env_->Log().warn(
        "the coordinator now names run {} (nonce {}), not {} (nonce {}): its rounds count as "
        "another run's in the ledger of noised rounds",
        Printable(w.run_name()), Printable(w.run_nonce()), Printable(run_name_),
        Printable(run_nonce_));
  }
  run_name_ = w.run_name();
  run_nonce_ = w.run_nonce();
  welcomed_ = true;
}

// Whether this client takes task `t` (checked, and not one it already has).
bool Session::AcceptTask(const wire::RoundTask& t, const net::Envelope& env, Actions& a) {
  if (num_params_ == 0) {
    env_->Log().warn("task before welcome; ignored");
    return false;
  }
  if ((running_ && running_->task_id == t.task_id()) || last_completed_task_ == t.task_id()) {
    return false;  // A re-sent task we already have.
  }
  Status ok = CheckTask(t, env, num_params_);
  if (ok.ok()) ok = CheckFedNovaTask(t);
  if (ok.ok()) ok = CheckScaffoldTask(t);
  if (!ok.ok()) {
    env_->Log().warn("round {}: bad task ignored: {}", t.round(), ok.message());
    return false;
  }
  if (!t.has_secagg() && (require_secure_ || !peers_.empty())) {
    env_->Log().warn("round {}: refused a task without secure aggregation", t.round());
    a.printed.push_back("refused round " + std::to_string(t.round()) +
                        ": its update would travel in the clear, and this client requires "
                        "secure aggregation (--require-secure, --peers or --dp-noise-multiplier)");
    return false;
  }
  return true;
}

// A secure task joins (or starts) its secure-aggregation session; false when
// the session was refused or left, so training would be for nothing.
bool Session::BindSecureTask(const wire::RoundTask& t, const net::Envelope& env, TimeMs now,
                             Actions& a) {
  // Usually the key exchange began with SecAggStart; else start it now.
  const bool started_early = secure_task_ == t.task_id();
  if (!started_early) {
    StartSecureTask(t.round(), t.task_id(), t.secagg(), t.train().scaffold(), now, a);
  }
  if (!secagg_ || secagg_->task_id != t.task_id()) return false;
  if (started_early && t.train().scaffold()) {
    // SecAggStart does not say that the vector carries the variate's change.
    Refuse(InvalidArgumentError("a train.scaffold task's secure session starts with its task, "
                                "not with SecAggStart"),
           a);
    return false;
  }
  if (started_early && t.secagg().SerializeAsString() != secagg_->setup) {
    Refuse(InvalidArgumentError("the task's secagg setup differs from SecAggStart's"), a);
    return false;
  }
  if (t.round() != secagg_->round) {
    // The context (and the ledger's check) took the session's round.
    Refuse(
        InvalidArgumentError("a task of round " + std::to_string(t.round()) +
                             " for the secure session of round " + std::to_string(secagg_->round)),
        a);
    return false;
  }
  // The session's signed context binds one task digest for every client:
  // the model this client built, the settings and the parameters. A task
  // other than that one could be a coordinator's way to make every other
  // client's update zero, so that the sum would be this one's.
  if (aggregation::TaskDigest(model_config_, t.train(), t.evaluate(), env.payloads[0]) !=
      secagg_->task_digest) {
    Refuse(InvalidArgumentError(
               "the task's model or training settings are not the ones its secure session "
               "binds for every client (its task digest differs), so the sum might not mix this "
               "update with the others"),
           a);
    return false;
  }
  secagg_->train_seed = t.train_seed();
  return true;
}

void Session::OnTask(const wire::RoundTask& t, const net::Envelope& env, TimeMs now, Actions& a) {
  if (!AcceptTask(t, env, a)) return;
  TrainTask task;
  task.round = t.round();
  task.task_id = t.task_id();
  task.global.assign(env.payloads[0].begin(), env.payloads[0].begin() + num_params_);
  task.options.epochs = t.train().local_epochs();
  task.options.batch_size = t.train().batch_size();
  task.options.optimizer = train::OptimizerFromConfig(t.train());
  task.options.seed = t.train_seed();
  task.evaluate = t.evaluate();
  task.fednova = t.train().fednova();
  task.scaffold = t.train().scaffold();
  env_->Log().info("round {}: task received", t.round());
  DropUnsentInput();
  if (task.scaffold) {
    task.server_variate.assign(env.payloads[0].begin() + num_params_, env.payloads[0].end());
    if (Status ready = PrepareScaffold(task); !ready.ok()) {
      LeaveTaskSaying(t.round(), t.task_id(), std::string(ready.message()), a);
      return;
    }
  }
  if (t.has_secagg()) {
    if (!BindSecureTask(t, env, now, a)) return;
  } else {
    secagg_.reset();
    secure_task_ = 0;
  }
  task.secure = t.has_secagg();
  a.cancel_training = running_.has_value();
  running_ = task;
  a.train = std::move(task);
}

void Session::OnSecAggStart(const wire::SecAggStart& st, TimeMs now, Actions& a) {
  if (num_params_ == 0) {
    env_->Log().warn("secagg start before welcome; ignored");
    return;
  }
  if (st.round() == 0 || secure_task_ == st.task_id() ||
      (running_ && running_->task_id == st.task_id()) || last_completed_task_ == st.task_id()) {
    return;  // Bad, or a session this client already has.
  }
  env_->Log().info("round {}: secure aggregation starts ({} clients, index {})", st.round(),
                   st.setup().n(), st.setup().index());
  // A new round: whatever was still training is obsolete.
  a.cancel_training = running_.has_value();
  running_.reset();
  DropUnsentInput();
  StartSecureTask(st.round(), st.task_id(), st.setup(), /*scaffold=*/false, now, a);
}

void Session::OnError(const wire::Error& e, TimeMs now, Actions& a) {
  if (e.code() == wire::UNKNOWN_CLIENT) {
    env_->Log().info("coordinator does not know this client (restarted?); registering again");
    welcomed_ = false;
    SendHello(now, a);
  } else {
    env_->Log().warn("coordinator error (round {}): {}", e.round(), Printable(e.message(), 1024));
    RollBackVariate(e.task_id());
  }
}

void Session::OnFinished(const wire::Finished& f, TimeMs now, Actions& a) {
  env_->Log().info("run finished after {} rounds", f.rounds());
  // Acknowledge, so the coordinator can close without waiting.
  wire::Header ack = Header();
  ack.mutable_heartbeat()->set_finished(true);
  Send(std::move(ack), {}, now, a);
  a.cancel_training = running_.has_value();
  running_.reset();
  finished_ = true;
  a.exit = OkStatus();
}

Actions Session::OnMessage(const net::Envelope& env, TimeMs now) {
  Actions a;
  last_heard_ = now;
  const wire::Header& h = env.header;
  switch (h.body_case()) {
    case wire::Header::kWelcome:
      OnWelcome(h.welcome(), a);
      break;
    case wire::Header::kTask:
      OnTask(h.task(), env, now, a);
      break;
    case wire::Header::kHeartbeatAck:
      break;
    case wire::Header::kSecaggStart:
      OnSecAggStart(h.secagg_start(), now, a);
      break;
    case wire::Header::kSecaggSeed:
    case wire::Header::kSecaggKeys:
    case wire::Header::kSecaggShares:
    case wire::Header::kSecaggChecked:
    case wire::Header::kSecaggConfirm:
    case wire::Header::kSecaggSurvivors:
    case wire::Header::kSecaggUnmaskRequest:
      OnSecAggMessage(h, now, a);
      break;
    case wire::Header::kError:
      OnError(h.error(), now, a);
      break;
    case wire::Header::kReject:
      a.cancel_training = running_.has_value();
      running_.reset();
      a.exit = FailedPreconditionError("coordinator rejected this client: " +
                                       Printable(h.reject().reason(), 1024));
      break;
    case wire::Header::kFinished:
      OnFinished(h.finished(), now, a);
      break;
    default:
      env_->Log().warn("ignored unexpected {} message from the coordinator", net::BodyName(h));
      break;
  }
  outgoing_.Apply(a);
  return a;
}

}  // namespace cohort::client

namespace cohort::client {
namespace {

constexpr uint32_t kMaxCohort = 1u << 20;
// With --peers, a cohort must keep this many honest clients besides this
// one even if every colluder of the allowlist is in it: the sum then mixes
// this client's input with at least two others.
constexpr int kMinHonestOthers = 2;

}  // namespace

void Session::StartSecureTask(uint32_t round, uint64_t task_id, const wire::SecAggSetup& setup,
                              bool scaffold, TimeMs now, Actions& a) {
  secagg_.reset();
  // From here on this task never sends a plaintext update.
  secure_task_ = task_id;
  if (setup.dp_scale() != 0) {
    // Refused before the key exchange and the training; the count that
    // binds is taken again when the noised input is made.
    if (Status fresh = CheckDpLedger(round); !fresh.ok()) {
      LeaveTaskSaying(round, task_id, std::string(fresh.message()), a);
      return;
    }
  }
  Status started = StartSecAgg(round, task_id, setup, scaffold, now, a);
  if (!started.ok()) {
    env_->Log().warn("round {}: refused the task: {}", round, started.message());
    a.printed.push_back("secagg refused in round " + std::to_string(round) + ": " +
                        started.message());
    secagg_.reset();
  }
}

Status Session::CheckRoster(const aggregation::SecAggSetup& s) const {
  // A key at two indices, or outside --peers, would let the coordinator fill
  // this client's neighbourhood with copies of its colluders: with --peers
  // every key is checked, not only the ones this client will meet.
  if (s.roster.size() != s.n) {
    return InvalidArgumentError("secagg setup: " + std::to_string(s.roster.size()) +
                                " roster keys for a cohort of " + std::to_string(s.n) +
                                " (--peers needs them all)");
  }
  for (uint32_t i = 0; i < s.n; ++i) {
    if (!std::binary_search(peers_.begin(), peers_.end(), s.roster[i])) {
      return InvalidArgumentError("secagg setup: identity " + std::to_string(i) +
                                  " is not one of this client's --peers");
    }
  }
  if (aggregation::RosterTree(s.roster).root() != s.roster_root) {
    return InvalidArgumentError("secagg setup: the roster keys do not match the roster root");
  }
  std::vector<crypto::Ed25519Public> keys = s.roster;
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) {
    return InvalidArgumentError("secagg setup: an identity key appears twice in the cohort");
  }
  return OkStatus();
}

StatusOr<double> Session::CorruptBound(const aggregation::SecAggSetup& s) const {
  if (s.n < 2 || s.n > kMaxCohort || s.index >= s.n) {
    return InvalidArgumentError("secagg setup: inconsistent n or index");
  }
  if (!(s.corrupt_fraction >= 0 && s.corrupt_fraction < 0.5)) {
    return InvalidArgumentError("secagg setup: corrupt fraction outside [0, 0.5)");
  }
  // The threshold must hold against this client's own idea of how many may
  // collude with the coordinator, not only the coordinator's. With --peers
  // that is a number of clients: the coordinator picks the cohort, and could
  // fill it with every corrupt one of the allowlist.
  double corrupt = std::max<double>(s.corrupt_fraction, min_corrupt_fraction_);
  if (!peers_.empty()) {
    const double in_allowlist = std::ceil(corrupt * static_cast<double>(peers_.size()) - 1e-9);
    if (static_cast<double>(s.n) - 1 - in_allowlist < kMinHonestOthers) {
      return FailedPreconditionError(fmt::format(
          "secagg setup: a cohort of {} could hold {} colluding client{} of the {} in --peers "
          "(corrupt fraction {:g}) and fewer than {} honest ones besides this client (a larger "
          "cohort, or --corrupt-fraction 0 and the run's secagg.corrupt_fraction 0 to trust that "
          "none colludes with the coordinator)",
          s.n, static_cast<int>(in_allowlist), in_allowlist == 1 ? "" : "s", peers_.size(), corrupt,
          kMinHonestOthers));
    }
    corrupt = std::max(corrupt, in_allowlist / s.n);
    if (corrupt >= 0.5) {
      return FailedPreconditionError("secagg setup: a cohort of " + std::to_string(s.n) +
                                     " is too small for the colluders --peers allows");
    }
  }
  return corrupt;
}

namespace {

// The distributed-DP fields of a setup: all 0, or finite, positive and a
// grid on which n inputs within the L2 bound fit 31 bits. The noise share
// is the coordinator's to size (docs/privacy.md: a client cannot check
// it against a target it does not hold).
Status CheckDistributedDpSetup(const aggregation::SecAggSetup& s) {
  if (s.dp_scale == 0 && s.dp_clip_norm == 0 && s.dp_l2_bound == 0 && s.dp_share_variance == 0) {
    return OkStatus();
  }
  const bool finite = std::isfinite(s.dp_scale) && std::isfinite(s.dp_clip_norm) &&
                      std::isfinite(s.dp_l2_bound) && std::isfinite(s.dp_share_variance);
  if (s.dp_share_variance > privacy::kMaxShareVariance) {
    // A huge variance is no noise at all (Poisson(λ) past 2^63 converts to
    // one value for both draws), so it is refused, not logged as noise.
    return InvalidArgumentError("secagg setup: distributed DP's noise variance " +
                                fmt::format("{}", s.dp_share_variance) + " is above " +
                                fmt::format("{}", privacy::kMaxShareVariance) +
                                " (2^42), where the Skellam sampler cannot draw it");
  }
  if (!finite || !(s.dp_scale > 0) || !(s.dp_clip_norm > 0) || !(s.dp_share_variance > 0) ||
      !(s.dp_l2_bound >= s.dp_scale * s.dp_clip_norm) || s.dp_l2_bound * s.n >= 2147483647.0) {
    return InvalidArgumentError(
        "secagg setup: distributed DP's scale, clip norm, L2 bound or noise variance is not "
        "finite and positive, or n inputs within the L2 bound overflow 31 bits");
  }
  return OkStatus();
}

// Adaptive clipping's count word: none (both 0), or only beside distributed
// DP's noised delta, on a whole grid S >= 1 on which n bits fit 31 bits,
// with a positive share the sampler can draw. A word without a share would
// hand the coordinator each bit through the sum of a few clients.
Status CheckClipCountSetup(const aggregation::SecAggSetup& s) {
  const double scale = s.dp_count_scale, share = s.dp_count_share_variance;
  if (scale == 0 && share == 0) return OkStatus();
  const bool grid = std::isfinite(scale) && scale >= 1 && scale == std::floor(scale) &&
                    scale * s.n < 2147483647.0;
  const bool noise = std::isfinite(share) && share > 0 && share <= privacy::kMaxShareVariance;
  if (s.dp_scale > 0 && grid && noise) return OkStatus();
  return InvalidArgumentError(fmt::format(
      "secagg setup: adaptive clipping's count word (grid {:g}, noise share {:g}) needs "
      "distributed DP's noised delta, a whole grid >= 1 on which {} bits fit 31 bits, and a "
      "noise share in (0, 2^42]",
      scale, share, s.n));
}

}  // namespace

// With the count word, the pinned client checks the pair as Andrew et al.
// charge it: the update's noise multiplier over the cohort z_Δ = √(n V_Δ/m)
// / (s C) and the count's σ_b = √(n V_b/m) / S must satisfy
// z_Δ^-2 + (2 σ_b)^-2 <= Z^-2, what the update alone at Z spends.
Status Session::CheckDpCountShare(const aggregation::SecAggSetup& s) const {
  if (dp_noise_multiplier_ <= 0 || s.dp_count_scale == 0) return OkStatus();
  const double n = static_cast<double>(s.n);
  const double z_update = std::sqrt(n * s.dp_share_variance) / (s.dp_scale * s.dp_clip_norm);
  const double count_stddev = std::sqrt(n * s.dp_count_share_variance) / s.dp_count_scale;
  const double spent = 1 / (z_update * z_update) + 1 / (4 * count_stddev * count_stddev);
  const double allowed = 1 / (dp_noise_multiplier_ * dp_noise_multiplier_);
  if (spent <= allowed * (1 + 1e-9)) return OkStatus();
  return FailedPreconditionError(fmt::format(
      "secagg setup: adaptive clipping's count word carries too little noise for this client's "
      "noise multiplier {:g}: over a cohort of {} the update's noise multiplier is {:.6g} and the "
      "count's standard deviation {:.6g}, together noise multiplier {:.6g} (Andrew et al.: "
      "z_update^-2 + (2 sigma_count)^-2 must not exceed {:g}^-2)",
      dp_noise_multiplier_, s.n, z_update, count_stddev, 1 / std::sqrt(spent),
      dp_noise_multiplier_));
}

Status Session::CheckDpCohort(const aggregation::SecAggSetup& s) const {
  if (dp_noise_multiplier_ <= 0) return OkStatus();
  if (s.dp_scale == 0) {
    return FailedPreconditionError(fmt::format(
        "secagg setup: this client insists on distributed DP's noise (--dp-noise-multiplier "
        "{:g}) and the round's setup carries none",
        dp_noise_multiplier_));
  }
  // The grid: the rounded update's L2 bound is the sensitivity the noise
  // covers; an honest coordinator keeps it within 2 s C (privacy/skellam.cc),
  // so the noise is at least half the pinned multiplier times it.
  const double scaled_clip = s.dp_scale * s.dp_clip_norm;
  if (!(scaled_clip >= 1) || !(s.dp_l2_bound <= 2 * scaled_clip * (1 + 1e-9))) {
    return FailedPreconditionError(fmt::format(
        "secagg setup: the grid's L2 bound {:.6g} is above twice the scaled clip norm {:.6g} (or "
        "that is below 1): the rounding would carry more of the update than this client's noise "
        "multiplier {:g} covers",
        s.dp_l2_bound, scaled_clip, dp_noise_multiplier_));
  }
  const double target = std::pow(s.dp_scale * dp_noise_multiplier_ * s.dp_clip_norm, 2);
  // n shares of V / m carry V only when n >= m (a relative 1e-9 for the
  // coordinator's rounding of V / m).
  if (static_cast<double>(s.n) * s.dp_share_variance >= target * (1 - 1e-9)) return OkStatus();
  const double assumed = std::ceil(target / s.dp_share_variance - 1e-9);
  return FailedPreconditionError(fmt::format(
      "secagg setup: a cohort of {} is smaller than the {:.0f} survivors this round's noise share "
      "assumes (share variance {:.6g} per coordinate; this client's noise multiplier {:g} needs "
      "{:.6g} from the survivors together)",
      s.n, assumed, s.dp_share_variance, dp_noise_multiplier_, target));
}

// The fewest survivors whose noise shares together carry this client's
// noise multiplier Z (0 when none is pinned), from the two checks above:
// the update's m V_share >= (s Z C)^2 and, with the count word, Andrew et
// al.'s pair, m >= Z^2 ((s C)^2 / V_share + S^2 / (4 V_count)). Called once
// the setup passed them, so it is at most the cohort.
uint32_t Session::DpSurvivorsNeeded(const aggregation::SecAggSetup& s) const {
  if (dp_noise_multiplier_ <= 0) return 0;
  const double z2 = dp_noise_multiplier_ * dp_noise_multiplier_;
  const double grid = s.dp_scale * s.dp_clip_norm;
  const double update = grid * grid / s.dp_share_variance;
  double m = z2 * update * (1 - 1e-9);
  if (s.dp_count_scale > 0) {
    const double count = s.dp_count_scale * s.dp_count_scale / (4 * s.dp_count_share_variance);
    m = std::max(m, z2 * (update + count) / (1 + 1e-9));
  }
  return static_cast<uint32_t>(std::ceil(m));
}

// A coordinator that drops masked inputs until fewer than that survive
// would release a sum with less noise than this client's multiplier; the
// survivor list says how many inputs the sum holds, and unmasking needs t
// neighbours' signatures on it, so a client refuses to sign a short one.
Status Session::CheckDpSurvivors(size_t survivors) const {
  if (survivors >= secagg_->dp_survivors) return OkStatus();
  return FailedPreconditionError(fmt::format(
      "survivor list: {} survivor{}, fewer than the {} whose noise shares (variance {:.6g} per "
      "coordinate) together carry this client's noise multiplier {:g}; the sum would be "
      "under-noised",
      survivors, survivors == 1 ? "" : "s", secagg_->dp_survivors, secagg_->dp_share_variance,
      dp_noise_multiplier_));
}

Status Session::CheckSetupSums(const aggregation::SecAggSetup& s) const {
  if (!std::isfinite(s.clip) || s.clip <= 0 || !std::isfinite(s.scale) || s.scale < 1 ||
      !std::isfinite(s.total_weight) || s.total_weight < static_cast<double>(num_samples_)) {
    return InvalidArgumentError("secagg setup: bad clip, scale or total weight");
  }
  if (!std::isfinite(s.l2_clip) || s.l2_clip < 0) {
    return InvalidArgumentError("secagg setup: l2_clip " + fmt::format("{}", s.l2_clip) +
                                " is not a finite value >= 0");
  }
  // The whole cohort's encodings must fit 31 bits, or the sum wraps.
  if (s.scale * s.clip + s.n > 2147483647.0) {
    return InvalidArgumentError("secagg setup: scale x clip overflows 32 bits");
  }
  COHORT_RETURN_IF_ERROR(CheckDistributedDpSetup(s));
  COHORT_RETURN_IF_ERROR(CheckClipCountSetup(s));
  COHORT_RETURN_IF_ERROR(CheckDpCohort(s));
  COHORT_RETURN_IF_ERROR(CheckDpCountShare(s));
  // The roster arrives as a root and this client's proof (checked by
  // AdvertiseKeys); the keys it relies on arrive with their proofs later,
  // and the secure-aggregation client checks each against --peers and for
  // repeats.
  if (s.roster_proof.size() != crypto::MerkleDepth(s.n)) {
    return InvalidArgumentError("secagg setup: the roster proof has " +
                                std::to_string(s.roster_proof.size()) + " siblings, expected " +
                                std::to_string(crypto::MerkleDepth(s.n)));
  }
  return OkStatus();
}

Status Session::StartSecAgg(uint32_t round, uint64_t task_id, const wire::SecAggSetup& w,
                            bool scaffold, TimeMs now, Actions& a) {
  if (identity_ == nullptr) return FailedPreconditionError("no identity key to sign with");
  COHORT_ASSIGN_OR_RETURN(aggregation::SecAggSetup s, aggregation::FromWire(w));
  COHORT_ASSIGN_OR_RETURN(const double corrupt, CorruptBound(s));
  COHORT_RETURN_IF_ERROR(aggregation::CheckSecAggParams(s.n, s.k, s.t, corrupt));
  COHORT_RETURN_IF_ERROR(CheckSetupSums(s));
  if (scaffold && s.dp_scale > 0) {
    // The variate's change is (global - local) / (K lr) - c, which the
    // coordinator can invert: beside a noised update it would hand over the
    // update itself, un-noised. (The config validator never asks for both.)
    return InvalidArgumentError(
        "secagg setup: distributed DP with a train.scaffold task; the control variate's change "
        "would ride un-noised and reveal the update");
  }
  if (!peers_.empty()) COHORT_RETURN_IF_ERROR(CheckRoster(s));
  aggregation::SecAggParams params;
  params.n = s.n;
  params.k = s.k;
  params.t = s.t;
  params.length = num_params_ * (scaffold ? 2 : 1) + (s.dp_count_scale > 0 ? 1 : 0) +
                  aggregation::kSecureMetricSlots +
                  (s.eval_slots ? aggregation::kSecureEvalSlots : 0) +
                  (s.fednova_slot ? aggregation::kSecureFedNovaSlots : 0);
  params.prg = s.prg;
  params.roster = s.roster_root;
  params.context = aggregation::SecAggContext(s.nonce, round, task_id, params, s.clip, s.scale,
                                              s.total_weight, aggregation::InputRulesOf(s));
  SecAggRound r;
  r.round = round;
  r.task_id = task_id;
  r.setup = w.SerializeAsString();
  r.fixed_point = {s.clip, s.scale};
  r.weight = static_cast<double>(num_samples_) / s.total_weight;
  r.eval_slots = s.eval_slots;
  r.l2_clip = s.l2_clip;
  r.fednova_slot = s.fednova_slot;
  r.dp_clip_norm = s.dp_clip_norm;
  r.dp_scale = s.dp_scale;
  r.dp_l2_bound = s.dp_l2_bound;
  r.dp_share_variance = s.dp_share_variance;
  r.dp_count_scale = s.dp_count_scale;
  r.dp_count_share_variance = s.dp_count_share_variance;
  r.dp_survivors = DpSurvivorsNeeded(s);
  r.task_digest = s.task_digest;
  r.variate_weight = scaffold ? 1.0 / s.n : 0;
  r.stage_limit = std::min<TimeMs>(secagg_stage_limit_ms_, 2 * TimeMs{s.stage_timeout_ms} + 30000);
  r.survivors_limit =
      std::min<TimeMs>(10 * secagg_stage_limit_ms_, 2 * TimeMs{s.round_deadline_ms} + 30000);
  r.client = std::make_unique<aggregation::SecAggClient>(params, s.index, identity_,
                                                         std::move(s.roster_proof), env_);
  secagg_ = std::move(r);
  COHORT_ASSIGN_OR_RETURN(aggregation::SeedCommit commit, secagg_->client->CommitSeed());
  SendSecAgg(aggregation::ToWire(round, task_id, commit), "commitment root", now, a);
  return OkStatus();
}

void Session::SendMaskedInput(TimeMs now, Actions& a) {
  // Masked in place: the encoded input becomes the payload, no copies.
  auto masked = secagg_->client->MaskInput(std::move(*secagg_->input));
  secagg_->input.reset();
  if (!masked.ok()) {
    Refuse(masked.status(), a);
    return;
  }
  wire::Header h = Header();
  *h.mutable_update() = secagg_->update;
  last_sent_ = now;
  a.send.push_back({std::move(h), {}, std::move(masked->values)});
  secagg_->input_sent = true;
  // The survivor list waits for the others' training too.
  secagg_->awaiting = "survivor list";
  secagg_->awaiting_since = now;
  secagg_->awaiting_limit = secagg_->survivors_limit;
}

void Session::SendSecAgg(wire::Header header, const char* what, TimeMs now, Actions& a) {
  Send(std::move(header), {}, now, a);
  secagg_->awaiting = what;
  secagg_->awaiting_since = now;
  secagg_->awaiting_limit = secagg_->stage_limit;
}

namespace {

// The round and task a secure-aggregation message names; false for any
// other message.
bool SessionOf(const wire::Header& h, uint32_t& round, uint64_t& task_id) {
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      round = h.secagg_seed().round(), task_id = h.secagg_seed().task_id();
      break;
    case wire::Header::kSecaggKeys:
      round = h.secagg_keys().round(), task_id = h.secagg_keys().task_id();
      break;
    case wire::Header::kSecaggConfirm:
      round = h.secagg_confirm().round(), task_id = h.secagg_confirm().task_id();
      break;
    case wire::Header::kSecaggShares:
      round = h.secagg_shares().round(), task_id = h.secagg_shares().task_id();
      break;
    case wire::Header::kSecaggChecked:
      round = h.secagg_checked().round(), task_id = h.secagg_checked().task_id();
      break;
    case wire::Header::kSecaggSurvivors:
      round = h.secagg_survivors().round(), task_id = h.secagg_survivors().task_id();
      break;
    case wire::Header::kSecaggUnmaskRequest:
      round = h.secagg_unmask_request().round(), task_id = h.secagg_unmask_request().task_id();
      break;
    default:
      return false;
  }
  return true;
}

}  // namespace

void Session::OnSecAggMessage(const wire::Header& h, TimeMs now, Actions& a) {
  uint32_t round = 0;
  uint64_t task_id = 0;
  if (!SessionOf(h, round, task_id)) return;
  if (!secagg_ || secagg_->task_id != task_id || secagg_->round != round) {
    env_->Log().debug("ignored a {} message for a round this client is not in", net::BodyName(h));
    return;
  }
  secagg_->awaiting = nullptr;  // The wait is over; the next send starts another.
  const aggregation::SecAggParams& params = secagg_->client->params();
  auto message = aggregation::ServerMessageFromWire(h, params.n, params.k);
  if (!message.ok()) return Refuse(message.status(), a);
  if (const auto* list = std::get_if<aggregation::SurvivorList>(&*message)) {
    Status enough = CheckDpSurvivors(list->survivors.size());
    if (!enough.ok()) return Refuse(enough, a);
  }
  auto reply = secagg_->client->Handle(*message);
  if (!reply.ok()) return Refuse(reply.status(), a);
  if (!reply->has_value()) {  // Confirmed: it masks once its input is there.
    secagg_->checked_in = true;
    if (secagg_->input) SendMaskedInput(now, a);
    return;
  }
  SendReply(**reply, now, a);
}

namespace {

// What the coordinator sends next after a client's `reply` (a stage
// timeout names it), for each reply the client machine's Handle gives.
const char* AwaitedAfter(const aggregation::SecAggClientMessage& reply) {
  struct Next {
    const char* operator()(const aggregation::KeyAdvert&) { return "key list"; }
    const char* operator()(const aggregation::SealedShares&) { return "neighbours' shares"; }
    const char* operator()(const aggregation::ShareCheck&) { return "checked list"; }
    const char* operator()(const aggregation::CheckedConfirmation&) { return "confirmations"; }
    const char* operator()(const aggregation::SurvivorSignature&) { return "unmask request"; }
    // Not Handle's replies: sent at the stage's start, or with the update.
    const char* operator()(const aggregation::SeedCommit&) { return "commitment root"; }
    const char* operator()(const aggregation::MaskedInput&) { return nullptr; }
    const char* operator()(const aggregation::UnmaskResponse&) { return nullptr; }
  };
  return std::visit(Next{}, reply);
}

}  // namespace

void Session::SendReply(const aggregation::SecAggClientMessage& reply, TimeMs now, Actions& a) {
  const uint32_t round = secagg_->round;
  const uint64_t task_id = secagg_->task_id;
  if (const auto* check = std::get_if<aggregation::ShareCheck>(&reply)) {
    for (const auto& c : check->complaints) {
      env_->Log().warn("round {}: cannot open the shares of client {}: complaining", round,
                       c.about);
    }
  }
  if (const auto* response = std::get_if<aggregation::UnmaskResponse>(&reply)) {
    Send(aggregation::ToWire(round, task_id, *response), {}, now, a);
    secagg_.reset();  // Done: its secrets are wiped.
    return;
  }
  std::visit(
      [&](const auto& m) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(m)>, aggregation::MaskedInput>) {
          SendSecAgg(aggregation::ToWire(round, task_id, m), AwaitedAfter(reply), now, a);
        }
      },
      reply);
}

}  // namespace cohort::client
