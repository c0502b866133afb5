#include "client/fault_filter.h"

#include <limits>
#include <optional>
#include <span>
#include <utility>

namespace cohort::client {
namespace {

constexpr uint64_t kHugeSamples = uint64_t{1} << 40;

struct StageOfMessage {
  aggregation::SecAggStage stage;
  uint32_t round;
};

// The stage and round of a message the client sends; none for a message of
// no stage (Hello, heartbeat). A plain update counts as the masked input.
std::optional<StageOfMessage> StageOf(const wire::Header& h) {
  using aggregation::SecAggStage;
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      return StageOfMessage{SecAggStage::kCommitSeed, h.secagg_seed().round()};
    case wire::Header::kSecaggKeys:
      return StageOfMessage{SecAggStage::kAdvertiseKeys, h.secagg_keys().round()};
    case wire::Header::kSecaggShares:
      return StageOfMessage{SecAggStage::kShareKeys, h.secagg_shares().round()};
    case wire::Header::kSecaggShareCheck:
      return StageOfMessage{SecAggStage::kCheckShares, h.secagg_share_check().round()};
    case wire::Header::kSecaggConfirm:
      return StageOfMessage{SecAggStage::kConfirmChecked, h.secagg_confirm().round()};
    case wire::Header::kUpdate:
      return StageOfMessage{SecAggStage::kMaskedInput, h.update().round()};
    case wire::Header::kSecaggSignature:
      return StageOfMessage{SecAggStage::kConsistency, h.secagg_signature().round()};
    case wire::Header::kSecaggUnmask:
      return StageOfMessage{SecAggStage::kUnmasking, h.secagg_unmask().round()};
    default:
      return std::nullopt;
  }
}

std::span<uint8_t> Bytes(std::string& s) {
  return {reinterpret_cast<uint8_t*>(s.data()), s.size()};
}

}  // namespace

FaultFilter::FaultFilter(FaultPlan plan, std::string name, const crypto::Ed25519KeyPair* identity,
                         Env* env)
    : plan_(std::move(plan)), name_(std::move(name)), identity_(identity), env_(env) {}

void FaultFilter::Apply(Actions& a) {
  if (plan_.round == 0 && plan_.misbehave.empty()) return;
  // The task was taken: say Hello again first, as if the data had grown.
  if (Misbehaves("rehello_weight") && a.train) {
    a.send.insert(a.send.begin(), Outbound{ReHello(), {}, {}});
  }
  std::vector<Outbound> kept;
  kept.reserve(a.send.size());
  for (Outbound& out : a.send) {
    if (Withholds(out.header, a)) continue;
    Tamper(out);
    kept.push_back(std::move(out));
  }
  a.send = std::move(kept);
}

bool FaultFilter::Withholds(const wire::Header& header, Actions& a) const {
  const std::optional<StageOfMessage> s = StageOf(header);
  if (!s || plan_.round == 0 || s->round != plan_.round || s->stage != plan_.stage) return false;
  const std::string round = std::to_string(s->round);
  if (header.has_update() && !header.update().masked()) {
    a.printed.push_back("paused before update of round " + round);
    env_->Log().warn("fault injection: withholding the update of round {}", s->round);
    return true;
  }
  const char* name = aggregation::StageName(s->stage);
  a.printed.push_back(std::string("paused before ") + name + " of round " + round);
  env_->Log().warn("fault injection: sending nothing from {} of round {} on", name, s->round);
  return true;
}

void FaultFilter::Tamper(Outbound& out) {
  wire::Header& h = out.header;
  if (Misbehaves("huge_update")) {
    if (h.has_hello()) h.mutable_hello()->set_num_samples(kHugeSamples);
    if (h.has_update() && !h.update().masked()) {
      h.mutable_update()->set_num_samples(kHugeSamples);
      out.payload.assign(out.payload.size(), std::numeric_limits<float>::max());
    }
  } else if (const float factor = AttackFactor();
             factor != 1 && h.has_update() && !h.update().masked()) {
    for (float& v : out.payload) v *= factor;
  } else if (Misbehaves("low_order_key") && h.has_secagg_keys()) {
    for (auto& advert : *h.mutable_secagg_keys()->mutable_adverts()) {
      advert.set_mask_key(std::string(crypto::kX25519PublicBytes, '\0'));
    }
  } else if (Misbehaves("garbage_shares") && h.has_secagg_shares()) {
    for (auto& s : *h.mutable_secagg_shares()->mutable_shares()) {
      env_->RandomBytes(Bytes(*s.mutable_ciphertext()));
    }
  } else if (Misbehaves("bad_unmask_share") && h.has_secagg_unmask()) {
    for (auto& s : *h.mutable_secagg_unmask()->mutable_shares()) {
      if (s.share().size() >= 12) env_->RandomBytes(Bytes(*s.mutable_share()).subspan(4, 8));
    }
  }
}

float FaultFilter::AttackFactor() const {
  if (Misbehaves("sign_flip")) return -1;
  if (Misbehaves("scale10")) return 10;
  if (Misbehaves("sign_flip_scale10")) return -10;
  return 1;
}

wire::Header FaultFilter::ReHello() const {
  wire::Header hello;
  hello.set_version(wire::VERSION_1);
  hello.mutable_hello()->set_client_name(name_);
  hello.mutable_hello()->set_num_samples(kHugeSamples);
  if (identity_ != nullptr) {
    hello.mutable_hello()->set_identity_key(identity_->public_key.data(),
                                            identity_->public_key.size());
  }
  return hello;
}

}  // namespace cohort::client
