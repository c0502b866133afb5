// The round engine's secure-aggregation half: binds aggregation::SecAggServer
// to the round. Stage numbers are those of aggregation/secagg.h:
//   1 commit_seed     (runs while clients train; stage timeout)
//   2 advertise_keys  (stage timeout)
//   3 share_keys      (stage timeout)
//   4 check_shares    (stage timeout)
//   5 confirm_checked (stage timeout)
//   6 masked_input    (the round deadline)
//   7 consistency     (stage timeout)
//   8 unmasking       (stage timeout)
// A stage closes when every client still in the round has answered, or at
// its deadline; whoever has not answered then leaves the round at that stage.
// A client the protocol proves misbehaving (a bad key, shares that do not
// open, a false complaint, a forged share) is named and leaves the round.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "coordinator/round_engine.h"
#include "crypto/keys.h"
#include "aggregation/secagg_wire.h"

namespace cohort::coordinator {
namespace {

constexpr const char* kStageNames[] = {"",
                                       "commit_seed",
                                       "advertise_keys",
                                       "share_keys",
                                       "check_shares",
                                       "confirm_checked",
                                       "masked_input",
                                       "consistency",
                                       "unmasking"};

TimeMs SecondsToMs(float s) { return static_cast<TimeMs>(std::llround(double{s} * 1000.0)); }

crypto::MaskPrg MaskPrgOf(config::MaskPrg prg) {
  switch (prg) {
    case config::AES256_CTR:
      return crypto::MaskPrg::kAes256Ctr;
    case config::CHACHA20:
      return crypto::MaskPrg::kChaCha20;
    default:
      return crypto::MaskPrg::kAes128Ctr;
  }
}

wire::Header NewHeader() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

}  // namespace

const char* RoundEngine::SecAggStageName() const { return kStageNames[stage_]; }

bool RoundEngine::secure() const { return config_.secagg().aggregation() != config::PLAIN; }

uint32_t RoundEngine::MinClients() const {
  const uint32_t floor = config_.rounds().min_clients();
  if (!secure()) return floor;
  // The smallest cohort with a threshold for the corrupt fraction: 2 when
  // no client is assumed to collude with the coordinator, 3 at the default.
  const auto& sc = config_.secagg();
  uint32_t n = std::max<uint32_t>(2, floor);
  while (n < 64 && !aggregation::ChooseSecAggParams(n, sc.expected_dropout(), sc.corrupt_fraction(),
                                                    sc.aggregation() == config::SECAGG, 1)
                        .ok()) {
    ++n;
  }
  return n;
}

Status RoundEngine::StartSecAgg(std::span<const std::string> cohort) {
  const auto& sc = config_.secagg();
  const uint32_t round = round_ + 1;
  // The vector is the model delta followed by the training metrics.
  COHORT_ASSIGN_OR_RETURN(
      secagg_params_,
      aggregation::ChooseSecAggParams(static_cast<uint32_t>(cohort.size()), sc.expected_dropout(),
                                      sc.corrupt_fraction(), sc.aggregation() == config::SECAGG,
                                      global_.size() + aggregation::kSecureMetricSlots));
  // Each client weighs its update by num_samples / cohort_weight_, so the
  // weights of the cohort sum to at most 1 and the scale does not depend on
  // how much data clients claim.
  COHORT_ASSIGN_OR_RETURN(fixed_point_, aggregation::ChooseFixedPoint(
                                            sc.clip(), 1.0, static_cast<uint32_t>(cohort.size())));
  cohort_weight_ = 0;
  cohort_identities_.clear();
  for (size_t i = 0; i < cohort.size(); ++i) {
    const Client& c = clients_.at(cohort[i]);
    if (!c.identity) return FailedPreconditionError("client " + cohort[i] + " has no identity key");
    cohort_identities_.push_back(*c.identity);
    cohort_weight_ += static_cast<double>(participants_[i].num_samples);
  }
  secagg_params_.prg = MaskPrgOf(sc.mask_prg());
  {
    // Fresh per round: sessions never repeat, even when a round is replayed.
    env_->RandomBytes(secagg_nonce_);
  }
  secagg_params_.roster = aggregation::RosterTree(cohort_identities_).root();
  secagg_params_.context =
      aggregation::SecAggContext(secagg_nonce_, round, task_id_, secagg_params_, fixed_point_.clip,
                                 fixed_point_.scale, cohort_weight_);
  COHORT_ASSIGN_OR_RETURN(aggregator_, aggregation::NewSecureAggregator(
                                           secagg_params_, cohort_identities_, fixed_point_,
                                           cohort_weight_, global_.size(), env_));
  aggregation_seconds_ = 0;
  stage_ = 1;
  stage_deadline_ = round_started_ + SecondsToMs(sc.stage_timeout_s());
  return OkStatus();
}

int RoundEngine::LiveWaiting() const {
  int waiting = 0;
  for (const auto& p : participants_) {
    if (!p.left && p.answered < stage_) ++waiting;
  }
  return waiting;
}

void RoundEngine::LeaveSecAgg(Participant& p, Participant::State state, std::string reason) {
  p.left = true;
  p.stage = kStageNames[stage_];
  // After its masked input a client's update is in the sum whatever happens
  // next: it stays "ok".
  if (p.state != Participant::State::kOk) {
    p.state = state;
    p.reason = std::move(reason);
  } else {
    p.reason = "left during " + p.stage + ": " + reason;
  }
}

void RoundEngine::TakeSecAggBlame() {
  for (auto& m : secagg()->TakeMisbehaviour()) {
    Participant& p = participants_[m.client];
    env_->Log().warn("client {} misbehaved in round {} ({}): {}", p.name, round_ + 1,
                     kStageNames[stage_], m.what);
    const std::string reason = "misbehaved: " + m.what;
    Ban(p, reason);
    if (p.state == Participant::State::kOk) {
      // Its input is in the sum already: it stays "ok", and is named.
      p.reason = reason;
    } else if (!p.left) {
      LeaveSecAgg(p, Participant::State::kRejected, reason);
    } else if (p.reason.rfind("misbehaved", 0) != 0) {
      p.reason = reason + (p.reason.empty() ? "" : "; " + p.reason);
    }
  }
}

void RoundEngine::Ban(Participant& p, const std::string& why) {
  if (banned_.emplace(p.name, why).second) {
    env_->Log().warn("client {} is excluded from the rest of the run: {}", p.name, why);
  }
}

RoundEngine::Participant* RoundEngine::SecAggSender(const std::string& peer, uint32_t round,
                                                    uint64_t task_id, int stage,
                                                    const std::string& what, TimeMs now,
                                                    std::vector<Outgoing>& out) {
  const std::string* name = NameOf(peer);
  if (name == nullptr) {
    out.push_back(MakeError(peer, wire::UNKNOWN_CLIENT, "unknown client; send hello"));
    return nullptr;
  }
  Seen(*name, clients_[*name], now);
  const uint32_t current = round_ + 1;
  std::string why;
  Participant* p = nullptr;
  if (phase_ != Phase::kTraining || !secagg() || round != current || task_id != task_id_) {
    why = what + " for round " + std::to_string(round) + ", which is not in progress";
  } else if ((p = FindParticipant(*name)) == nullptr) {
    out.push_back(
        MakeError(peer, wire::NOT_SELECTED, "not selected for round " + std::to_string(current)));
    return nullptr;
  } else if (p->left) {
    why = what + " after leaving round " + std::to_string(current) + " (" + p->reason + ")";
  } else if (stage_ != stage || p->answered != stage - 1) {
    why = what + " during stage " + kStageNames[stage_] + " of round " + std::to_string(current);
  }
  if (!why.empty()) {
    env_->Log().warn("client {}: rejected {}", *name, why);
    out.push_back(MakeError(peer, wire::STALE, why));
    return nullptr;
  }
  return p;
}

void RoundEngine::OnSecAggMessage(const std::string& peer, const net::Envelope& envelope,
                                  TimeMs now, std::vector<Outgoing>& out) {
  const wire::Header& h = envelope.header;
  const double started = env_->MonotonicSeconds();
  Participant* p = nullptr;
  Status status;
  auto index_of = [this](const Participant* q) {
    return static_cast<uint32_t>(q - participants_.data());
  };
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed: {
      const auto& m = h.secagg_seed();
      p = SecAggSender(peer, m.round(), m.task_id(), 1, "seed commitment", now, out);
      if (p == nullptr) return;
      auto commit = aggregation::FromWire(m, index_of(p));
      status = commit.ok() ? secagg()->OnSeedCommit(*commit) : commit.status();
      break;
    }
    case wire::Header::kSecaggKeys: {
      const auto& m = h.secagg_keys();
      p = SecAggSender(peer, m.round(), m.task_id(), 2, "key advert", now, out);
      if (p == nullptr) return;
      auto advert = aggregation::FromWire(m, index_of(p));
      status = advert.ok() ? secagg()->OnAdvertise(*advert) : advert.status();
      break;
    }
    case wire::Header::kSecaggShares: {
      const auto& m = h.secagg_shares();
      p = SecAggSender(peer, m.round(), m.task_id(), 3, "shares", now, out);
      if (p == nullptr) return;
      auto shares = aggregation::FromWire(m, index_of(p));
      status = shares.ok() ? secagg()->OnShares(std::move(*shares)) : shares.status();
      break;
    }
    case wire::Header::kSecaggShareCheck: {
      const auto& m = h.secagg_share_check();
      p = SecAggSender(peer, m.round(), m.task_id(), 4, "share check", now, out);
      if (p == nullptr) return;
      auto check = aggregation::FromWire(m, index_of(p));
      status = check.ok() ? secagg()->OnShareCheck(*check) : check.status();
      break;
    }
    case wire::Header::kSecaggConfirm: {
      const auto& m = h.secagg_confirm();
      p = SecAggSender(peer, m.round(), m.task_id(), 5, "checked-list confirmation", now, out);
      if (p == nullptr) return;
      auto c = aggregation::FromWire(m, index_of(p));
      status = c.ok() ? secagg()->OnConfirmation(*c) : c.status();
      break;
    }
    case wire::Header::kSecaggSignature: {
      const auto& m = h.secagg_signature();
      p = SecAggSender(peer, m.round(), m.task_id(), 7, "survivor signature", now, out);
      if (p == nullptr) return;
      auto sig = aggregation::FromWire(m, index_of(p));
      status = sig.ok() ? secagg()->OnSignature(*sig) : sig.status();
      break;
    }
    case wire::Header::kSecaggUnmask: {
      const auto& m = h.secagg_unmask();
      p = SecAggSender(peer, m.round(), m.task_id(), 8, "unmasking shares", now, out);
      if (p == nullptr) return;
      auto r = aggregation::FromWire(m, index_of(p));
      status = r.ok() ? secagg()->OnUnmask(std::move(*r)) : r.status();
      break;
    }
    default:
      return;
  }
  aggregation_seconds_ += env_->MonotonicSeconds() - started;
  TakeSecAggBlame();
  if (!status.ok()) {
    const std::string why = "client " + p->name + ", round " + std::to_string(round_ + 1) + ", " +
                            kStageNames[stage_] + ": " + status.message();
    env_->Log().warn("rejected secure-aggregation message: {}", why);
    if (!p->left) LeaveSecAgg(*p, Participant::State::kRejected, status.message());
    out.push_back(MakeError(peer, wire::SECAGG_REFUSED, why));
  } else if (!p->left) {
    p->answered = stage_;
  }
  AdvanceSecAgg(now, out);
}

