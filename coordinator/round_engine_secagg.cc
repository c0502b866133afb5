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
#include <optional>

#include "aggregation/secagg_wire.h"
#include "coordinator/round_engine.h"
#include "coordinator/secagg_plan.h"
#include "crypto/keys.h"

namespace cohort::coordinator {
namespace {

using aggregation::SecAggStage;
using aggregation::StageName;

// What a client's secure-aggregation message is: its session, the stage it
// answers and what to call it in a log line; nullopt for other messages.
struct SecAggIn {
  uint32_t round;
  uint64_t task_id;
  SecAggStage stage;
  const char* what;
};

template <typename M>
SecAggIn In(const M& m, SecAggStage stage, const char* what) {
  return {m.round(), m.task_id(), stage, what};
}

std::optional<SecAggIn> DescribeSecAgg(const wire::Header& h) {
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      return In(h.secagg_seed(), SecAggStage::kCommitSeed, "seed commitment");
    case wire::Header::kSecaggKeys:
      return In(h.secagg_keys(), SecAggStage::kAdvertiseKeys, "key advert");
    case wire::Header::kSecaggShares:
      return In(h.secagg_shares(), SecAggStage::kShareKeys, "shares");
    case wire::Header::kSecaggShareCheck:
      return In(h.secagg_share_check(), SecAggStage::kCheckShares, "share check");
    case wire::Header::kSecaggConfirm:
      return In(h.secagg_confirm(), SecAggStage::kConfirmChecked, "checked-list confirmation");
    case wire::Header::kSecaggSignature:
      return In(h.secagg_signature(), SecAggStage::kConsistency, "survivor signature");
    case wire::Header::kSecaggUnmask:
      return In(h.secagg_unmask(), SecAggStage::kUnmasking, "unmasking shares");
    default:
      return std::nullopt;
  }
}

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

}  // namespace

const char* RoundEngine::SecAggStageName() const { return StageName(stage_); }

bool RoundEngine::secure() const { return config_.secagg().aggregation() != config::PLAIN; }

uint32_t RoundEngine::MinClients() const { return MinRoundClients(config_); }

Status RoundEngine::StartSecAgg(std::span<const std::string> cohort) {
  const auto& sc = config_.secagg();
  const uint32_t round = round_ + 1;
  // The vector is the model delta followed by the training metrics (and
  // the federated evaluation's slots).
  COHORT_ASSIGN_OR_RETURN(secagg_params_, aggregation::ChooseSecAggParams(
                                              static_cast<uint32_t>(cohort.size()),
                                              sc.expected_dropout(), sc.corrupt_fraction(),
                                              sc.aggregation() == config::SECAGG, secure_length()));
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
  {
    // Every client was welcomed with config_.model(), and every client's
    // task carries the same settings (the strategy's ConfigureTask differs
    // between clients only in train_seed) and the same payload; a client
    // whose task hashes otherwise refuses it.
    wire::RoundTask probe;
    strategy_->ConfigureTask(round, cohort.front(), probe);
    task_digest_ = aggregation::TaskDigest(config_.model(), probe.train(), EvaluatesRound(round),
                                           *task_model_);
  }
  secagg_params_.context =
      aggregation::SecAggContext(secagg_nonce_, round, task_id_, secagg_params_, fixed_point_.clip,
                                 fixed_point_.scale, cohort_weight_, InputRules());
  aggregation::DistributedDpDecoding ddp;
  if (dp_ != nullptr && dp_->skellam()) {
    ddp = {dp_->skellam()->scale, static_cast<double>(cohort.size())};
    if (const auto& count = dp_->clip_count_skellam()) ddp.count_grid = count->scale;
  }
  COHORT_ASSIGN_OR_RETURN(aggregator_, aggregation::NewSecureAggregator(
                                           secagg_params_, cohort_identities_, fixed_point_,
                                           cohort_weight_, update_values(), env_, ddp));
  aggregation_seconds_ = 0;
  stage_ = SecAggStage::kCommitSeed;
  stage_deadline_ = round_started_ + SecondsToMs(sc.stage_timeout_s());
  return OkStatus();
}

int RoundEngine::LiveWaiting() const {
  int waiting = 0;
  for (const auto& p : participants_) {
    if (p.in_round() && p.answered < stage_) ++waiting;
  }
  return waiting;
}

void RoundEngine::TakeSecAggBlame() {
  for (auto& m : secagg()->TakeMisbehaviour()) {
    Participant& p = participants_[m.client];
    env_->Log().warn("client {} misbehaved in round {} ({}): {}", p.name, round_ + 1,
                     StageName(stage_), m.what);
    const std::string reason = "misbehaved: " + m.what;
    Ban(p, reason);
    if (p.counts()) {
      // Its input is in the sum already: it stays "ok", and is named.
      p.reason = reason;
    } else if (p.in_round()) {
      Exclude(p, Participant::State::kRejected, reason);
    } else if (p.reason.rfind("misbehaved", 0) != 0) {
      p.reason = reason + (p.reason.empty() ? "" : "; " + p.reason);
    }
  }
}

void RoundEngine::Ban(Participant& p, const std::string& why) {
  p.misbehaved = true;
  if (banned_.emplace(p.name, why).second) {
    env_->Log().warn("client {} is excluded from the rest of the run: {}", p.name, why);
  }
}

