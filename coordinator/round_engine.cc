#include "coordinator/round_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "aggregation/clipped_sum.h"
#include "aggregation/fednova.h"
#include "aggregation/robust.h"
#include "aggregation/scaffold.h"
#include "common/bytes.h"
#include "common/rng.h"
#include "crypto/digest.h"
#include "proto/config_io.h"

namespace cohort::coordinator {
namespace {

// The largest FedNova normaliser an honest client of `num_samples` sends:
// that of the native trainer's train.local_epochs x ceil(n /
// train.batch_size) steps (a client may take fewer, never more). A run of
// model.external trusts each fit's own count up to kMaxFedNovaNorm: its
// loader's batches are the client's.
double FedNovaNormBound(const config::RunConfig& config, uint64_t num_samples) {
  if (config.model().has_external()) return aggregation::kMaxFedNovaNorm;
  const uint64_t steps = aggregation::FedNovaMaxSteps(config.train().local_epochs(),
                                                      config.train().batch_size(), num_samples);
  return std::min(aggregation::kMaxFedNovaNorm,
                  aggregation::FedNovaNorm(steps, config.train().momentum()));
}

// An update's FedNova normaliser: in [1, bound] where a plain FedNova round
// expects one (a client of at least one step, at most FedNovaNormBound's),
// else absent (a masked update carries its own inside the sum).
Status CheckFedNovaNorm(double norm, bool expected, double bound) {
  if (!expected) {
    if (norm == 0) return OkStatus();
    return InvalidArgumentError(fmt::format(
        "update carries a FedNova normaliser (fednova_norm {:g}) where the round expects none: "
        "train.fednova is off, or the update is masked",
        norm));
  }
  // (The client computes the bound's own arithmetic; the slack is for a
  // compiler that fuses it differently.)
  if (std::isfinite(norm) && norm >= 1 && norm <= bound * (1 + 1e-12)) return OkStatus();
  return InvalidArgumentError(
      fmt::format("FedNova update's normaliser fednova_norm {:g} is not in [1, {:g}] "
                  "(train.fednova: {:g} is what train.local_epochs x ceil(samples / "
                  "train.batch_size) steps give; a client may take fewer steps, not more)",
                  norm, bound, bound));
}

// A Goodbye's reason as the dropout's: the client's words, untrusted, so at
// most 200 printable ASCII characters (others become '?').
std::string GoodbyeReason(const wire::Goodbye& goodbye) {
  constexpr size_t kMaxReason = 200;
  if (goodbye.reason().empty()) return "refused the round's secure aggregation";
  std::string reason = goodbye.reason().substr(0, kMaxReason);
  for (char& c : reason) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  if (goodbye.reason().size() > kMaxReason) reason += "...";
  return reason;
}

TimeMs SecondsToMs(float s) { return static_cast<TimeMs>(std::llround(double{s} * 1000.0)); }

// server.robust as the aggregation layer takes it (the validator has
// checked the rule and its settings).
aggregation::RobustOptions RobustOptionsOf(const config::RobustConfig& r) {
  using aggregation::RobustRule;
  aggregation::RobustOptions o;
  switch (r.rule()) {
    case config::TRIMMED_MEAN:
      o.rule = RobustRule::kTrimmedMean;
      break;
    case config::KRUM:
      o.rule = RobustRule::kKrum;
      break;
    case config::MULTI_KRUM:
      o.rule = RobustRule::kMultiKrum;
      break;
    case config::BULYAN:
      o.rule = RobustRule::kBulyan;
      break;
    default:
      o.rule = RobustRule::kMedian;
  }
  o.trim_fraction = r.trim_fraction();
  o.byzantine = r.byzantine_clients();
  o.multi_krum_m = r.multi_krum_m();
  return o;
}

// The strategy the config asks for; with train.fednova, inside FedNova's
// decorator, which `fednova` then points at; with train.scaffold, inside
// SCAFFOLD's, which `scaffold` then points at; with privacy, inside DP-FedAvg's
// decorator, which `dp` then points at (the validator never allows both).
StatusOr<std::unique_ptr<Strategy>> EngineStrategy(const config::RunConfig& config,
                                                   Evaluator evaluator, DpStrategy*& dp,
                                                   FedNovaStrategy*& fednova,
                                                   ScaffoldStrategy*& scaffold) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy,
                          MakeStrategy(config, std::move(evaluator)));
  if (config.train().scaffold()) {
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<ScaffoldStrategy> controlled,
                            ScaffoldStrategy::Wrap(std::move(strategy), config));
    scaffold = controlled.get();
    strategy = std::move(controlled);
  }
  if (config.train().fednova()) {
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<FedNovaStrategy> normalised,
                            FedNovaStrategy::Wrap(std::move(strategy), config));
    fednova = normalised.get();
    strategy = std::move(normalised);
  }
  if (!config.has_privacy()) return strategy;
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<DpStrategy> wrapped,
                          DpStrategy::Wrap(std::move(strategy), config));
  dp = wrapped.get();
  return std::unique_ptr<Strategy>(std::move(wrapped));
}

}  // namespace

StatusOr<std::unique_ptr<RoundEngine>> RoundEngine::Create(const config::RunConfig& config,
                                                           std::vector<float> init_model,
                                                           store::RunStore* store,
                                                           Evaluator evaluator,
                                                           std::string code_version, Env* env) {
  COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(config));
  std::unique_ptr<RoundEngine> engine(new RoundEngine(config, store, env));
  const bool evaluates = static_cast<bool>(evaluator);
  COHORT_ASSIGN_OR_RETURN(
      engine->strategy_, EngineStrategy(config, std::move(evaluator), engine->dp_, engine->fednova_,
                                        engine->scaffold_));
  const std::string config_text = config::ToText(config);
  COHORT_ASSIGN_OR_RETURN(std::optional<store::RunInfo> existing, store->LoadRun());
  // The config is fixed at the first committed round: before it, a start
  // with another config (or one that failed half-way) begins the run anew.
  const bool replace =
      existing.has_value() && existing->last_round == 0 && existing->config_text != config_text;
  if (!existing.has_value() || replace) {
    if (init_model.empty()) return InvalidArgumentError("initial model is empty");
    // Lineage: the config's digest, the clients it starts with (else the
    // fewest a round takes) and where the coordinator evaluates.
    const config::RoundsConfig& rc = config.rounds();
    store::RunInfo info{config_text,
                        config.seed(),
                        std::move(code_version),
                        0,
                        crypto::Sha256Hex(config_text),
                        rc.start_clients() > 0 ? rc.start_clients() : rc.min_clients(),
                        evaluates ? "cpu" : "",
                        KeptOrNewRunNonce(existing, *env)};
    engine->run_nonce_ = info.run_nonce;
    COHORT_RETURN_IF_ERROR(engine->SetUpDistributedDp(init_model.size()));
    store::Checkpoint initial{0, init_model, {}};
    engine->strategy_->SaveState(initial);
    if (replace) {
      COHORT_RETURN_IF_ERROR(store->ReplaceUncommittedRun(info, initial));
      env->Log().info(
          "the run had committed no round yet: its config is replaced by this one (a config is "
          "fixed at the first committed round)");
    } else {
      COHORT_RETURN_IF_ERROR(store->CreateRun(info, initial));
    }
    engine->global_ = std::move(init_model);
  } else {
    // Everything but the number of rounds must match: a run may be extended.
    COHORT_RETURN_IF_ERROR(config::CheckResumable(existing->config_text, config));
    COHORT_ASSIGN_OR_RETURN(store::Checkpoint cp, store->LatestCheckpoint());
    if (cp.round != existing->last_round) {
      return DataLossError("newest checkpoint is of round " + std::to_string(cp.round) +
                           " but round " + std::to_string(existing->last_round) + " was committed");
    }
    if (!init_model.empty() && cp.model.size() != init_model.size()) {
      return FailedPreconditionError("checkpoint has " + std::to_string(cp.model.size()) +
                                     " parameters, the model has " +
                                     std::to_string(init_model.size()));
    }
    COHORT_RETURN_IF_ERROR(engine->strategy_->LoadState(cp));
    engine->run_nonce_ = existing->run_nonce;
    engine->global_ = std::move(cp.model);
    engine->round_ = cp.round;
    COHORT_RETURN_IF_ERROR(engine->LoadBans());
    COHORT_RETURN_IF_ERROR(engine->SetUpDistributedDp(engine->global_.size()));
    COHORT_RETURN_IF_ERROR(engine->LoadPrivacy());
    COHORT_RETURN_IF_ERROR(engine->LoadScaffoldPopulation());
    env->Log().info("resuming run after committed round {}", cp.round);
  }
  if (engine->round_ >= config.rounds().num_rounds()) engine->phase_ = Phase::kDone;
  // Task ids only need to differ between coordinator lifetimes, so stale
  // updates from before a restart are recognised; they never touch the model.
  engine->task_counter_ = env->Random64();
  return engine;
}

