// The round engine's secure-aggregation half: binds aggregation::SecAggServer
// to the round. Stage numbers are those of aggregation/secagg.h:
//   1 advertise_keys  (runs while clients train; stage timeout)
//   2 share_keys      (stage timeout)
//   3 masked_input    (the round deadline)
//   4 consistency     (stage timeout; skipped when the check is off)
//   5 unmasking       (stage timeout)
// A stage closes when every client still in the round has answered, or at
// its deadline; whoever has not answered then leaves the round at that stage.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "coordinator/round_engine.h"
#include "crypto/keys.h"

namespace cohort::coordinator {
namespace {

constexpr const char* kStageNames[] = {
    "", "advertise_keys", "share_keys", "masked_input", "consistency", "unmasking"};

TimeMs SecondsToMs(float s) { return static_cast<TimeMs>(std::llround(double{s} * 1000.0)); }

template <size_t N>
bool CopyKey(const std::string& bytes, std::array<uint8_t, N>& out) {
  if (bytes.size() != N) return false;
  std::memcpy(out.data(), bytes.data(), N);
  return true;
}

wire::Header NewHeader() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

}  // namespace

bool RoundEngine::secure() const { return config_.secagg().aggregation() != config::PLAIN; }

uint32_t RoundEngine::MinClients() const {
  return secure() ? std::max<uint32_t>(3, config_.rounds().min_clients())
                  : config_.rounds().min_clients();
}

Status RoundEngine::StartSecAgg(std::span<const std::string> cohort) {
  const auto& sc = config_.secagg();
  const uint32_t round = round_ + 1;
  COHORT_ASSIGN_OR_RETURN(secagg_params_, aggregation::ChooseSecAggParams(
                                              static_cast<uint32_t>(cohort.size()),
                                              sc.expected_dropout(), sc.corrupt_fraction(),
                                              sc.aggregation() == config::SECAGG, global_.size()));
  // Each client weighs its update by num_samples / cohort_weight_, so the
  // weights of the cohort sum to at most 1 and the scale does not depend on
  // how much data clients claim.
  COHORT_ASSIGN_OR_RETURN(fixed_point_, aggregation::ChooseFixedPoint(
                                            sc.clip(), 1.0, static_cast<uint32_t>(cohort.size())));
  cohort_weight_ = 0;
  cohort_identities_.clear();
  for (const auto& name : cohort) {
    const Client& c = clients_.at(name);
    if (!c.identity) return FailedPreconditionError("client " + name + " has no identity key");
    cohort_identities_.push_back(*c.identity);
    cohort_weight_ += static_cast<double>(c.num_samples);
  }
  secagg_params_.graph_seed = DeriveSeed(config_.seed(), round, task_id_, 0x9a9);
  secagg_params_.consistency_check = sc.consistency_check();
  secagg_params_.prg =
      sc.mask_prg() == config::CHACHA20 ? crypto::MaskPrg::kChaCha20 : crypto::MaskPrg::kAes256Ctr;
  {
    // Fresh per round: sessions never repeat, even when a round is replayed.
    SecretBytes random = crypto::RandomSecret(secagg_nonce_.size());
    std::memcpy(secagg_nonce_.data(), random.bytes().data(), secagg_nonce_.size());
  }
  secagg_params_.context =
      aggregation::SecAggContext(secagg_nonce_, round, task_id_, secagg_params_, fixed_point_.clip,
                                 fixed_point_.scale, cohort_weight_, cohort_identities_);
  secagg_ = std::make_unique<aggregation::SecAggServer>(secagg_params_, cohort_identities_);
  secagg_seconds_ = 0;
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

RoundEngine::Participant* RoundEngine::SecAggSender(const std::string& peer, uint32_t round,
                                                    uint64_t task_id, int stage,
                                                    const std::string& what,
                                                    std::vector<Outgoing>& out) {
  const std::string* name = NameOf(peer);
  if (name == nullptr) {
    out.push_back(MakeError(peer, wire::UNKNOWN_CLIENT, "unknown client; send hello"));
    return nullptr;
  }
  Client& c = clients_[*name];
  c.active = true;
  const uint32_t current = round_ + 1;
  std::string why;
  Participant* p = nullptr;
  if (phase_ != Phase::kTraining || !secagg_ || round != current || task_id != task_id_) {
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
    spdlog::warn("client {}: rejected {}", *name, why);
    out.push_back(MakeError(peer, wire::STALE, why));
    return nullptr;
  }
  return p;
}

void RoundEngine::OnSecAggMessage(const std::string& peer, const net::Envelope& envelope,
                                  TimeMs now, std::vector<Outgoing>& out) {
  const wire::Header& h = envelope.header;
  const double started = WallSeconds();
  Participant* p = nullptr;
  Status status;
  auto index_of = [this](const Participant* q) {
    return static_cast<uint32_t>(q - participants_.data());
  };
  switch (h.body_case()) {
    case wire::Header::kSecaggKeys: {
      const auto& m = h.secagg_keys();
      p = SecAggSender(peer, m.round(), m.task_id(), 1, "key advert", out);
      if (p == nullptr) return;
      aggregation::KeyAdvert advert;
      advert.index = index_of(p);
      if (m.adverts_size() != 1 || m.adverts(0).index() != advert.index ||
          !CopyKey(m.adverts(0).enc_key(), advert.enc_key) ||
          !CopyKey(m.adverts(0).mask_key(), advert.mask_key) ||
          !CopyKey(m.adverts(0).signature(), advert.signature)) {
        status = InvalidArgumentError(
            "key advert must hold one advert with this client's index, two 32-byte keys and a "
            "64-byte signature");
      } else {
        status = secagg_->OnAdvertise(advert);
      }
      break;
    }
    case wire::Header::kSecaggShares: {
      const auto& m = h.secagg_shares();
      p = SecAggSender(peer, m.round(), m.task_id(), 2, "shares", out);
      if (p == nullptr) return;
      aggregation::SealedShares shares;
      shares.from = index_of(p);
      for (const auto& s : m.shares()) {
        if (!shares.to.emplace(s.peer(), s.ciphertext()).second) {
          status = InvalidArgumentError("two sealed shares for client " + std::to_string(s.peer()));
          break;
        }
      }
      if (status.ok()) status = secagg_->OnShares(shares);
      break;
    }
    case wire::Header::kSecaggSignature: {
      const auto& m = h.secagg_signature();
      p = SecAggSender(peer, m.round(), m.task_id(), 4, "survivor signature", out);
      if (p == nullptr) return;
      aggregation::SurvivorSignature sig;
      sig.from = index_of(p);
      if (!CopyKey(m.signature(), sig.signature)) {
        status = InvalidArgumentError("survivor signature must be 64 bytes");
      } else {
        status = secagg_->OnSignature(sig);
      }
      break;
    }
    case wire::Header::kSecaggUnmask: {
      const auto& m = h.secagg_unmask();
      p = SecAggSender(peer, m.round(), m.task_id(), 5, "unmasking shares", out);
      if (p == nullptr) return;
      aggregation::UnmaskResponse r;
      r.from = index_of(p);
      for (const auto& s : m.shares()) {
        if (s.share().size() != crypto::kShamirShareBytes) {
          status =
              InvalidArgumentError("unmasking share about client " + std::to_string(s.about()) +
                                   " has " + std::to_string(s.share().size()) + " bytes");
          break;
        }
        aggregation::UnmaskShare u;
        u.about = s.about();
        u.is_self_mask = s.self_mask();
        u.share = SecretBytes(crypto::kShamirShareBytes);
        std::memcpy(u.share.bytes().data(), s.share().data(), crypto::kShamirShareBytes);
        r.shares.push_back(std::move(u));
      }
      if (status.ok()) status = secagg_->OnUnmask(std::move(r));
      break;
    }
    default:
      return;
  }
  secagg_seconds_ += WallSeconds() - started;
  if (!status.ok()) {
    const std::string why = "client " + p->name + ", round " + std::to_string(round_ + 1) + ", " +
                            kStageNames[stage_] + ": " + status.message();
    spdlog::warn("rejected secure-aggregation message: {}", why);
    LeaveSecAgg(*p, Participant::State::kRejected, status.message());
    out.push_back(MakeError(peer, wire::SECAGG_REFUSED, why));
  } else {
    p->answered = stage_;
  }
  AdvanceSecAgg(now, out);
}

void RoundEngine::OnMaskedUpdate(Participant& p, const std::string& peer,
                                 const net::Envelope& envelope, TimeMs now,
                                 std::vector<Outgoing>& out) {
  const wire::Update& u = envelope.header.update();
  const uint32_t current = round_ + 1;
  if (p.left || stage_ != 3 || p.answered != 2) {
    const std::string why = "masked update " + std::string(p.left ? "after leaving" : "during") +
                            " stage " + kStageNames[stage_] + " of round " +
                            std::to_string(current);
    spdlog::warn("client {}: rejected {}", p.name, why);
    out.push_back(MakeError(peer, wire::STALE, why));
    return;
  }
  const Client& c = clients_.at(p.name);
  Status status = CheckUpdate(u, envelope, c, /*masked=*/true);
  if (status.ok()) {
    const double started = WallSeconds();
    // The float frame carries the masked uint32 words bit for bit.
    const auto& payload = envelope.payloads[0];
    status = secagg_->OnMaskedInput(
        static_cast<uint32_t>(&p - participants_.data()),
        {reinterpret_cast<const uint8_t*>(payload.data()), payload.size() * sizeof(float)});
    secagg_seconds_ += WallSeconds() - started;
  }
  if (!status.ok()) {
    const std::string why =
        "client " + p.name + ", round " + std::to_string(current) + ": " + status.message();
    spdlog::warn("rejected update: {}", why);
    LeaveSecAgg(p, Participant::State::kRejected, status.message());
    out.push_back(MakeError(peer, wire::INVALID_UPDATE, why));
  } else {
    p.state = Participant::State::kOk;
    p.answered = 3;
    p.num_samples = u.num_samples();
    p.train_loss = u.train_loss();
    p.train_accuracy = u.train_accuracy();
    p.train_seconds = u.train_seconds();
  }
  AdvanceSecAgg(now, out);
}

void RoundEngine::AbortSecAgg(TimeMs now, const std::string& why, std::vector<Outgoing>& out) {
  spdlog::warn("round {}: {}; the model is unchanged and the run goes on", round_ + 1, why);
  // The inputs were never unmasked: none counts.
  for (auto& p : participants_) {
    if (p.state == Participant::State::kPending || p.state == Participant::State::kOk) {
      p.state = Participant::State::kDropped;
      if (p.reason.empty()) p.reason = "round aborted: " + why;
    }
  }
  secagg_.reset();
  CommitRound(now, nullptr, secagg_seconds_, out);
}

void RoundEngine::AdvanceSecAgg(TimeMs now, std::vector<Outgoing>& out) {
  while (phase_ == Phase::kTraining && secagg_) {
    const TimeMs deadline = stage_ == 3 ? deadline_ : stage_deadline_;
    if (LiveWaiting() > 0 && now < deadline) return;
    const uint32_t round = round_ + 1;
    for (auto& p : participants_) {
      if (!p.left && p.answered < stage_) {
        LeaveSecAgg(p, Participant::State::kDropped,
                    std::string("no ") + kStageNames[stage_] + " message before the deadline");
        if (stage_ <= 3) clients_[p.name].active = false;  // Until it speaks again.
        spdlog::warn("client {}: left round {} at stage {}", p.name, round, kStageNames[stage_]);
      }
    }
    const double started = WallSeconds();
    spdlog::debug("round {}: stage {} closes {:.3f} s into the round, {} clients in", round,
                  kStageNames[stage_], started - round_start_wall_,
                  std::count_if(participants_.begin(), participants_.end(),
                                [](const Participant& p) { return !p.left; }));
    auto send = [&](const Participant& p, wire::Header h) {
      Outgoing o;
      o.peer = clients_[p.name].peer;
      o.header = std::move(h);
      out.push_back(std::move(o));
    };
    auto live = [](const Participant& p) { return !p.left; };
    Status failed;
    switch (stage_) {
      case 1: {
        auto list = secagg_->CloseAdvertise();
        if (!list.ok()) {
          failed = list.status();
          break;
        }
        wire::Header h = NewHeader();
        auto* m = h.mutable_secagg_keys();
        m->set_round(round);
        m->set_task_id(task_id_);
        for (const auto& a : list->adverts) {
          auto* w = m->add_adverts();
          w->set_index(a.index);
          w->set_enc_key(a.enc_key.data(), a.enc_key.size());
          w->set_mask_key(a.mask_key.data(), a.mask_key.size());
          w->set_signature(a.signature.data(), a.signature.size());
        }
        for (const auto& p : participants_) {
          if (live(p)) send(p, h);
        }
        stage_ = 2;
        stage_deadline_ = now + SecondsToMs(config_.secagg().stage_timeout_s());
        break;
      }
      case 2: {
        auto inbound = secagg_->CloseShares();
        if (!inbound.ok()) {
          failed = inbound.status();
          break;
        }
        for (auto& [index, shares] : *inbound) {
          const Participant& p = participants_[index];
          if (!live(p)) continue;
          wire::Header h = NewHeader();
          auto* m = h.mutable_secagg_shares();
          m->set_round(round);
          m->set_task_id(task_id_);
          for (const auto& [from, ct] : shares.from) {
            auto* s = m->add_shares();
            s->set_peer(from);
            s->set_ciphertext(ct);
          }
          send(p, std::move(h));
        }
        stage_ = 3;
        break;
      }
      case 3: {
        const uint32_t needed = std::max(secagg_params_.t, MinClients());
        if (secagg_->u3().size() < needed) {
          failed = FailedPreconditionError(
              "secure aggregation aborted: " + std::to_string(secagg_->u3().size()) +
              " masked inputs, need " + std::to_string(needed));
          break;
        }
        auto survivors = secagg_->CloseMaskedInput();
        if (!survivors.ok()) {
          failed = survivors.status();
          break;
        }
        stage_ = 4;
        stage_deadline_ = now + SecondsToMs(config_.secagg().stage_timeout_s());
        if (secagg_params_.consistency_check) {
          wire::Header h = NewHeader();
          auto* m = h.mutable_secagg_survivors();
          m->set_round(round);
          m->set_task_id(task_id_);
          for (uint32_t s : survivors->survivors) m->add_survivors(s);
          for (const auto& p : participants_) {
            if (live(p)) send(p, h);
          }
        } else {
          // No signatures to collect: every live client counts as answered.
          for (auto& p : participants_) {
            if (live(p)) p.answered = 4;
          }
        }
        break;
      }
      case 4: {
        auto request = secagg_->CloseConsistency();
        if (!request.ok()) {
          failed = request.status();
          break;
        }
        wire::Header h = NewHeader();
        auto* m = h.mutable_secagg_unmask_request();
        m->set_round(round);
        m->set_task_id(task_id_);
        for (uint32_t s : request->survivors) m->add_survivors(s);
        for (uint32_t d : request->dropped) m->add_dropped(d);
        for (const auto& sig : request->signatures) {
          auto* w = m->add_signatures();
          w->set_index(sig.from);
          w->set_signature(sig.signature.data(), sig.signature.size());
        }
        for (const auto& p : participants_) {
          if (live(p)) send(p, h);
        }
        stage_ = 5;
        stage_deadline_ = now + SecondsToMs(config_.secagg().stage_timeout_s());
        break;
      }
      case 5: {
        auto sum = secagg_->Finalize();
        if (!sum.ok()) {
          failed = sum.status();
          break;
        }
        double weight = 0;
        std::vector<std::string> names;
        for (const auto& p : participants_) {
          if (p.state == Participant::State::kOk) {
            weight += static_cast<double>(p.num_samples);
            names.push_back(p.name);
          }
        }
        if (sum_observer_) sum_observer_(round, *sum, names);
        // Σ over U3 of (n_k / W) * scale * x_k, so divide by scale * Σ n_k / W.
        std::vector<float> mean(global_.size());
        aggregation::DecodeFixedPoint(*sum, weight / cohort_weight_, fixed_point_, mean);
        secagg_seconds_ += WallSeconds() - started;
        secagg_.reset();
        CommitRound(now, &mean, secagg_seconds_, out);
        return;
      }
      default:
        return;
    }
    secagg_seconds_ += WallSeconds() - started;
    if (!failed.ok()) {
      AbortSecAgg(now, failed.message(), out);
      return;
    }
  }
}

}  // namespace cohort::coordinator