RoundEngine::Participant* RoundEngine::SecAggSender(const std::string& peer, uint32_t round,
                                                    uint64_t task_id, SecAggStage stage,
                                                    const std::string& what, TimeMs now,
                                                    std::vector<Outgoing>& out) {
  const std::string* name = clients_.NameOf(peer);
  if (name == nullptr) {
    out.push_back(MakeError(peer, wire::UNKNOWN_CLIENT, "unknown client; send hello"));
    return nullptr;
  }
  clients_.Seen(*name, now);
  const uint32_t current = round_ + 1;
  std::string why;
  Participant* p = nullptr;
  if (phase_ != Phase::kTraining || !secagg() || round != current || task_id != task_id_) {
    why = what + " for round " + std::to_string(round) + ", which is not in progress";
  } else if ((p = FindParticipant(*name)) == nullptr) {
    out.push_back(
        MakeError(peer, wire::NOT_SELECTED, "not selected for round " + std::to_string(current)));
    return nullptr;
  } else if (!p->in_round()) {
    why = what + " after leaving round " + std::to_string(current) + " (" + p->reason + ")";
  } else if (stage_ != stage || p->answered != aggregation::PreviousStage(stage)) {
    why = what + " during stage " + StageName(stage_) + " of round " + std::to_string(current);
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
  const std::optional<SecAggIn> in = DescribeSecAgg(h);
  if (!in) return;
  Participant* p = SecAggSender(peer, in->round, in->task_id, in->stage, in->what, now, out);
  if (p == nullptr) return;
  const uint32_t index = static_cast<uint32_t>(p - participants_.data());
  auto message = aggregation::ClientMessageFromWire(h, index);
  const Status status =
      message.ok() ? secagg()->Handle(index, std::move(*message)) : message.status();
  aggregation_seconds_ += env_->MonotonicSeconds() - started;
  TakeSecAggBlame();
  if (!status.ok()) {
    const std::string why = "client " + p->name + ", round " + std::to_string(round_ + 1) + ", " +
                            StageName(stage_) + ": " + status.message();
    env_->Log().warn("rejected secure-aggregation message: {}", why);
    if (p->in_round()) Exclude(*p, Participant::State::kRejected, status.message());
    out.push_back(MakeError(peer, wire::SECAGG_REFUSED, why));
  } else if (p->in_round()) {
    p->answered = stage_;
  }
  AdvanceSecAgg(now, out);
}

void RoundEngine::AbortRound(TimeMs now, const std::string& why, std::vector<Outgoing>& out) {
  env_->Log().warn("round {}: {}; the model is unchanged and the run goes on", round_ + 1, why);
  // The inputs were never unmasked: none counts.
  for (auto& p : participants_) p.Void(why);
  CommitRound(now, nullptr, aggregation_seconds_, why, out);
}

void RoundEngine::BroadcastSecAgg(const wire::Header& h, std::vector<Outgoing>& out) {
  for (const auto& p : participants_) {
    if (p.in_round()) out.push_back(To(clients_.PeerOf(p.name), h));
  }
}

void RoundEngine::SendSecAgg(uint32_t index, wire::Header h, std::vector<Outgoing>& out) {
  const Participant& p = participants_[index];
  if (p.in_round()) out.push_back(To(clients_.PeerOf(p.name), std::move(h)));
}

Status RoundEngine::CloseSecAggStage(TimeMs now, std::vector<Outgoing>& out) {
  const uint32_t round = round_ + 1;
  const TimeMs stage_timeout = SecondsToMs(config_.secagg().stage_timeout_s());
  if (stage_ == SecAggStage::kUnmasking) {
    return InternalError(std::string("no secure-aggregation stage ") + StageName(stage_));
  }
  if (stage_ == SecAggStage::kMaskedInput) {
    const uint32_t needed = std::max(secagg_params_.t, MinClients());
    if (secagg()->u4().size() < needed) {
      return FailedPreconditionError(
          "secure aggregation aborted: " + std::to_string(secagg()->u4().size()) +
          " masked inputs, need " + std::to_string(needed));
    }
  }
  COHORT_ASSIGN_OR_RETURN(auto messages, secagg()->Close());
  for (const auto& m : messages) {
    wire::Header h = aggregation::ToWire(round, task_id_, m.message);
    if (m.to) {
      SendSecAgg(*m.to, std::move(h), out);
    } else {
      BroadcastSecAgg(h, out);
    }
  }
  // Clients can mask only once the confirmations are out: slow key-exchange
  // stages must not eat the whole masked-input stage.
  if (stage_ == SecAggStage::kConfirmChecked) deadline_ = std::max(deadline_, now + stage_timeout);
  stage_ = aggregation::NextStage(stage_);
  stage_deadline_ = now + stage_timeout;
  timings_.Enter(now, aggregation::StageName(stage_));
  return OkStatus();
}

void RoundEngine::AdvanceSecAgg(TimeMs now, std::vector<Outgoing>& out) {
  while (phase_ == Phase::kTraining && secagg()) {
    const TimeMs deadline = stage_ == SecAggStage::kMaskedInput ? deadline_ : stage_deadline_;
    if (LiveWaiting() > 0 && now < deadline) return;
    const uint32_t round = round_ + 1;
    for (auto& p : participants_) {
      if (p.in_round() && p.answered < stage_) {
        Exclude(p, Participant::State::kDropped,
                std::string("no ") + StageName(stage_) + " message before the deadline");
        if (stage_ <= SecAggStage::kMaskedInput) clients_.SetInactive(p.name);  // Until it speaks.
        env_->Log().warn("client {}: left round {} at stage {}", p.name, round, StageName(stage_));
      }
    }
    const double started = env_->MonotonicSeconds();
    env_->Log().debug("round {}: stage {} closes {:.3f} s into the round, {} clients in", round,
                      StageName(stage_), started - round_start_wall_,
                      std::count_if(participants_.begin(), participants_.end(),
                                    [](const Participant& p) { return p.in_round(); }));
    if (stage_ == SecAggStage::kUnmasking) {
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