RoundEngine::RoundEngine(const config::RunConfig& config, store::RunStore* store, Env* env)
    : config_(config),
      store_(store),
      clients_(SecondsToMs(config.rounds().client_timeout_s()), env),
      env_(env) {}

net::Limits RoundEngine::limits() const {
  net::Limits l;
  l.max_header_bytes = config_.net().max_header_bytes();
  // A masked update carries the training metrics after the delta.
  // Between rounds, the largest any round takes (a late update is stale).
  l.max_payload_floats = aggregator_ ? aggregator_->frame_floats() : secure_length();
  l.max_payload_frames = 1;
  // Secure-aggregation messages carry a few hundred bytes per cohort member.
  if (stage_ != aggregation::SecAggStage::kNone)
    l.max_header_bytes += size_t{256} * participants_.size();
  return l;
}

namespace {

// participants_ is sorted by name (StartRound): O(log n) a lookup.
template <typename Vector>
auto FindByName(Vector& participants, const std::string& name) -> decltype(participants.data()) {
  auto it = std::lower_bound(participants.begin(), participants.end(), name,
                             [](const auto& p, const std::string& n) { return p.name < n; });
  return it != participants.end() && it->name == name ? &*it : nullptr;
}

}  // namespace

RoundEngine::Participant* RoundEngine::FindParticipant(const std::string& name) {
  return FindByName(participants_, name);
}

void RoundEngine::Participant::Accept() {
  state = State::kAccepted;
  answered = aggregation::SecAggStage::kMaskedInput;
}

void RoundEngine::Participant::Leave(State outcome, std::string why,
                                     aggregation::SecAggStage stage) {
  left_at = stage;
  if (counts()) {
    // Its input is in the sum whatever happens next: it stays counted.
    state = State::kLeftAfterInput;
    reason = std::string("left during ") + aggregation::StageName(stage) + ": " + why;
  } else {
    state = outcome;
    reason = std::move(why);
  }
}

void RoundEngine::Participant::Void(const std::string& why) {
  if (state == State::kDropped || state == State::kRejected) return;
  state = State::kDropped;
  if (reason.empty()) reason = "round aborted: " + why;
}

Outgoing RoundEngine::MakeError(const std::string& peer, wire::ErrorCode code,
                                std::string message) const {
  return ErrorMessage(peer, code, std::move(message),
                      phase_ == Phase::kTraining ? round_ + 1 : round_);
}

aggregation::SecAggSetup RoundEngine::SecAggSetupFor(const std::string& name) const {
  const auto& p = secagg_params_;
  aggregation::SecAggSetup s;
  s.sparse = config_.secagg().aggregation() == config::SECAGG_PLUS;
  s.n = p.n;
  s.k = p.k;
  s.t = p.t;
  const Participant* me = FindByName(participants_, name);
  s.index = me ? static_cast<uint32_t>(me - participants_.data()) : 0;
  s.prg = p.prg;
  s.nonce = secagg_nonce_;
  s.roster_root = p.roster;
  s.roster_proof = secagg()->RosterProof(s.index);
  if (const Client* c = clients_.Find(name); c != nullptr && c->wants_roster) {
    s.roster = cohort_identities_;
  }
  s.clip = fixed_point_.clip;
  s.scale = fixed_point_.scale;
  s.total_weight = cohort_weight_;
  s.corrupt_fraction = config_.secagg().corrupt_fraction();
  auto ms = [](float v) {
    return static_cast<uint32_t>(std::min<double>(double{v} * 1000.0, double{UINT32_MAX}));
  };
  s.stage_timeout_ms = ms(config_.secagg().stage_timeout_s());
  s.round_deadline_ms = ms(config_.rounds().round_deadline_s());
  s.eval_slots = federated_eval();
  s.fednova_slot = fednova_ != nullptr;
  const aggregation::InputRules rules = InputRules();
  s.l2_clip = rules.l2_clip;
  s.dp_clip_norm = rules.dp_clip_norm;
  s.dp_scale = rules.dp_scale;
  s.dp_l2_bound = rules.dp_l2_bound;
  s.dp_share_variance = rules.dp_share_variance;
  s.dp_count_scale = rules.dp_count_scale;
  s.dp_count_share_variance = rules.dp_count_share_variance;
  s.task_digest = rules.task;
  return s;
}

aggregation::InputRules RoundEngine::InputRules() const {
  aggregation::InputRules rules;
  rules.l2_clip = config_.secagg().l2_clip();
  rules.task = task_digest_;
  if (dp_ != nullptr && dp_->skellam()) {
    const privacy::SkellamParams& ddp = *dp_->skellam();
    // privacy.clip_norm, or with adaptive clipping the round's C.
    rules.dp_clip_norm = dp_->clip_norm();
    rules.dp_scale = ddp.scale;
    rules.dp_l2_bound = ddp.l2_bound;
    rules.dp_share_variance = ddp.share_variance();
    if (const auto& count = dp_->clip_count_skellam()) {
      rules.dp_count_scale = count->scale;
      rules.dp_count_share_variance = count->share_variance();
    }
  }
  return rules;
}

bool RoundEngine::EvaluatesRound(uint32_t round) const {
  const uint32_t every = config_.rounds().federated_eval_every();
  return every > 0 && round >= 1 && (round - 1) % every == 0;
}

size_t RoundEngine::secure_length() const {
  const bool count_word = dp_ != nullptr && dp_->clip_count_skellam().has_value();
  return update_values() + (count_word ? 1 : 0) + aggregation::kSecureMetricSlots +
         (federated_eval() ? aggregation::kSecureEvalSlots : 0) +
         (fednova_ != nullptr ? aggregation::kSecureFedNovaSlots : 0);
}

Outgoing RoundEngine::MakeTask(const std::string& peer, const std::string& name) const {
  wire::RoundTask task;
  strategy_->ConfigureTask(round_ + 1, name, task);
  if (EvaluatesRound(round_ + 1)) task.set_evaluate(true);
  std::optional<aggregation::SecAggSetup> setup;
  if (secagg()) setup = SecAggSetupFor(name);
  return TaskMessage(peer, round_ + 1, task_id_, std::move(task),
                     config_.rounds().round_deadline_s(), setup ? &*setup : nullptr, task_model_);
}