void RoundEngine::AbortRound(TimeMs now, const std::string& why, std::vector<Outgoing>& out) {
  env_->Log().warn("round {}: {}; the model is unchanged and the run goes on", round_ + 1, why);
  // The inputs were never unmasked: none counts.
  for (auto& p : participants_) {
    if (p.state == Participant::State::kPending || p.state == Participant::State::kOk) {
      p.state = Participant::State::kDropped;
      if (p.reason.empty()) p.reason = "round aborted: " + why;
    }
  }
  CommitRound(now, nullptr, aggregation_seconds_, why, out);
}

void RoundEngine::BroadcastSecAgg(const wire::Header& h, std::vector<Outgoing>& out) {
  for (const auto& p : participants_) {
    if (p.left) continue;
    Outgoing o;
    o.peer = clients_[p.name].peer;
    o.header = h;
    out.push_back(std::move(o));
  }
}

void RoundEngine::SendSecAgg(uint32_t index, wire::Header h, std::vector<Outgoing>& out) {
  const Participant& p = participants_[index];
  if (p.left) return;
  Outgoing o;
  o.peer = clients_[p.name].peer;
  o.header = std::move(h);
  out.push_back(std::move(o));
}

Status RoundEngine::CloseSecAggStage(TimeMs now, std::vector<Outgoing>& out) {
  const uint32_t round = round_ + 1;
  const TimeMs stage_timeout = SecondsToMs(config_.secagg().stage_timeout_s());
  switch (stage_) {
    case 1: {
      COHORT_ASSIGN_OR_RETURN(auto roots, secagg()->CloseSeedCommit());
      for (const auto& [index, root] : roots) {
        SendSecAgg(index, aggregation::ToWire(round, task_id_, root), out);
      }
      break;
    }
    case 2: {
      COHORT_ASSIGN_OR_RETURN(auto lists, secagg()->CloseAdvertise());
      for (const auto& [index, list] : lists)
        SendSecAgg(index, aggregation::ToWire(round, task_id_, list), out);
      break;
    }
    case 3: {
      COHORT_ASSIGN_OR_RETURN(auto inbound, secagg()->CloseShares());
      for (const auto& [index, shares] : inbound) {
        SendSecAgg(index, aggregation::ToWire(round, task_id_, shares), out);
      }
      break;
    }
    case 4: {
      COHORT_ASSIGN_OR_RETURN(aggregation::CheckedList checked, secagg()->CloseShareCheck());
      wire::Header h = NewHeader();
      auto* m = h.mutable_secagg_checked();
      m->set_round(round);
      m->set_task_id(task_id_);
      for (uint32_t u : checked.members) m->add_members(u);
      BroadcastSecAgg(h, out);
      break;
    }
    case 5: {
      COHORT_ASSIGN_OR_RETURN(auto confirmations, secagg()->CloseConfirmation());
      for (const auto& [index, c] : confirmations) {
        SendSecAgg(index, aggregation::ToWire(round, task_id_, c), out);
      }
      // Clients can mask only now: slow key-exchange stages must not eat the
      // whole masked-input stage.
      deadline_ = std::max(deadline_, now + stage_timeout);
      break;
    }
    case 6: {
      const uint32_t needed = std::max(secagg_params_.t, MinClients());
      if (secagg()->u4().size() < needed) {
        return FailedPreconditionError(
            "secure aggregation aborted: " + std::to_string(secagg()->u4().size()) +
            " masked inputs, need " + std::to_string(needed));
      }
      COHORT_ASSIGN_OR_RETURN(aggregation::SurvivorList survivors, secagg()->CloseMaskedInput());
      wire::Header h = NewHeader();
      auto* m = h.mutable_secagg_survivors();
      m->set_round(round);
      m->set_task_id(task_id_);
      for (uint32_t s : survivors.survivors) m->add_survivors(s);
      BroadcastSecAgg(h, out);
      break;
    }
    case 7: {
      COHORT_ASSIGN_OR_RETURN(auto requests, secagg()->CloseConsistency());
      for (const auto& [index, request] : requests) {
        SendSecAgg(index, aggregation::ToWire(round, task_id_, request), out);
      }
      break;
    }
    default:
      return InternalError("no secure-aggregation stage " + std::to_string(stage_));
  }
  ++stage_;
  stage_deadline_ = now + stage_timeout;
  return OkStatus();
}

