#include "coordinator/fedbuff_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "common/rng.h"
#include "crypto/digest.h"
#include "proto/checkpoint.pb.h"
#include "proto/config_io.h"

namespace cohort::coordinator {
namespace {

// The groups' engines log through the coordinator's sinks at warn and
// above: each group is a whole run of one round, whose info lines (round
// waits, run finished) would drown the versions'.
std::unique_ptr<Env> GroupEnv(Env* base) {
  const auto& sinks = spdlog::default_logger()->sinks();
  auto log = std::make_shared<spdlog::logger>("fedbuff-group", sinks.begin(), sinks.end());
  log->set_level(std::max(spdlog::default_logger()->level(), spdlog::level::warn));
  return std::make_unique<LogRedirectEnv>(base, std::move(log));
}

// A model as the schedule stores it: little-endian float32, as the store's
// checkpoint blobs.
std::string ModelBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
std::vector<float> ModelFromBytes(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// One group of a committed schedule, against the schedule and the run:
// kDataLoss naming the group and what is wrong.
Status CheckScheduledGroup(const checkpoint::FedBuffGroup& pg, const checkpoint::FedBuffSchedule& s,
                           uint32_t version, uint32_t buffer_size, size_t num_params,
                           const std::string& what) {
  const std::string group = what + ": group " + std::to_string(pg.id());
  if (pg.id() == 0 || pg.id() >= s.next_group()) {
    return DataLossError(group + " is not numbered below the next group, " +
                         std::to_string(s.next_group()));
  }
  if (pg.base_version() > version) {
    return DataLossError(group + " was sent version " + std::to_string(pg.base_version()) +
                         ", after the commit");
  }
  if (pg.opened_ms() < 0 || pg.opened_ms() > s.clock_ms()) {
    return DataLossError(group + " opened at " + std::to_string(pg.opened_ms()) +
                         " ms, outside [0, " + std::to_string(s.clock_ms()) + "]");
  }
  if (pg.members_size() != static_cast<int>(buffer_size)) {
    return DataLossError(group + " has " + std::to_string(pg.members_size()) +
                         " members, fedbuff.buffer_size is " + std::to_string(buffer_size));
  }
  if (pg.base_model().size() != num_params * sizeof(float)) {
    return DataLossError(group + ": its base model has " + std::to_string(pg.base_model().size()) +
                         " bytes, the model " + std::to_string(num_params * sizeof(float)));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<FedBuffEngine>> FedBuffEngine::Create(const config::RunConfig& config,
                                                               std::vector<float> init_model,
                                                               store::RunStore* store,
                                                               Evaluator evaluator,
                                                               std::string code_version, Env* env) {
  COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(config));
  if (!config.has_fedbuff()) {
    return InvalidArgumentError("fedbuff: the config does not ask for buffered aggregation");
  }
  std::unique_ptr<FedBuffEngine> engine(new FedBuffEngine(config, store, env));
  const bool evaluates = static_cast<bool>(evaluator);
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> inner,
                          MakeStrategy(config, std::move(evaluator)));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<FedBuffStrategy> buffered,
                          FedBuffStrategy::Wrap(std::move(inner), config));
  engine->fedbuff_ = buffered.get();
  engine->strategy_ = std::move(buffered);
  COHORT_RETURN_IF_ERROR(
      engine->OpenStore(std::move(init_model), std::move(code_version), evaluates));
  engine->done_ = engine->version_ >= config.rounds().num_rounds();
  return engine;
}

FedBuffEngine::FedBuffEngine(const config::RunConfig& config, store::RunStore* store, Env* env)
    : config_(config),
      store_(store),
      env_(env),
      group_env_(GroupEnv(env)),
      clients_(static_cast<TimeMs>(std::llround(double{config.rounds().client_timeout_s()} * 1000)),
               env) {
  idle_limits_.max_header_bytes = config.net().max_header_bytes();
}

Status FedBuffEngine::OpenStore(std::vector<float> init_model, std::string code_version,
                                bool evaluates) {
  const std::string text = config::ToText(config_);
  COHORT_ASSIGN_OR_RETURN(std::optional<store::RunInfo> existing, store_->LoadRun());
  // As RoundEngine's: the config is fixed at the first committed version.
  const bool replace =
      existing.has_value() && existing->last_round == 0 && existing->config_text != text;
  if (!existing.has_value() || replace) {
    if (init_model.empty()) return InvalidArgumentError("initial model is empty");
    store::RunInfo info{text,
                        config_.seed(),
                        std::move(code_version),
                        0,
                        crypto::Sha256Hex(text),
                        config_.fedbuff().concurrency(),
                        evaluates ? "cpu" : "",
                        KeptOrNewRunNonce(existing, *env_)};
    run_nonce_ = info.run_nonce;
    store::Checkpoint initial{0, init_model, {}};
    strategy_->SaveState(initial);
    COHORT_RETURN_IF_ERROR(replace ? store_->ReplaceUncommittedRun(info, initial)
                                   : store_->CreateRun(info, initial));
    global_ = std::move(init_model);
    return OkStatus();
  }
  COHORT_RETURN_IF_ERROR(config::CheckResumable(existing->config_text, config_));
  run_nonce_ = existing->run_nonce;
  COHORT_ASSIGN_OR_RETURN(store::Checkpoint cp, store_->LatestCheckpoint());
  if (cp.round != existing->last_round) {
    return DataLossError("newest checkpoint is of version " + std::to_string(cp.round) +
                         " but version " + std::to_string(existing->last_round) + " was committed");
  }
  if (!init_model.empty() && cp.model.size() != init_model.size()) {
    return FailedPreconditionError("checkpoint has " + std::to_string(cp.model.size()) +
                                   " parameters, the model has " +
                                   std::to_string(init_model.size()));
  }
  COHORT_RETURN_IF_ERROR(strategy_->LoadState(cp));
  global_ = std::move(cp.model);
  version_ = cp.round;
  if (version_ == 0) return OkStatus();  // Nothing committed: a new run's schedule.
  if (cp.schedule.empty()) {
    env_->Log().info(
        "fedbuff: resuming after committed version {}; the store holds no schedule (written by "
        "an older build): groups in flight when the run stopped are abandoned, every client "
        "starts free",
        version_);
    return OkStatus();
  }
  COHORT_RETURN_IF_ERROR(RestoreSchedule(cp));
  env_->Log().info(
      "fedbuff: resuming after committed version {}: {} groups in flight re-open from their base "
      "versions at their virtual times; the clock goes on from {:.3f} s",
      version_, to_reopen_.size(), start_time_ / 1000.0);
  return OkStatus();
}

Status FedBuffEngine::RestoreSchedule(const store::Checkpoint& cp) {
  const std::string what =
      "fedbuff: the schedule committed with version " + std::to_string(cp.round);
  checkpoint::FedBuffSchedule s;
  if (!s.ParseFromString(cp.schedule)) return DataLossError(what + " does not parse");
  if (s.version() != cp.round) {
    return DataLossError(what + " names version " + std::to_string(s.version()));
  }
  if (s.clock_ms() < 0) return DataLossError(what + " has a negative virtual time");
  std::set<std::string> names;
  for (const std::string& name : s.free()) {
    if (!names.insert(name).second) {
      return DataLossError(what + ": client " + name + " is in the schedule twice");
    }
  }
  start_time_ = s.clock_ms();
  std::set<uint64_t> ids;
  for (const checkpoint::FedBuffGroup& pg : s.groups()) {
    COHORT_RETURN_IF_ERROR(CheckScheduledGroup(pg, s, cp.round, config_.fedbuff().buffer_size(),
                                               global_.size(), what));
    if (!ids.insert(pg.id()).second) {
      return DataLossError(what + ": group " + std::to_string(pg.id()) +
                           " is in the schedule twice");
    }
    Group g;
    g.id = pg.id();
    g.base_version = pg.base_version();
    g.base = ModelFromBytes(pg.base_model());
    g.opened_at = pg.opened_ms();
    g.closes_at_commit = pg.closes_at_commit();
    for (const std::string& name : pg.members()) {
      if (!names.insert(name).second) {
        return DataLossError(what + ": client " + name + " is in the schedule twice");
      }
      g.members.push_back(name);
    }
    std::sort(g.members.begin(), g.members.end());
    start_time_ = std::min(start_time_, g.opened_at);
    to_reopen_.push_back(std::move(g));
  }
  std::stable_sort(to_reopen_.begin(), to_reopen_.end(), [](const Group& a, const Group& b) {
    return a.opened_at != b.opened_at ? a.opened_at < b.opened_at : a.id < b.id;
  });
  free_.assign(s.free().begin(), s.free().end());
  banned_.insert(s.banned().begin(), s.banned().end());
  next_group_ = s.next_group();
  resume_at_ = s.clock_ms();
  scheduled_ = std::move(names);
  return OkStatus();
}

std::string FedBuffEngine::SaveSchedule(const Group& g, uint32_t version, TimeMs now) const {
  checkpoint::FedBuffSchedule s;
  s.set_version(version);
  s.set_clock_ms(now);
  s.set_next_group(next_group_);
  // g's members are freed right after this commit, in this order.
  for (const std::string& name : free_) s.add_free(name);
  for (const std::string& name : g.members) {
    if (Drawable(name)) s.add_free(name);
  }
  for (const auto& [name, why] : banned_) (*s.mutable_banned())[name] = why;
  auto put = [&s](const Group& o, bool closing) {
    checkpoint::FedBuffGroup& pg = *s.add_groups();
    pg.set_id(o.id);
    pg.set_base_version(o.base_version);
    pg.set_opened_ms(o.opened_at);
    for (const std::string& name : o.members) pg.add_members(name);
    pg.set_closes_at_commit(closing);
    pg.set_base_model(ModelBytes(o.base));
  };
  // A group closes in this pass when its engine is done, or waits for
  // members that stopped answering (CloseDoneGroups).
  for (const auto& [id, o] : groups_) {
    if (id != g.id) put(o, o.engine->done() || !o.engine->AwaitedAbsentClients().empty());
  }
  for (const Group& o : to_reopen_) put(o, o.closes_at_commit);
  return s.SerializeAsString();
}

std::vector<Outgoing> FedBuffEngine::OnMessage(const std::string& peer,
                                               const net::Envelope& envelope, TimeMs now,
                                               const AuthenticatedPeer* sender) {
  std::vector<Outgoing> out;
  const wire::Header& h = envelope.header;
  if (h.body_case() == wire::Header::kHello) {
    OnHello(peer, envelope, now, sender, out);
  } else if (const std::string* registered = clients_.NameOf(peer); registered == nullptr) {
    out.push_back(ErrorMessage(peer, wire::UNKNOWN_CLIENT, "unknown client; send hello", version_));
  } else if (sender != nullptr && *registered != sender->name) {
    out.push_back(ErrorMessage(peer, wire::UNKNOWN_CLIENT,
                               "this connection is registered as another client; send hello",
                               version_));
  } else {
    const std::string name = *registered;
    clients_.Seen(name, now);
    WelcomeBack(name);
    if (!done_) {
      Route(name, peer, envelope, now, out);
    } else if (h.has_heartbeat() && h.heartbeat().finished()) {
      clients_.AcknowledgeFinish(name);
    } else {
      out.push_back(FinishedMessage(peer, version_));
    }
  }
  CloseDoneGroups(now, out);
  return out;
}

void FedBuffEngine::OnHello(const std::string& peer, const net::Envelope& envelope, TimeMs now,
                            const AuthenticatedPeer* sender, std::vector<Outgoing>& out) {
  const wire::Hello& hello = envelope.header.hello();
  std::optional<crypto::Ed25519Public> identity;
  const bool secure = config_.secagg().aggregation() != config::PLAIN;
  if (auto refusal = clients_.CheckHello(hello, sender, secure, identity)) {
    out.push_back(refusal->malformed
                      ? ErrorMessage(peer, wire::MALFORMED, refusal->reason, version_)
                      : RejectMessage(peer, refusal->reason));
    return;
  }
  const std::string& name = hello.client_name();
  clients_.Register(peer, hello, identity, now);
  out.push_back(
      WelcomeMessage(peer, name, config_, static_cast<uint32_t>(global_.size()), run_nonce_));
  if (done_) {
    out.push_back(FinishedMessage(peer, version_));
    return;
  }
  auto [it, is_new] = members_.try_emplace(name);
  Member& m = it->second;
  m.peer = peer;
  m.hello = envelope;
  m.sender = sender != nullptr ? std::optional<AuthenticatedPeer>(*sender) : std::nullopt;
  const bool was_out = std::exchange(m.revoked, false) | std::exchange(m.silent, false);
  if (banned_.count(name) != 0) {
    // Registered (it is told the run is done at the end), never drawn.
  } else if ((is_new && scheduled_.count(name) == 0) ||
             (was_out && m.group == 0 && !Reopening(name))) {
    free_.push_back(name);  // A resumed schedule already places the clients it names.
  } else if (m.group != 0) {
    // Its group's engine decides what a reconnection means for the round.
    Forward(groups_.at(m.group).engine->OnMessage(peer, envelope, now, sender), out);
  }
  MaybeOpenGroups(now, out);
}

void FedBuffEngine::Route(const std::string& name, const std::string& peer,
                          const net::Envelope& envelope, TimeMs now, std::vector<Outgoing>& out) {
  const Member& m = members_.at(name);
  if (m.group != 0) {
    Forward(
        groups_.at(m.group).engine->OnMessage(peer, envelope, now, m.sender ? &*m.sender : nullptr),
        out);
    return;
  }
  switch (envelope.header.body_case()) {
    case wire::Header::kHeartbeat:
      out.push_back(HeartbeatAckMessage(peer));
      return;
    case wire::Header::kGoodbye:
      return;  // Leaving a group that is already closed.
    default:
      out.push_back(ErrorMessage(peer, wire::STALE,
                                 "no group of this run waits on " + name +
                                     " (its group has closed); wait for the next task",
                                 version_));
  }
}

void FedBuffEngine::Forward(std::vector<Outgoing> from_group, std::vector<Outgoing>& out) {
  for (Outgoing& o : from_group) {
    const auto body = o.header.body_case();
    if (body == wire::Header::kWelcome || body == wire::Header::kFinished) continue;
    out.push_back(std::move(o));
  }
}

void FedBuffEngine::MaybeOpenGroups(TimeMs now, std::vector<Outgoing>& out) {
  const uint32_t k = config_.fedbuff().buffer_size();
  const size_t max_groups = config_.fedbuff().concurrency() / k;
  if (resume_at_.has_value() && !CatchUp(now, out)) return;
  SetAsideSilent(now);
  while (!done_ && store_error_.ok() && groups_.size() < max_groups && free_.size() >= k) {
    Status opened = OpenGroup(now, out);
    if (!opened.ok()) store_error_ = opened.WithContext("fedbuff: opening a group");
  }
}

void FedBuffEngine::SetAsideSilent(TimeMs now) {
  clients_.ExpireSilent(now);  // The registry's active flags, up to `now`.
  for (auto it = free_.begin(); it != free_.end();) {
    const ClientRegistry::Client* c = clients_.Find(*it);
    if (c == nullptr || c->active) {
      ++it;
      continue;
    }
    env_->Log().warn(
        "fedbuff: client {}: no message for {:.1f} s; drawn into no group until it "
        "speaks again",
        *it, (now - c->last_seen) / 1000.0);
    members_.at(*it).silent = true;
    it = free_.erase(it);
  }
}

bool FedBuffEngine::Reopening(const std::string& name) const {
  return std::any_of(to_reopen_.begin(), to_reopen_.end(), [&name](const Group& g) {
    return std::find(g.members.begin(), g.members.end(), name) != g.members.end();
  });
}

void FedBuffEngine::WelcomeBack(const std::string& name) {
  auto it = members_.find(name);
  if (it == members_.end() || !it->second.silent) return;
  it->second.silent = false;
  if (it->second.group == 0 && Drawable(name)) free_.push_back(name);
}

bool FedBuffEngine::Drawable(const std::string& name) const {
  return !members_.at(name).revoked && banned_.count(name) == 0;
}

config::RunConfig FedBuffEngine::GroupConfig(uint64_t id) const {
  config::RunConfig g = config_;
  g.clear_fedbuff();
  // Each group's tasks train with seeds of their own (the strategy seeds
  // by the config's seed and the round, 1 in every group).
  g.set_seed(DeriveSeed(config_.seed(), 0xfedb0ff, id));
  config::RoundsConfig& r = *g.mutable_rounds();
  r.set_num_rounds(1);
  r.set_start_clients(config_.fedbuff().buffer_size());
  r.set_keep_checkpoints(1);
  config::ServerConfig& s = *g.mutable_server();
  s.set_optimizer(config::FEDAVG);
  s.set_learning_rate(1);
  s.set_momentum(0);
  s.clear_beta_1();
  s.clear_beta_2();
  s.clear_tau();
  return g;
}

bool FedBuffEngine::CatchUp(TimeMs now, std::vector<Outgoing>& out) {
  while (!done_ && store_error_.ok() && !to_reopen_.empty() &&
         to_reopen_.front().opened_at <= now) {
    const Group& next = to_reopen_.front();
    for (const std::string& name : next.members) {
      if (members_.count(name) == 0) return false;  // Not registered yet (OnTick reports).
    }
    if (next.opened_at < now) {
      env_->Log().warn(
          "fedbuff: group {} re-opens at {:.3f} s, after its opening at {:.3f} s: the resumed "
          "run may depart from the uninterrupted one",
          next.id, now / 1000.0, next.opened_at / 1000.0);
    }
    Group g = std::move(to_reopen_.front());
    to_reopen_.pop_front();
    Status opened = StartGroup(std::move(g), now, out);
    if (!opened.ok()) store_error_ = opened.WithContext("fedbuff: re-opening a group");
  }
  if (!to_reopen_.empty() || now < *resume_at_) return false;
  for (const std::string& name : scheduled_) {
    if (members_.count(name) == 0) return false;  // New groups draw on every free client.
  }
  for (const auto& [id, g] : groups_) {
    if (g.closes_at_commit) return false;
  }
  env_->Log().info("fedbuff: the resumed schedule has caught up at {:.3f} s (version {})",
                   now / 1000.0, version_);
  resume_at_.reset();
  scheduled_.clear();
  return true;
}

Status FedBuffEngine::OpenGroup(TimeMs now, std::vector<Outgoing>& out) {
  Group g;
  g.id = next_group_++;
  g.base_version = version_;
  g.base = global_;
  for (uint32_t i = 0; i < config_.fedbuff().buffer_size(); ++i) {
    g.members.push_back(std::move(free_.front()));
    free_.pop_front();
  }
  std::sort(g.members.begin(), g.members.end());
  return StartGroup(std::move(g), now, out);
}

Status FedBuffEngine::StartGroup(Group g, TimeMs now, std::vector<Outgoing>& out) {
  g.opened_at = now;
  COHORT_ASSIGN_OR_RETURN(g.store, store::OpenSqliteRunStore(":memory:", env_));
  COHORT_ASSIGN_OR_RETURN(g.engine,
                          RoundEngine::Create(GroupConfig(g.id), g.base, g.store.get(), Evaluator(),
                                              "fedbuff group", group_env_.get()));
  idle_limits_ = g.engine->limits();  // Before its round starts.
  Group& placed = groups_.emplace(g.id, std::move(g)).first->second;
  env_->Log().debug("fedbuff: group {} of {} clients from version {}", placed.id,
                    placed.members.size(), placed.base_version);
  // Its engine registers the members as a coordinator would; the last
  // Hello starts its round (rounds.start_clients is the group's size).
  for (const std::string& name : placed.members) {
    Member& m = members_.at(name);
    m.group = placed.id;
    Forward(placed.engine->OnMessage(m.peer, m.hello, now, m.sender ? &*m.sender : nullptr), out);
  }
  return OkStatus();
}

void FedBuffEngine::CloseDoneGroups(TimeMs now, std::vector<Outgoing>& out) {
  const uint32_t versions = config_.rounds().num_rounds();
  for (auto it = groups_.begin(); it != groups_.end() && version_ < versions;) {
    Group& g = it->second;
    if (!g.engine->store_error().ok()) store_error_ = g.engine->store_error();
    // A group's clients are fixed: one whose round must run again with too
    // few of them answering would wait, holding the others, for ever.
    const std::vector<std::string> absent =
        g.engine->done() ? std::vector<std::string>() : g.engine->AwaitedAbsentClients();
    if (!g.engine->done() && absent.empty()) {
      ++it;
      continue;
    }
    CloseGroup(g, absent, now);
    it = groups_.erase(it);
  }
  if (!done_ && version_ >= versions) Finish(out);
  MaybeOpenGroups(now, out);
}

void FedBuffEngine::CloseGroup(Group& g, const std::vector<std::string>& absent, TimeMs now) {
  // Before the commit, whose schedule keeps them.
  for (const auto& [name, why] : g.engine->banned()) {
    if (banned_.emplace(name, why).second) {
      env_->Log().warn("fedbuff: client {} is drawn into no later group: {} (group {})", name, why,
                       g.id);
    }
  }
  const std::vector<store::RoundRecord> records = g.engine->TakeCommitted();
  const uint32_t before = version_;
  std::string why = "not applied";
  if (!records.empty() && records.back().outcome == "committed") {
    if (Status applied = ApplyGroup(g, records.back(), now); !applied.ok()) store_error_ = applied;
  } else {
    std::string names;
    for (const std::string& name : absent) names += (names.empty() ? "" : ", ") + name;
    why = !absent.empty() ? fmt::format(
                                "its round must run again, and fewer of its members answer than "
                                "rounds.min_clients ({}): {} stopped answering",
                                config_.rounds().min_clients(), names)
          : records.empty() ? "no record"
                            : records.back().outcome_reason;
    env_->Log().warn("fedbuff: group {} (from version {}) {}: {}; the model is unchanged", g.id,
                     g.base_version, absent.empty() ? "aborted" : "closed", why);
  }
  CountGroupsWithoutAVersion(version_ > before, why);
  for (const std::string& name : g.members) {
    Member& m = members_.at(name);
    m.group = 0;
    // One that stopped answering waits, as a silent free client does,
    // until it speaks again (WelcomeBack).
    m.silent = std::find(absent.begin(), absent.end(), name) != absent.end();
    if (Drawable(name) && !m.silent) free_.push_back(name);
  }
}

void FedBuffEngine::CountGroupsWithoutAVersion(bool committed, const std::string& why) {
  if (committed) {
    groups_without_version_ = 0;
    return;
  }
  if (++groups_without_version_ < kMaxGroupsWithoutVersion || !store_error_.ok()) return;
  store_error_ = FailedPreconditionError(fmt::format(
      "fedbuff: {} groups in a row closed without a new version after version {} (the last: {}); "
      "the run stops rather than retrain them forever: if clients were cut at the deadline, "
      "check rounds.round_deadline_s ({:g} s) against the clients' training time, and "
      "secagg.expected_dropout; if their updates were refused, the reason names the check",
      groups_without_version_, version_, why, config_.rounds().round_deadline_s()));
}

Status FedBuffEngine::ApplyGroup(Group& g, const store::RoundRecord& group_record, TimeMs now) {
  // The group's server step was FedAvg at learning rate 1 from g.base.
  const std::span<const float> after = g.engine->global_model();
  std::vector<float> mean(after.size());
  for (size_t i = 0; i < mean.size(); ++i) mean[i] = after[i] - g.base[i];
  const uint32_t staleness = version_ - g.base_version;
  std::vector<float> model = global_;
  fedbuff_->SetStaleness(staleness);
  StatusOr<std::optional<EvalMetrics>> metrics = StepAndEvaluate(*strategy_, mean, model);
  if (!metrics.ok()) {
    env_->Log().error("fedbuff: group {} not applied: {}; the model is unchanged", g.id,
                      metrics.status().message());
    return OkStatus();
  }
  strategy_->CommitAggregate();
  global_ = std::move(model);
  return CommitVersion(g, group_record, staleness, metrics->value_or(EvalMetrics{-1, -1}), now);
}

Status FedBuffEngine::CommitVersion(const Group& g, store::RoundRecord record, uint32_t staleness,
                                    const EvalMetrics& metrics, TimeMs now) {
  record.round = version_ + 1;
  record.test_accuracy = metrics.accuracy;
  record.test_loss = metrics.loss;
  COHORT_ASSIGN_OR_RETURN(std::vector<store::ClientRoundRecord> clients, g.store->ClientRounds(1));
  store::Checkpoint cp{record.round, global_, {}};
  strategy_->SaveState(cp);
  cp.schedule = SaveSchedule(g, record.round, now);
  COHORT_RETURN_IF_ERROR(
      store_->CommitRound(record, clients, cp, config_.rounds().keep_checkpoints()));
  version_ = record.round;
  committed_.push_back(record);
  env_->Log().info(
      "fedbuff: version {}: group {} ({} of {} clients) from version {}, staleness {}, weight "
      "{:.4f}",
      version_, g.id, record.participants, record.selected, g.base_version, staleness,
      FedBuffStalenessWeight(staleness));
  return OkStatus();
}

void FedBuffEngine::Finish(std::vector<Outgoing>& out) {
  done_ = true;
  env_->Log().info("run finished after {} versions ({} groups still in flight are dropped)",
                   version_, groups_.size());
  groups_.clear();
  free_.clear();
  for (auto& [name, m] : members_) {
    m.group = 0;  // Its group is gone: a later Revoke rejects it directly.
    out.push_back(FinishedMessage(m.peer, version_));
  }
}

std::vector<Outgoing> FedBuffEngine::OnTick(TimeMs now) {
  std::vector<Outgoing> out;
  // Before anything else: NextWakeup asks for the next timeout, so a tick
  // at it must move the registry past it (while a resume catches up too,
  // when no group is drawn), or a driver would wake at the same time forever.
  clients_.ExpireSilent(now);
  if (resume_at_.has_value() && now >= start_time_ + registration_grace_) {
    CheckScheduledClients();
    if (now >= *resume_at_) resume_ticked_ = true;
  }
  for (auto& [id, g] : groups_) Forward(g.engine->OnTick(now), out);
  CloseDoneGroups(now, out);  // Then MaybeOpenGroups sets the silent aside.
  return out;
}

void FedBuffEngine::CheckScheduledClients() {
  std::vector<std::string> missing;
  for (const std::string& name : scheduled_) {
    if (members_.count(name) == 0) missing.push_back(name);
  }
  if (missing.empty() || !store_error_.ok()) return;
  if (registration_grace_ == 0) {
    // The simulator registers every client before its first tick.
    // Every one is named (the first five, and how many more), not only the
    // first: one line tells the operator the whole of what changed.
    const size_t shown = std::min<size_t>(missing.size(), 5);
    std::string names;
    for (size_t i = 0; i < shown; ++i) names += (i == 0 ? "" : ", ") + missing[i];
    if (missing.size() > shown) names += fmt::format(" and {} more", missing.size() - shown);
    const bool one = missing.size() == 1;
    store_error_ = FailedPreconditionError(fmt::format(
        "fedbuff: resuming after version {}: {} {} of the committed schedule {} not registered "
        "(the run's clients changed, or {} offline)",
        version_, one ? "client" : "clients", names, one ? "has" : "have",
        one ? "it is" : "they are"));
    return;
  }
  // A daemon's client may be down: the run goes on without it, and a group
  // in flight that it was in is abandoned (its other members are free).
  auto is_missing = [&missing](const std::string& name) {
    return std::find(missing.begin(), missing.end(), name) != missing.end();
  };
  // Each missing member of an abandoned group names it, not only the first.
  std::map<std::string, std::string> abandoned;
  for (const std::string& name : missing) {
    scheduled_.erase(name);  // Its Hello, if it comes, makes it free.
    for (auto it = to_reopen_.begin(); it != to_reopen_.end();) {
      if (std::find(it->members.begin(), it->members.end(), name) == it->members.end()) {
        ++it;
        continue;
      }
      const std::string why = fmt::format(
          "; group {} (from version {}), which it was in, is abandoned", it->id, it->base_version);
      for (const std::string& m : it->members) {
        if (is_missing(m)) {
          abandoned[m] = why;
        } else if (Drawable(m)) {
          free_.push_back(m);
        }
      }
      it = to_reopen_.erase(it);
    }
    env_->Log().warn(
        "fedbuff: resuming after version {}: client {} of the committed schedule has not "
        "registered within {:g} s of the restart; the run goes on without it, and it is drawn "
        "into no group until it registers{}",
        version_, name, registration_grace_ / 1000.0, abandoned[name]);
  }
  free_.erase(std::remove_if(free_.begin(), free_.end(), is_missing), free_.end());
}

std::vector<Outgoing> FedBuffEngine::OnMalformed(const std::string& peer, const Status& why) {
  const std::string* name = clients_.NameOf(peer);
  env_->Log().warn("rejected message from {}: {}", name ? *name : "unregistered peer",
                   why.message());
  std::vector<Outgoing> out;
  out.push_back(ErrorMessage(
      peer, why.code() == StatusCode::kResourceExhausted ? wire::TOO_LARGE : wire::MALFORMED,
      std::string(why.message()), version_));
  return out;
}

std::vector<Outgoing> FedBuffEngine::Revoke(const std::string& name, const std::string& why,
                                            TimeMs now) {
  std::vector<Outgoing> out;
  const ClientRegistry::Client* client = clients_.Find(name);
  if (client == nullptr || client->peer.empty()) return out;
  const std::string peer = client->peer;
  clients_.SetInactive(name);
  auto it = members_.find(name);
  if (it == members_.end() || it->second.group == 0) {
    out.push_back(RejectMessage(peer, why));
  } else {
    // Its group's engine sends the Reject and takes it out of the round.
    Forward(groups_.at(it->second.group).engine->Revoke(name, why, now), out);
  }
  if (it != members_.end()) {
    it->second.revoked = true;
    free_.erase(std::remove(free_.begin(), free_.end(), name), free_.end());
  }
  CloseDoneGroups(now, out);
  return out;
}

net::Limits FedBuffEngine::limits() const {
  net::Limits l = idle_limits_;
  for (const auto& [id, g] : groups_) {
    const net::Limits group = g.engine->limits();
    l.max_header_bytes = std::max(l.max_header_bytes, group.max_header_bytes);
    l.max_payload_floats = std::max(l.max_payload_floats, group.max_payload_floats);
    l.max_payload_frames = std::max(l.max_payload_frames, group.max_payload_frames);
  }
  return l;
}

std::optional<TimeMs> FedBuffEngine::NextWakeup() const {
  std::optional<TimeMs> next;
  auto earliest = [&next](std::optional<TimeMs> w) {
    if (w && (!next || *w < *next)) next = w;
  };
  for (const auto& [id, g] : groups_) earliest(g.engine->NextWakeup());
  if (!to_reopen_.empty()) earliest(to_reopen_.front().opened_at);
  if (resume_at_.has_value() && !resume_ticked_) earliest(resume_at_);
  if (!free_.empty()) earliest(clients_.NextTimeout());  // SetAsideSilent's.
  return next;
}

}  // namespace cohort::coordinator