std::vector<Outgoing> RoundEngine::OnMalformed(const std::string& peer, const Status& why) {
  const std::string* name = clients_.NameOf(peer);
  env_->Log().warn("rejected message from {}: {}", name ? *name : "unregistered peer",
                   why.message());
  std::vector<Outgoing> out;
  out.push_back(MakeError(
      peer, why.code() == StatusCode::kResourceExhausted ? wire::TOO_LARGE : wire::MALFORMED,
      why.message()));
  CountSent(out);
  return out;
}

std::vector<Outgoing> RoundEngine::Revoke(const std::string& name, const std::string& why,
                                          TimeMs now) {
  std::vector<Outgoing> out;
  const Client* client = clients_.Find(name);
  if (client == nullptr || client->peer.empty()) return out;
  out.push_back(RejectMessage(client->peer, why));
  clients_.SetInactive(name);
  Participant* p = phase_ == Phase::kTraining ? FindParticipant(name) : nullptr;
  if (p != nullptr && Waiting(*p)) {
    Exclude(*p, Participant::State::kDropped, "left: " + why);
    Progress(now, out);
  }
  CountSent(out);
  return out;
}

void RoundEngine::SetNoiseKey(SecretBytes key) {
  if (dp_ != nullptr) dp_->SetNoiseKey(std::move(key));
}

Status RoundEngine::SetUpDistributedDp(size_t num_params) {
  const config::PrivacyConfig& p = config_.privacy();
  if (dp_ == nullptr || p.mechanism() != config::DISTRIBUTED_SKELLAM) return OkStatus();
  // Each share is sized for the fewest survivors a round commits with, so
  // the survivors' noise reaches the target in every committed round.
  // (With adaptive clipping the grid follows C and the update is noised at
  // z_Δ; the count word has a grid of its own.)
  COHORT_RETURN_IF_ERROR(
      dp_->SetUpSkellam(config_.rounds().max_clients_per_round(), MinClients(), num_params));
  env_->Log().info("privacy: distributed DP (Skellam) over {} values: {}", num_params,
                   dp_->skellam()->Describe());
  if (const auto& count = dp_->clip_count_skellam()) {
    env_->Log().info("privacy: adaptive clipping's count word (noise std {:g} in count units): {}",
                     p.adaptive_clip().clipped_count_stddev(), count->Describe());
  }
  return OkStatus();
}

Status RoundEngine::LoadPrivacy() {
  if (dp_ == nullptr) return OkStatus();
  COHORT_ASSIGN_OR_RETURN(std::vector<store::RoundRecord> rounds, store_->Rounds());
  COHORT_RETURN_IF_ERROR(dp_->Restore(rounds));
  COHORT_RETURN_IF_ERROR(dp_->RestoreClip(rounds));
  if (dp_->adaptive()) env_->Log().info("privacy: adaptive clip norm {:.6g}", dp_->clip_norm());
  if (dp_->skellam()) {
    env_->Log().info(
        "privacy: epsilon {:.4g} against the coordinator, {:.4g} for the released model, at "
        "delta {:g} after round {}",
        dp_->epsilon(), dp_->epsilon_released_model(), dp_->privacy().target_delta(), round_);
    return OkStatus();
  }
  env_->Log().info("privacy: epsilon {:.4g} at delta {:g} after round {}", dp_->epsilon(),
                   dp_->privacy().target_delta(), round_);
  return OkStatus();
}

bool RoundEngine::PrivacyAllows(size_t cohort, const CohortRequest& request,
                                std::vector<Outgoing>& out) {
  // q: the cohort over the clients it was drawn from (available, not banned).
  size_t population = 0;
  for (const std::string& name : request.active) population += banned_.count(name) == 0 ? 1 : 0;
  auto plan = dp_->PlanRound(cohort, population);
  if (!plan.ok()) {
    store_error_ = plan.status();
    return false;
  }
  if (plan->within_budget) {
    dp_->BeginRound(request.round, cohort, population);
    return true;
  }
  const config::PrivacyConfig& p = dp_->privacy();
  // Distributed DP names the view the budget is on (privacy.budget_view).
  const std::string view = dp_->BudgetViewName();
  finish_reason_ = fmt::format(
      "privacy budget spent: ε{}={:.4g} > {:.4g} (round {}, {} of {} clients, q={:.4g}, would "
      "take ε from {:.4g} to {:.4g} at δ={:g}); the run stops after round {}",
      view.empty() ? "" : " " + view, plan->budget_epsilon_after, p.epsilon_budget(), request.round,
      cohort, population, plan->sampling_rate, dp_->budget_epsilon(), plan->budget_epsilon_after,
      p.target_delta(), round_);
  env_->Log().warn("{}", finish_reason_);
  phase_ = Phase::kDone;
  for (const auto& [name, c] : clients_.clients()) out.push_back(FinishedMessage(c.peer, round_));
  return false;
}

void RoundEngine::RecordPrivacy(store::RoundRecord& record) {
  if (dp_ == nullptr) return;
  const RoundPrivacy p = dp_->EndRound();
  record.dp_sampling_rate = p.sampling_rate;
  record.dp_epsilon = p.epsilon;
  const RoundClip clip = dp_->EndRoundClip();
  record.dp_clip_norm = clip.clip_norm;
  record.dp_next_clip_norm = clip.next_clip_norm;
  if (dp_->adaptive()) {
    env_->Log().info("round {}: privacy: clipped at C {:.6g}; the next round clips at {:.6g}",
                     record.round, clip.clip_norm, clip.next_clip_norm);
  }
  record.dp_epsilon_released_model = p.epsilon_released_model;
}

Status RoundEngine::LoadScaffoldPopulation() {
  if (scaffold_ == nullptr) return OkStatus();
  COHORT_ASSIGN_OR_RETURN(std::vector<store::RoundRecord> rounds, store_->Rounds());
  for (const store::RoundRecord& r : rounds) {
    scaffold_population_ = std::max(scaffold_population_, r.scaffold_population);
  }
  if (scaffold_population_ > 0) {
    env_->Log().info(
        "SCAFFOLD: c moves by the sum of changes / N, N at least {} (the clients "
        "registered before the restart)",
        scaffold_population_);
  } else if (!rounds.empty()) {
    env_->Log().warn(
        "SCAFFOLD: the store's {} round{} keep no N (written before it was stored): N is the "
        "clients registered when each round starts; set rounds.start_clients to the population "
        "so that the first round after this restart waits for every one",
        rounds.size(), rounds.size() == 1 ? "" : "s");
  }
  return OkStatus();
}

Status RoundEngine::LoadBans() {
  for (uint32_t r = 1; r <= round_; ++r) {
    COHORT_ASSIGN_OR_RETURN(std::vector<store::ClientRoundRecord> records, store_->ClientRounds(r));
    for (const store::ClientRoundRecord& c : records) {
      if (c.misbehaved && banned_.emplace(c.client, c.reason).second) {
        env_->Log().warn("client {} stays excluded (round {}): {}", c.client, r, c.reason);
      }
    }
  }
  return OkStatus();
}

std::vector<Outgoing> RoundEngine::OnMessage(const std::string& peer, const net::Envelope& envelope,
                                             TimeMs now, const AuthenticatedPeer* sender) {
  // Counted in the stage the message arrived in; what the engine sends in
  // reply, in the stage it is then in (the round a commit starts gets its
  // tasks).
  timings_.Received(clients_.NameOf(peer), EncodedBytes(envelope));
  std::vector<Outgoing> out = Dispatch(peer, envelope, now, sender);
  CountSent(out);
  return out;
}

void RoundEngine::CountSent(const std::vector<Outgoing>& out) {
  for (const Outgoing& m : out) timings_.Sent(clients_.NameOf(m.peer), EncodedBytes(m));
}