void RoundEngine::AdvanceSecAgg(TimeMs now, std::vector<Outgoing>& out) {
  while (phase_ == Phase::kTraining && secagg()) {
    const TimeMs deadline = stage_ == kMaskedInputStage ? deadline_ : stage_deadline_;
    if (LiveWaiting() > 0 && now < deadline) return;
    const uint32_t round = round_ + 1;
    for (auto& p : participants_) {
      if (!p.left && p.answered < stage_) {
        LeaveSecAgg(p, Participant::State::kDropped,
                    std::string("no ") + kStageNames[stage_] + " message before the deadline");
        if (stage_ <= kMaskedInputStage) SetInactive(p.name, clients_[p.name]);  // Until it speaks.
        env_->Log().warn("client {}: left round {} at stage {}", p.name, round,
                         kStageNames[stage_]);
      }
    }
    const double started = env_->MonotonicSeconds();
    env_->Log().debug("round {}: stage {} closes {:.3f} s into the round, {} clients in", round,
                      kStageNames[stage_], started - round_start_wall_,
                      std::count_if(participants_.begin(), participants_.end(),
                                    [](const Participant& p) { return !p.left; }));
    if (stage_ == 8) {
      FinishRound(now, started, out);
      return;
    }
    Status closed = CloseSecAggStage(now, out);
    TakeSecAggBlame();
    aggregation_seconds_ += env_->MonotonicSeconds() - started;
    if (!closed.ok()) {
      AbortRound(now, closed.message(), out);
      return;
    }
  }
}

}  // namespace cohort::coordinator