std::vector<Outgoing> RoundEngine::Dispatch(const std::string& peer, const net::Envelope& envelope,
                                            TimeMs now, const AuthenticatedPeer* sender) {
  std::vector<Outgoing> out;
  const wire::Header& h = envelope.header;
  if (sender != nullptr && h.body_case() != wire::Header::kHello) {
    // Whatever registered on this connection, the transport says who speaks.
    const std::string* name = clients_.NameOf(peer);
    if (name != nullptr && *name != sender->name) {
      env_->Log().warn("rejected {} message: the connection of {} is registered as {}",
                       net::BodyName(h), sender->name, *name);
      out.push_back(MakeError(peer, wire::UNKNOWN_CLIENT,
                              "this connection is registered as another client; send hello"));
      return out;
    }
  }
  if (phase_ == Phase::kDone && h.body_case() != wire::Header::kHello) {
    // The run is over: whatever a known client says, it hears Finished (a
    // lost Finished is repaired by its next heartbeat). Only a heartbeat
    // marked `finished` acknowledges it: another message may have crossed
    // Finished in flight, and closing on it could reset the connection
    // before Finished arrives.
    if (const std::string* name = clients_.NameOf(peer)) {
      if (h.has_heartbeat() && h.heartbeat().finished()) {
        clients_.AcknowledgeFinish(*name);
        return out;
      }
      out.push_back(FinishedMessage(peer, round_));
      return out;
    }
  }
  if (h.body_case() != wire::Header::kUpdate && !envelope.payloads.empty()) {
    out.push_back(MakeError(peer, wire::MALFORMED,
                            "unexpected payload on a " + net::BodyName(h) + " message"));
    return out;
  }
  switch (h.body_case()) {
    case wire::Header::kHello:
      OnHello(peer, h.hello(), sender, now, out);
      break;
    case wire::Header::kUpdate:
      OnUpdate(peer, envelope, now, out);
      break;
    case wire::Header::kSecaggSeed:
    case wire::Header::kSecaggKeys:
    case wire::Header::kSecaggShares:
    case wire::Header::kSecaggShareCheck:
    case wire::Header::kSecaggConfirm:
    case wire::Header::kSecaggSignature:
    case wire::Header::kSecaggUnmask:
      OnSecAggMessage(peer, envelope, now, out);
      break;
    case wire::Header::kGoodbye:
      OnGoodbye(peer, h.goodbye(), now, out);
      break;
    case wire::Header::kHeartbeat: {
      const std::string* name = clients_.NameOf(peer);
      if (name == nullptr) {
        out.push_back(MakeError(peer, wire::UNKNOWN_CLIENT, "unknown client; send hello"));
        break;
      }
      clients_.Seen(*name, now);
      out.push_back(HeartbeatAckMessage(peer));
      break;
    }
    default: {
      const std::string* name = clients_.NameOf(peer);
      env_->Log().warn("rejected {} message from {}: not a client message", net::BodyName(h),
                       name ? *name : "unregistered peer");
      out.push_back(MakeError(peer, wire::MALFORMED,
                              "unexpected message type " + net::BodyName(h) + " from a client"));
      break;
    }
  }
  MaybeStartRound(now, out);
  return out;
}

std::optional<Outgoing> RoundEngine::RefuseHello(
    const std::string& peer, const wire::Hello& hello, const AuthenticatedPeer* sender,
    std::optional<crypto::Ed25519Public>& identity) const {
  auto refusal = clients_.CheckHello(hello, sender, secure(), identity);
  if (!refusal) return std::nullopt;
  if (refusal->malformed) return MakeError(peer, wire::MALFORMED, refusal->reason);
  env_->Log().warn("rejected hello from \"{}\": {}", hello.client_name().substr(0, 80),
                   refusal->reason);
  return RejectMessage(peer, refusal->reason);
}

void RoundEngine::OnHello(const std::string& peer, const wire::Hello& hello,
                          const AuthenticatedPeer* sender, TimeMs now, std::vector<Outgoing>& out) {
  std::optional<crypto::Ed25519Public> identity;
  if (auto refusal = RefuseHello(peer, hello, sender, identity)) {
    out.push_back(std::move(*refusal));
    return;
  }
  const std::string& name = hello.client_name();
  const ClientRegistry::Registration r = clients_.Register(peer, hello, identity, now);
  out.push_back(
      WelcomeMessage(peer, name, config_, static_cast<uint32_t>(global_.size()), run_nonce_));
  if (phase_ == Phase::kDone) {
    out.push_back(FinishedMessage(peer, round_));
    return;
  }
  if (phase_ == Phase::kTraining) HelloInRound(peer, hello, r.recount, r.reconnected, now, out);
  if (phase_ == Phase::kWaiting && r.is_new) SayWhatTheRoundWaitsFor();
}

void RoundEngine::SayWhatTheRoundWaitsFor() const {
  const uint32_t needed = ClientsNeeded();
  const uint32_t have = static_cast<uint32_t>(clients_.size());
  if (have >= needed) return;
  // Every registration of the first ten, then each tenth of the way and
  // the last one missing: a thousand clients registering at once (cohort
  // simulate) write some twenty lines, not a thousand.
  const uint32_t tenth = std::max<uint32_t>(1, needed / 10);
  if (have > 10 && have % tenth != 0 && needed - have > 1) return;
  const bool start = first_round_ && needed > MinClients();
  env_->Log().info("round {} waits for {} more client{} ({} of {} registered; {})", round_ + 1,
                   needed - clients_.size(), needed - clients_.size() == 1 ? "" : "s",
                   clients_.size(), needed,
                   start ? "rounds.start_clients sets the first round's cohort"
                         : "rounds.min_clients sets every round's minimum");
}

void RoundEngine::HelloInRound(const std::string& peer, const wire::Hello& hello, bool recount,
                               bool reconnected, TimeMs now, std::vector<Outgoing>& out) {
  // The sample count of a selected client stays as it was at selection
  // (Participant::num_samples); a new one counts from the next round.
  const std::string& name = hello.client_name();
  Participant* p = FindParticipant(name);
  if (p == nullptr) return;
  if (recount) {
    const std::string why = "misbehaved: changed its sample count from " +
                            std::to_string(p->num_samples) + " to " +
                            std::to_string(hello.num_samples()) + " during the round";
    Ban(*p, why);
    if (Waiting(*p)) {
      Exclude(*p, Participant::State::kRejected, why);
      Progress(now, out);
    } else if (p->reason.rfind("misbehaved", 0) != 0) {
      // Out of the round already, or its update is in: the record still
      // names it, so the ban outlives a coordinator restart.
      p->reason = why + (p->reason.empty() ? "" : "; " + p->reason);
    }
    return;
  }
  if (secagg()) {
    // A new connection is a new process: its keys and shares are gone, so
    // waiting for it would only stall the round to its deadline.
    if (reconnected && p->in_round()) {
      env_->Log().warn("client {}: reconnected during round {}; it leaves the round", name,
                       round_ + 1);
      Exclude(*p, Participant::State::kDropped,
              "reconnected during the round; its secure-aggregation state is gone");
      Progress(now, out);
    }
  } else if (p->state == Participant::State::kTraining) {
    // A selected client that reconnected lost its task: send it again.
    out.push_back(MakeTask(peer, name));
  }
}

std::optional<RoundEngine::UpdateRefusal> RoundEngine::AdmitUpdate(const std::string& name,
                                                                   const wire::Update& u,
                                                                   Participant*& p) {
  const uint32_t current = round_ + 1;
  if (phase_ != Phase::kTraining || u.round() != current || u.task_id() != task_id_) {
    return UpdateRefusal{
        wire::STALE, phase_ != Phase::kTraining ? "update for round " + std::to_string(u.round()) +
                                                      " while no round is open"
                     : u.round() != current ? "update for round " + std::to_string(u.round()) +
                                                  ", current round is " + std::to_string(current)
                                            : "update for a task of round " +
                                                  std::to_string(current) + " that was replaced"};
  }
  p = FindParticipant(name);
  if (p == nullptr) {
    return UpdateRefusal{wire::NOT_SELECTED, "not selected for round " + std::to_string(current)};
  }
  if (p->state != Participant::State::kTraining) {
    // A second copy of an update that counted names no task: its first
    // copy is in the sum.
    if (p->counts()) {
      return UpdateRefusal{wire::STALE, "a second update for round " + std::to_string(current),
                           false};
    }
    return UpdateRefusal{wire::STALE, "update after being dropped from round " +
                                          std::to_string(current) + " (" + p->reason + ")"};
  }
  if (secagg() && (stage_ != aggregation::SecAggStage::kMaskedInput ||
                   p->answered != aggregation::PreviousStage(stage_))) {
    // The protocol's earlier stages come first.
    return UpdateRefusal{wire::STALE, "masked update during stage " +
                                          std::string(SecAggStageName()) + " of round " +
                                          std::to_string(current)};
  }
  return std::nullopt;
}

void RoundEngine::OnUpdate(const std::string& peer, const net::Envelope& envelope, TimeMs now,
                           std::vector<Outgoing>& out) {
  const wire::Update& u = envelope.header.update();
  const std::string* name_ptr = clients_.NameOf(peer);
  if (name_ptr == nullptr) {
    env_->Log().warn("rejected update from an unregistered peer");
    out.push_back(MakeError(peer, wire::UNKNOWN_CLIENT, "unknown client; send hello"));
    return;
  }
  const std::string name = *name_ptr;
  clients_.Seen(name, now);
  Participant* p = nullptr;
  if (std::optional<UpdateRefusal> refusal = AdmitUpdate(name, u, p)) {
    env_->Log().warn("client {}: rejected update: {}", name, refusal->why);
    Outgoing error = MakeError(peer, refusal->code, refusal->why);
    // Naming the task tells the client which update did not count
    // (SCAFFOLD: its c_i goes back).
    if (refusal->names_task) error.header.mutable_error()->set_task_id(u.task_id());
    out.push_back(std::move(error));
    return;
  }
  const uint32_t current = round_ + 1;
  Status status = CheckUpdate(u, envelope, *p, aggregator_->masked());
  if (status.ok()) {
    const double started = env_->MonotonicSeconds();
    const auto index = static_cast<uint32_t>(p - participants_.data());
    status = aggregator_->Accept(index, envelope.payloads[0], p->num_samples);
    aggregation_seconds_ += env_->MonotonicSeconds() - started;
  }
  if (!status.ok()) {
    const std::string why =
        "client " + name + ", round " + std::to_string(current) + ": " + status.message();
    env_->Log().warn("rejected update: {}", why);
    Outgoing error = MakeError(peer, wire::INVALID_UPDATE, why);
    error.header.mutable_error()->set_task_id(u.task_id());
    out.push_back(std::move(error));
    Exclude(*p, Participant::State::kRejected, status.message());
    Progress(now, out);
    return;
  }
  p->Accept();
  // Adaptive clipping's bit, from the update as it came (before clipping).
  if (dp_ != nullptr && !aggregator_->masked()) dp_->CountUpdate(envelope.payloads[0]);
  // A masked update's metrics travel inside it, and only their sum counts.
  if (!aggregator_->masked()) KeepPlainMetrics(u, current, *p);
  Progress(now, out);
}

void RoundEngine::KeepPlainMetrics(const wire::Update& u, uint32_t round, Participant& p) const {
  p.train_loss = u.train_loss();
  p.train_accuracy = u.train_accuracy();
  p.train_seconds = u.train_seconds();
  if (EvaluatesRound(round)) {
    p.eval_samples = u.eval_samples();
    p.eval_loss = u.eval_loss();
    p.eval_accuracy = u.eval_accuracy();
  }
  p.fednova_norm = u.fednova_norm();
}

Status RoundEngine::CheckUpdate(const wire::Update& u, const net::Envelope& envelope,
                                const Participant& p, bool masked) const {
  if (u.masked() != masked) {
    return InvalidArgumentError(
        masked ? "plaintext update in a round with secure aggregation; the update must be masked"
               : "masked update in a round with plain aggregation");
  }
  if (envelope.payloads.size() != 1) {
    return InvalidArgumentError("update carries " + std::to_string(envelope.payloads.size()) +
                                " payload frames, expected 1");
  }
  if (u.num_samples() != p.num_samples) {
    // The weight of an update is its sample count, fixed when the round
    // selected the client.
    return InvalidArgumentError("update claims " + std::to_string(u.num_samples()) +
                                " samples, the client was selected with " +
                                std::to_string(p.num_samples));
  }
  if (!std::isfinite(u.train_loss()) || !std::isfinite(u.train_accuracy()) ||
      !std::isfinite(u.train_seconds())) {
    return InvalidArgumentError("non-finite training metrics");
  }
  if (Status norm = CheckFedNovaNorm(u.fednova_norm(), fednova_ != nullptr && !masked,
                                     FedNovaNormBound(config_, p.num_samples));
      !norm.ok()) {
    return norm;
  }
  if (u.eval_samples() > 0 &&
      (u.eval_samples() > (uint64_t{1} << 40) || !std::isfinite(u.eval_loss()) ||
       u.eval_loss() < 0 || !(u.eval_accuracy() >= 0 && u.eval_accuracy() <= 1))) {
    return InvalidArgumentError(
        "federated evaluation: eval_samples must be at most 2^40, eval_loss finite and >= 0, "
        "eval_accuracy in [0, 1]");
  }
  return OkStatus();
}

Status RoundEngine::StartPlain() {
  // A robust rule needs every update; the weighted mean only a running sum.
  const config::ServerConfig& s = config_.server();
  if (dp_ != nullptr) {
    // DP-FedAvg: clipped, equally weighted, over the cohort (strategy_dp.h);
    // no update is refused for its length, every one is clipped.
    COHORT_ASSIGN_OR_RETURN(
        aggregator_, aggregation::NewClippedSum(global_.size(), dp_->clip_norm(),
                                                static_cast<uint32_t>(participants_.size())));
  } else if (s.has_robust()) {
    COHORT_ASSIGN_OR_RETURN(
        aggregator_, aggregation::NewRobustAggregator(RobustOptionsOf(s.robust()), global_.size(),
                                                      s.max_update_norm()));
  } else if (scaffold_ != nullptr) {
    // [y - x | Δc_i]: server.max_update_norm bounds the delta only.
    COHORT_ASSIGN_OR_RETURN(aggregator_,
                            aggregation::NewScaffoldFedAvg(global_.size(), s.max_update_norm()));
  } else {
    COHORT_ASSIGN_OR_RETURN(aggregator_,
                            aggregation::NewStreamingFedAvg(global_.size(), s.max_update_norm()));
  }
  aggregation_seconds_ = 0;
  return OkStatus();
}

bool RoundEngine::AllResolved() const {
  return std::none_of(participants_.begin(), participants_.end(), [](const Participant& p) {
    return p.state == Participant::State::kTraining;
  });
}

void RoundEngine::OnGoodbye(const std::string& peer, const wire::Goodbye& goodbye, TimeMs now,
                            std::vector<Outgoing>& out) {
  const std::string* registered = clients_.NameOf(peer);
  if (registered == nullptr) return;
  const std::string name = *registered;
  const bool stopping = goodbye.task_id() == 0;
  if (stopping) {
    clients_.SetInactive(name);
    env_->Log().info("client {}: said goodbye (stopped by its operator)", name);
  }
  if (phase_ != Phase::kTraining || (!stopping && goodbye.task_id() != task_id_)) return;
  Participant* p = FindParticipant(name);
  if (p == nullptr || !Waiting(*p)) return;
  Exclude(*p, Participant::State::kDropped,
          stopping ? "left: stopped by its operator" : "left: " + GoodbyeReason(goodbye));
  Progress(now, out);
}

bool RoundEngine::Waiting(const Participant& p) const {
  // In a secure round a client takes part until it leaves, after its input
  // too; in a plain one, until its update is in.
  return secagg() ? p.in_round() : p.state == Participant::State::kTraining;
}

void RoundEngine::Exclude(Participant& p, Participant::State outcome, std::string reason) {
  p.Leave(outcome, std::move(reason), secagg() ? stage_ : aggregation::SecAggStage::kNone);
}

void RoundEngine::Progress(TimeMs now, std::vector<Outgoing>& out) {
  if (phase_ != Phase::kTraining) return;
  if (secagg()) {
    AdvanceSecAgg(now, out);
  } else if (AllResolved()) {
    CloseRound(now, out);
  }
}

uint32_t RoundEngine::ClientsNeeded() const {
  const auto& rc = config_.rounds();
  const uint32_t needed = MinClients();
  // Excluded clients never count: waiting for them would stall a resumed run.
  const uint32_t start = rc.start_clients() > banned_.size()
                             ? rc.start_clients() - static_cast<uint32_t>(banned_.size())
                             : 0;
  return first_round_ && start > needed ? start : needed;
}

void RoundEngine::MaybeStartRound(TimeMs now, std::vector<Outgoing>& out) {
  if (phase_ != Phase::kWaiting || !store_error_.ok()) return;
  CohortRequest request;
  request.needed = ClientsNeeded();
  // Every Hello lands here while the run waits: too few registered at all
  // must cost O(1), or registering n clients costs O(n^2).
  if (clients_.size() < request.needed) return;
  request.round = round_ + 1;
  request.min_clients = MinClients();
  request.active = clients_.ActiveNames();
  request.banned = &banned_;
  if (dp_ != nullptr && !dp_->has_noise_key()) {
    store_error_ = FailedPreconditionError(
        "privacy: no noise key was given (the run directory's privacy_noise.key)");
    return;
  }
  std::vector<std::string> cohort = strategy_->SelectCohort(request);
  if (cohort.empty()) return;
  if (dp_ != nullptr && !PrivacyAllows(cohort.size(), request, out)) return;
  first_round_ = false;
  StartRound(cohort, now, out);
}

void RoundEngine::StartRound(const std::vector<std::string>& cohort, TimeMs now,
                             std::vector<Outgoing>& out) {
  const uint32_t round = round_ + 1;
  participants_.clear();
  for (const auto& name : cohort) {
    Participant p;
    p.name = name;
    p.num_samples = clients_.at(name).num_samples;
    p.data_sha256 = clients_.at(name).data_sha256;
    p.label_counts = clients_.at(name).label_counts;
    participants_.push_back(std::move(p));
  }
  task_id_ = ++task_counter_;
  round_started_ = now;
  // One copy per round, however many clients receive it. SCAFFOLD: the
  // server's control variate c follows the model.
  if (scaffold_ != nullptr) {
    std::vector<float> payload = global_;
    const std::span<const float> c = scaffold_->variate();
    if (c.empty()) {
      payload.resize(2 * global_.size(), 0.0f);
    } else {
      payload.insert(payload.end(), c.begin(), c.end());
    }
    task_model_ = std::make_shared<const std::vector<float>>(std::move(payload));
    // N never falls: a resumed coordinator starts from the last record's
    // (LoadScaffoldPopulation), whoever has registered again so far.
    scaffold_population_ = std::max<uint64_t>(scaffold_population_, clients_.size());
  } else {
    task_model_ = std::make_shared<const std::vector<float>>(global_);
  }
  // (Before the secure setup: its task digest hashes this payload.)
  Status started = secure() ? StartSecAgg(cohort) : StartPlain();
  if (!started.ok()) {
    // Only a configuration the validator let through can get here.
    env_->Log().error("round {}: cannot set up aggregation: {}", round, started.message());
    store_error_ = started;
    participants_.clear();
    return;
  }
  round_started_ = now;
  round_start_wall_ = env_->MonotonicSeconds();
  timings_.Start(now, secagg() ? aggregation::StageName(stage_) : "train");
  deadline_ = now + SecondsToMs(config_.rounds().round_deadline_s());
  phase_ = Phase::kTraining;
  env_->Log().info(
      "round {}: selected {} of {} available clients{}", round, cohort.size(), clients_.size(),
      secagg() ? fmt::format(" (secure aggregation, k={} t={})", secagg_params_.k, secagg_params_.t)
               : "");
  // SCAFFOLD: SecAggStart does not say that the vector carries the
  // variate's change, so its clients start the key exchange with the task.
  if (secagg() && scaffold_ == nullptr) {
    // Every key exchange first: the small SecAggStart messages are queued
    // ahead of the models, so stages 1 and 2 overlap the downloads.
    for (const auto& p : participants_) {
      out.push_back(
          SecAggStartMessage(clients_.PeerOf(p.name), round, task_id_, SecAggSetupFor(p.name)));
    }
  }
  for (const auto& p : participants_) out.push_back(MakeTask(clients_.PeerOf(p.name), p.name));
}

void RoundEngine::CloseRound(TimeMs now, std::vector<Outgoing>& out) {
  const uint32_t round = round_ + 1;
  size_t ok = 0;
  for (const auto& p : participants_) ok += p.counts() ? 1 : 0;
  phase_ = Phase::kWaiting;
  if (ok < config_.rounds().min_clients()) {
    const std::string shortfall = fmt::format("only {} update{} accepted, need {}", ok,
                                              ok == 1 ? "" : "s", config_.rounds().min_clients());
    const std::string futile = WhyARerunIsFutile();
    if (!futile.empty()) {
      AbortRound(now, shortfall + "; " + futile, out);
      return;
    }
    const std::string why = shortfall + "; " + NotCounted();
    if (attempts_ + 1 >= kMaxRoundAttempts) {
      AbortRound(now, why + "; the round was tried " + std::to_string(kMaxRoundAttempts) + " times",
                 out);
      return;
    }
    env_->Log().warn("round {}: {}; the round is run again (attempt {} of {})", round, why,
                     attempts_ + 1, kMaxRoundAttempts);
    ++attempts_;
    participants_.clear();
    aggregator_.reset();
    MaybeStartRound(now, out);
    return;
  }
  FinishRound(now, env_->MonotonicSeconds(), out);
}

std::vector<std::string> RoundEngine::AwaitedAbsentClients() const {
  if (phase_ != Phase::kWaiting) return {};
  size_t reachable = 0;
  for (const std::string& name : clients_.ActiveNames()) reachable += banned_.count(name) == 0;
  if (reachable >= ClientsNeeded()) return {};
  std::vector<std::string> absent;
  for (const auto& [name, c] : clients_.clients()) {
    if (!c.active && banned_.count(name) == 0) absent.push_back(name);
  }
  return absent;
}

std::string RoundEngine::WhyARerunIsFutile() const {
  // A plain round's task is the same model with the same seeds each time
  // (strategy_fedavg: the seed is the run's, the round's and the
  // client's), so an update a check refused would be refused again (and a
  // client banned for it is not selected again): only the clients that did
  // not answer can add to a re-run. When even all of them could not reach
  // min_clients, the re-run is futile.
  const Participant* refused = nullptr;
  uint32_t reachable = 0;
  for (const auto& p : participants_) {
    if (p.state != Participant::State::kRejected) {
      ++reachable;
    } else if (refused == nullptr) {
      refused = &p;
    }
  }
  if (refused != nullptr && reachable < config_.rounds().min_clients()) {
    return "client " + refused->name + "'s update was refused (" + refused->reason +
           "), and a re-run, with the same model and seeds, could accept at most " +
           std::to_string(reachable);
  }
  return "";
}

std::string RoundEngine::NotCounted() const {
  constexpr size_t kNamed = 3;
  std::string named;
  size_t count = 0;
  for (const auto& p : participants_) {
    if (p.counts()) continue;
    if (++count > kNamed) continue;
    const bool refused = p.state == Participant::State::kRejected;
    named += (count > 1 ? ", " : "") + p.name + " (" + (refused ? "update refused: " : "") +
             p.reason + ")";
  }
  if (count > kNamed) named += fmt::format(" and {} more", count - kNamed);
  return "not counted: " + named;
}

void RoundEngine::FinishRound(TimeMs now, double started, std::vector<Outgoing>& out) {
  auto mean = aggregator_->Finalize();
  if (secagg()) TakeSecAggBlame();
  aggregation_seconds_ += env_->MonotonicSeconds() - started;
  if (!mean.ok()) {
    AbortRound(now, mean.status().message(), out);
    return;
  }
  if (sum_observer_ && !mean->masked_sum.empty()) {
    std::vector<std::string> names;
    for (const auto& p : participants_) {
      if (p.counts()) names.push_back(p.name);
    }
    sum_observer_(round_ + 1, mean->masked_sum, names);
  }
  CommitRound(now, &*mean, aggregation_seconds_, "", out);
}

Status RoundEngine::PrepareFedNova(const aggregation::RoundMean& mean) {
  if (fednova_ == nullptr) return OkStatus();
  double tau_eff = 0;
  if (mean.fednova_tau_eff) {
    tau_eff = ClampSecureTauEff(*mean.fednova_tau_eff);  // Secure: only the sum's slot.
  } else {
    double weighted = 0, weight = 0;
    for (const auto& p : participants_) {
      if (!p.counts()) continue;
      weighted += static_cast<double>(p.num_samples) * p.fednova_norm;
      weight += static_cast<double>(p.num_samples);
    }
    tau_eff = weight > 0 ? weighted / weight : 0;
  }
  env_->Log().info("round {}: FedNova tau_eff {:.6g}", round_ + 1, tau_eff);
  return fednova_->SetTauEff(tau_eff);
}

double RoundEngine::ClampSecureTauEff(double tau_eff) const {
  // Honest clients' normalisers lie in [1, FedNovaNormBound], so their
  // weighted mean does, give or take the masked sum's grid (kMaxFedNovaNorm
  // over about 2^31 per client, divided by the accepted share of the
  // cohort's weight) and two float roundings, the client's slot and the
  // decoded mean, 2^-24 of the value each (a review found honest rounds of
  // 2000 steps clamped without them).
  double most = 1, accepted_weight = 0;
  for (const auto& p : participants_) {
    if (!p.counts()) continue;
    most = std::max(most, FedNovaNormBound(config_, p.num_samples));
    accepted_weight += static_cast<double>(p.num_samples);
  }
  const double grid = aggregation::kMaxFedNovaNorm * static_cast<double>(participants_.size() + 1) /
                          std::ldexp(1.0, 30) * cohort_weight_ / std::max(accepted_weight, 1.0) +
                      8 * most * std::ldexp(1.0, -24);
  if (tau_eff >= 1 - grid && tau_eff <= most + grid) return tau_eff;
  const double clamped = std::isfinite(tau_eff) ? std::clamp(tau_eff, 1.0, most) : 1.0;
  env_->Log().warn(
      "round {}: FedNova tau_eff {:.6g} from the masked sum is outside [1, {:.6g}], the range "
      "of the selected clients' honest normalisers: some client's slot is not its normaliser. "
      "Stepping with {:.6g}",
      round_ + 1, tau_eff, most, clamped);
  return clamped;
}

Status RoundEngine::PrepareScaffold(const aggregation::RoundMean& mean,
                                    std::span<const float>& delta) {
  if (scaffold_ == nullptr) return OkStatus();
  const size_t n = global_.size();
  if (mean.delta.size() != 2 * n) {
    return FailedPreconditionError("SCAFFOLD: the round's sum has " +
                                   std::to_string(mean.delta.size()) + " values, expected " +
                                   std::to_string(2 * n));
  }
  // Plain: the aggregator summed the second half. Secure: each client
  // weighed its Δc_i by 1 / n_cohort, and the decoding divided by
  // Σ n_k / W over the accepted inputs.
  double factor = 1;
  if (aggregator_->masked()) {
    double accepted_weight = 0;
    for (const auto& p : participants_) {
      if (p.counts()) accepted_weight += static_cast<double>(p.num_samples);
    }
    factor = accepted_weight / cohort_weight_ * static_cast<double>(secagg_params_.n);
  }
  std::vector<double> sum(n);
  for (size_t j = 0; j < n; ++j) sum[j] = factor * static_cast<double>(mean.delta[n + j]);
  env_->Log().info("round {}: SCAFFOLD: c moves by the sum of {} clients' changes / N = {}",
                   round_ + 1, aggregator_->accepted(), scaffold_population_);
  delta = std::span<const float>(mean.delta).first(n);
  return scaffold_->SetVariateSum(std::move(sum), scaffold_population_);
}

Status RoundEngine::StepModel(const aggregation::RoundMean& mean, EvalMetrics& metrics) {
  COHORT_RETURN_IF_ERROR(PrepareFedNova(mean));
  std::span<const float> delta = mean.delta;
  COHORT_RETURN_IF_ERROR(PrepareScaffold(mean, delta));
  std::vector<float> model = global_;
  // Adaptive clipping under distributed DP: the unmasked noisy count.
  if (dp_ != nullptr && mean.dp_clip_count) dp_->SetClipCount(*mean.dp_clip_count);
  COHORT_ASSIGN_OR_RETURN(std::optional<EvalMetrics> evaluated,
                          StepAndEvaluate(*strategy_, delta, model));
  if (evaluated) metrics = *evaluated;
  global_ = std::move(model);
  strategy_->CommitAggregate();
  return OkStatus();
}

double RoundEngine::RoundTrainLoss(const aggregation::RoundMean* mean,
                                   const std::vector<store::ClientRoundRecord>& clients,
                                   double loss_sum, double weight_sum) const {
  // Under distributed DP the coordinator learns no training loss (the
  // clients leave its slot empty): -1, not known.
  if (config_.privacy().mechanism() == config::DISTRIBUTED_SKELLAM) return -1;
  if (mean == nullptr) return 0;
  // Secure rounds learn only the weighted mean, inside the masked sum.
  if (mean->metrics) return mean->metrics->loss;
  if (config_.server().has_robust()) {
    // As the model, so its figure: the median of the counted clients'
    // losses, which neither a claimed sample count nor one wild loss moves.
    std::vector<float> losses;
    for (const auto& c : clients) {
      if (c.status == "ok") losses.push_back(static_cast<float>(c.train_loss));
    }
    if (losses.empty()) return 0;
    std::vector<std::span<const float>> each;
    for (const float& loss : losses) each.emplace_back(&loss, 1);
    float median = 0;
    aggregation::CoordinateMedian(each, std::span<float>(&median, 1));
    return median;
  }
  return weight_sum > 0 ? loss_sum / weight_sum : 0;
}

std::vector<store::ClientRoundRecord> RoundEngine::ClientRecords(double& loss_sum,
                                                                 double& weight_sum) const {
  std::vector<store::ClientRoundRecord> clients;
  for (const auto& p : participants_) {
    store::ClientRoundRecord cr;
    cr.client = p.name;
    if (p.counts()) {
      cr.status = "ok";
      loss_sum += p.train_loss * p.num_samples;
      weight_sum += p.num_samples;
    } else {
      cr.status = p.state == Participant::State::kRejected ? "rejected" : "dropped";
    }
    cr.reason = p.reason;
    cr.misbehaved = p.misbehaved;
    cr.stage = aggregation::StageName(p.left_at);
    cr.num_samples = p.num_samples;
    cr.train_loss = p.train_loss;
    cr.train_accuracy = p.train_accuracy;
    cr.train_seconds = p.train_seconds;
    cr.data_sha256 = p.data_sha256;
    cr.label_counts = p.label_counts;
    cr.upload_bytes = timings_.UploadBytes(p.name);
    cr.download_bytes = timings_.DownloadBytes(p.name);
    clients.push_back(std::move(cr));
  }
  return clients;
}

void RoundEngine::RecordFederatedEval(const aggregation::RoundMean& mean,
                                      store::RoundRecord& record) const {
  if (mean.metrics) {  // Secure: only the means, inside the masked sum.
    if (!mean.eval) return;
    record.federated_eval_loss = mean.eval->loss;
    record.federated_eval_accuracy = mean.eval->accuracy;
    record.federated_eval_samples = static_cast<uint64_t>(std::llround(mean.eval->samples));
    return;
  }
  double samples = 0, loss = 0, accuracy = 0;
  for (const auto& p : participants_) {
    if (!p.counts() || p.eval_samples == 0) continue;
    samples += static_cast<double>(p.eval_samples);
    loss += p.eval_loss * static_cast<double>(p.eval_samples);
    accuracy += p.eval_accuracy * static_cast<double>(p.eval_samples);
  }
  if (samples == 0) return;
  record.federated_eval_loss = loss / samples;
  record.federated_eval_accuracy = accuracy / samples;
  record.federated_eval_samples = static_cast<uint64_t>(samples);
}

void RoundEngine::CommitRound(TimeMs now, const aggregation::RoundMean* mean, double spent_seconds,
                              const std::string& abort_reason, std::vector<Outgoing>& out) {
  const uint32_t round = round_ + 1;
  const double close_start = env_->MonotonicSeconds() - spent_seconds;
  phase_ = Phase::kWaiting;
  std::string why = abort_reason;
  EvalMetrics metrics{-1, -1};
  if (mean != nullptr) {
    Status stepped = StepModel(*mean, metrics);
    if (!stepped.ok()) {
      why = stepped.message();
      env_->Log().error("round {}: aborted: {}; the model is unchanged and the run goes on", round,
                        why);
      for (auto& p : participants_) p.Void(why);
      mean = nullptr;
    }
  }
  if (mean == nullptr) {
    auto unchanged = strategy_->Evaluate(global_);
    if (unchanged.ok() && unchanged->has_value() && std::isfinite((*unchanged)->loss)) {
      metrics = **unchanged;
    }
  }
  store::RoundRecord record;
  record.round = round;
  record.aggregation = !secure()                                               ? "plain"
                       : config_.secagg().aggregation() == config::SECAGG_PLUS ? "secagg+"
                                                                               : "secagg";
  record.outcome = mean != nullptr ? "committed" : "aborted";
  record.outcome_reason = mean != nullptr ? "" : why;
  record.test_accuracy = metrics.accuracy;
  record.test_loss = metrics.loss;
  double loss_sum = 0, weight_sum = 0;
  std::vector<store::ClientRoundRecord> clients = ClientRecords(loss_sum, weight_sum);
  size_t ok = 0;
  for (const auto& c : clients) ok += c.status == "ok" ? 1 : 0;
  record.selected = static_cast<uint32_t>(participants_.size());
  record.participants = mean != nullptr ? static_cast<uint32_t>(ok) : 0;
  record.dropped = record.selected - record.participants;
  record.train_loss = RoundTrainLoss(mean, clients, loss_sum, weight_sum);
  if (mean != nullptr && EvaluatesRound(round)) RecordFederatedEval(*mean, record);
  RecordPrivacy(record);
  if (scaffold_ != nullptr) record.scaffold_population = scaffold_population_;
  store::Checkpoint cp{round, global_, {}};
  strategy_->SaveState(cp);
  record.coordinator_seconds = env_->MonotonicSeconds() - close_start;
  record.seconds = env_->MonotonicSeconds() - round_start_wall_;
  record.clock_seconds = double(now - round_started_) / 1000.0;
  record.stages = timings_.Finish(now, record.coordinator_seconds);
  Status status = store_->CommitRound(record, clients, cp, config_.rounds().keep_checkpoints());
  record.coordinator_seconds = env_->MonotonicSeconds() - close_start;
  if (!status.ok()) {
    // The model in memory is ahead of the store; stop rather than diverge.
    env_->Log().error("round {}: commit failed: {}", round, status.message());
    store_error_ = status;
    return;
  }
  round_ = round;
  attempts_ = 0;
  committed_.push_back(record);
  participants_.clear();
  aggregator_.reset();
  stage_ = aggregation::SecAggStage::kNone;
  if (round_ >= config_.rounds().num_rounds()) {
    phase_ = Phase::kDone;
    env_->Log().info("run finished after {} rounds", round_);
    for (const auto& [name, c] : clients_.clients()) out.push_back(FinishedMessage(c.peer, round_));
    return;
  }
  MaybeStartRound(now, out);
}

std::vector<Outgoing> RoundEngine::OnTick(TimeMs now) {
  std::vector<Outgoing> out;
  for (const std::string& name : clients_.ExpireSilent(now)) {
    env_->Log().warn("client {}: no message for {:.1f} s, marked unavailable", name,
                     (now - clients_.at(name).last_seen) / 1000.0);
    if (phase_ == Phase::kTraining) {
      Participant* p = FindParticipant(name);
      if (p != nullptr && Waiting(*p)) Exclude(*p, Participant::State::kDropped, "timed out");
    }
  }
  if (phase_ == Phase::kTraining && !secagg() && now >= deadline_) {
    // A secure round's stages have deadlines of their own (AdvanceSecAgg).
    for (auto& p : participants_) {
      if (p.state == Participant::State::kTraining) {
        Exclude(p, Participant::State::kDropped, "missed the round deadline");
        // Not picked again until it speaks up.
        clients_.SetInactive(p.name);
        env_->Log().warn("client {}: dropped from round {}: missed the deadline", p.name,
                         round_ + 1);
      }
    }
  }
  Progress(now, out);
  MaybeStartRound(now, out);
  CountSent(out);
  return out;
}

std::optional<TimeMs> RoundEngine::NextWakeup() const {
  std::optional<TimeMs> next = clients_.NextTimeout();
  if (phase_ == Phase::kTraining) {
    // A secure round waits on its stage's deadline; only the masked inputs
    // (like a plain round's updates) wait for the round deadline.
    const TimeMs due = stage_ == aggregation::SecAggStage::kNone ||
                               stage_ == aggregation::SecAggStage::kMaskedInput
                           ? deadline_
                           : stage_deadline_;
    if (!next || due < *next) next = due;
  }
  return next;
}

}  // namespace cohort::coordinator
