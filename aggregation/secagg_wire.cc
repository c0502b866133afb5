#include "aggregation/secagg_wire.h"

#include <google/protobuf/message.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cohort::aggregation {
namespace {

template <size_t N>
Status Copy(const std::string& bytes, std::array<uint8_t, N>& out, const char* field) {
  if (bytes.size() != N) {
    return InvalidArgumentError(std::string(field) + " has " + std::to_string(bytes.size()) +
                                " bytes, expected " + std::to_string(N));
  }
  std::memcpy(out.data(), bytes.data(), N);
  return OkStatus();
}

template <size_t N>
void Put(std::string* field, const std::array<uint8_t, N>& bytes) {
  field->assign(reinterpret_cast<const char*>(bytes.data()), N);
}

wire::Header NewHeader() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

template <typename M>
void Name(M* m, uint32_t round, uint64_t task_id) {
  m->set_round(round);
  m->set_task_id(task_id);
}

StatusOr<aggregation::KeyAdvert> AdvertFromWire(const wire::KeyAdvert& w) {
  aggregation::KeyAdvert a;
  a.index = w.index();
  COHORT_RETURN_IF_ERROR(Copy(w.enc_key(), a.enc_key, "advert enc_key"));
  COHORT_RETURN_IF_ERROR(Copy(w.mask_key(), a.mask_key, "advert mask_key"));
  COHORT_RETURN_IF_ERROR(Copy(w.self_commitment(), a.self_commitment, "advert self_commitment"));
  COHORT_RETURN_IF_ERROR(Copy(w.seed(), a.seed, "advert seed"));
  COHORT_RETURN_IF_ERROR(Copy(w.signature(), a.signature, "advert signature"));
  return a;
}

void AdvertToWire(const aggregation::KeyAdvert& a, wire::KeyAdvert* w) {
  w->set_index(a.index);
  Put(w->mutable_enc_key(), a.enc_key);
  Put(w->mutable_mask_key(), a.mask_key);
  Put(w->mutable_self_commitment(), a.self_commitment);
  Put(w->mutable_seed(), a.seed);
  Put(w->mutable_signature(), a.signature);
}

// A Merkle proof: at most 32 siblings of 32 bytes (the client checks the
// depth against its n).
template <typename Repeated>
StatusOr<crypto::MerkleProof> ProofFromWire(const Repeated& w, const std::string& field) {
  if (w.size() > 32) {
    return InvalidArgumentError(field + " has " + std::to_string(w.size()) + " siblings");
  }
  crypto::MerkleProof proof(w.size());
  for (int i = 0; i < w.size(); ++i) {
    COHORT_RETURN_IF_ERROR(Copy(w.Get(i), proof[i], field.c_str()));
  }
  return proof;
}

template <typename Repeated>
void ProofToWire(const crypto::MerkleProof& proof, Repeated* w) {
  for (const auto& d : proof) Put(w->Add(), d);
}

// Sealed shares keyed by peer; a peer named twice is an error.
StatusOr<std::map<uint32_t, std::string>> SharesFromWire(const wire::SecAggShares& m) {
  std::map<uint32_t, std::string> out;
  for (const auto& s : m.shares()) {
    if (!out.emplace(s.peer(), s.ciphertext()).second) {
      return InvalidArgumentError("two sealed shares for client " + std::to_string(s.peer()));
    }
  }
  return out;
}

void SharesToWire(const std::map<uint32_t, std::string>& shares, wire::SecAggShares* m) {
  for (const auto& [peer, ct] : shares) {
    auto* s = m->add_shares();
    s->set_peer(peer);
    s->set_ciphertext(ct);
  }
}

// Tags by peer (recipient or sender); a peer named twice is an error.
StatusOr<std::map<uint32_t, std::array<uint8_t, 32>>> TagsFromWire(const wire::SecAggConfirm& m) {
  std::map<uint32_t, std::array<uint8_t, 32>> out;
  for (const auto& w : m.tags()) {
    std::array<uint8_t, 32> tag;
    COHORT_RETURN_IF_ERROR(Copy(w.tag(), tag, "confirmation tag"));
    if (!out.emplace(w.to(), tag).second) {
      return InvalidArgumentError("two confirmation tags for client " + std::to_string(w.to()));
    }
  }
  return out;
}

wire::Header TagsToWire(uint32_t round, uint64_t task_id,
                        const std::map<uint32_t, std::array<uint8_t, 32>>& tags) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_confirm();
  Name(m, round, task_id);
  for (const auto& [peer, tag] : tags) {
    auto* w = m->add_tags();
    w->set_to(peer);
    Put(w->mutable_tag(), tag);
  }
  return h;
}

template <size_t N>
Status CopySetupBytes(const std::string& bytes, std::array<uint8_t, N>& out,
                      const std::string& what) {
  if (bytes.size() != N) return InvalidArgumentError("secagg setup: " + what + " 32 bytes");
  std::memcpy(out.data(), bytes.data(), N);
  return OkStatus();
}

}  // namespace

StatusOr<aggregation::SecAggSetup> FromWire(const wire::SecAggSetup& m) {
  aggregation::SecAggSetup s;
  s.sparse = m.sparse();
  s.n = m.n();
  s.k = m.k();
  s.t = m.t();
  s.index = m.index();
  COHORT_RETURN_IF_ERROR(CopySetupBytes(m.context(), s.nonce, "context is not"));
  COHORT_RETURN_IF_ERROR(CopySetupBytes(m.roster_root(), s.roster_root, "the roster root is not"));
  // Entry by entry, each checked as it is copied: a list of empty entries
  // (2 bytes each on the wire) allocates nothing.
  for (const std::string& sibling : m.roster_proof()) {
    COHORT_RETURN_IF_ERROR(
        CopySetupBytes(sibling, s.roster_proof.emplace_back(), "a roster proof sibling is not"));
  }
  for (const std::string& key : m.roster()) {
    const std::string what = "roster key " + std::to_string(s.roster.size()) + " is not";
    COHORT_RETURN_IF_ERROR(CopySetupBytes(key, s.roster.emplace_back(), what));
  }
  s.clip = m.clip();
  s.scale = m.scale();
  s.total_weight = m.total_weight();
  if (m.mask_prg() > static_cast<uint32_t>(crypto::MaskPrg::kAes128Ctr)) {
    return InvalidArgumentError("secagg setup: unknown mask PRG " + std::to_string(m.mask_prg()));
  }
  s.prg = static_cast<crypto::MaskPrg>(m.mask_prg());
  s.corrupt_fraction = m.corrupt_fraction();
  s.stage_timeout_ms = m.stage_timeout_ms();
  s.round_deadline_ms = m.round_deadline_ms();
  s.eval_slots = m.eval_slots();
  s.l2_clip = m.l2_clip();
  s.fednova_slot = m.fednova_slot();
  s.dp_clip_norm = m.dp_clip_norm();
  s.dp_scale = m.dp_scale();
  s.dp_l2_bound = m.dp_l2_bound();
  s.dp_share_variance = m.dp_share_variance();
  s.dp_count_scale = m.dp_count_scale();
  s.dp_count_share_variance = m.dp_count_share_variance();
  COHORT_RETURN_IF_ERROR(CopySetupBytes(m.task_digest(), s.task_digest, "the task digest is not"));
  return s;
}

wire::SecAggSetup ToWire(const aggregation::SecAggSetup& s) {
  wire::SecAggSetup m;
  m.set_sparse(s.sparse);
  m.set_n(s.n);
  m.set_k(s.k);
  m.set_t(s.t);
  m.set_index(s.index);
  m.set_mask_prg(static_cast<uint32_t>(s.prg));
  Put(m.mutable_context(), s.nonce);
  Put(m.mutable_roster_root(), s.roster_root);
  ProofToWire(s.roster_proof, m.mutable_roster_proof());
  for (const auto& id : s.roster) Put(m.add_roster(), id);
  m.set_clip(s.clip);
  m.set_scale(s.scale);
  m.set_total_weight(s.total_weight);
  m.set_corrupt_fraction(s.corrupt_fraction);
  m.set_stage_timeout_ms(s.stage_timeout_ms);
  m.set_round_deadline_ms(s.round_deadline_ms);
  m.set_eval_slots(s.eval_slots);
  m.set_l2_clip(s.l2_clip);
  m.set_fednova_slot(s.fednova_slot);
  m.set_dp_clip_norm(s.dp_clip_norm);
  m.set_dp_scale(s.dp_scale);
  m.set_dp_l2_bound(s.dp_l2_bound);
  m.set_dp_share_variance(s.dp_share_variance);
  m.set_dp_count_scale(s.dp_count_scale);
  m.set_dp_count_share_variance(s.dp_count_share_variance);
  Put(m.mutable_task_digest(), s.task_digest);
  return m;
}

namespace {

// Clears every singular field of `m` that holds its default, and every
// message field left empty, through the repeated fields' messages too.
void ClearDefaults(google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const bool message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (f->is_repeated()) {
      for (int i = 0; message && i < r->FieldSize(m, f); ++i) {
        ClearDefaults(*r->MutableRepeatedMessage(&m, f, i));
      }
      continue;
    }
    bool is_default = false;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        google::protobuf::Message* sub = r->MutableMessage(&m, f);
        ClearDefaults(*sub);
        is_default = sub->ByteSizeLong() == 0;
        break;
      }
      case FieldDescriptor::CPPTYPE_INT32:
        is_default = r->GetInt32(m, f) == f->default_value_int32();
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        is_default = r->GetInt64(m, f) == f->default_value_int64();
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        is_default = r->GetUInt32(m, f) == f->default_value_uint32();
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        is_default = r->GetUInt64(m, f) == f->default_value_uint64();
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        is_default = r->GetFloat(m, f) == f->default_value_float();
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        is_default = r->GetDouble(m, f) == f->default_value_double();
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        is_default = r->GetBool(m, f) == f->default_value_bool();
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        is_default = r->GetEnumValue(m, f) == f->default_value_enum()->number();
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        is_default = r->GetString(m, f) == f->default_value_string();
        break;
    }
    if (is_default) r->ClearField(&m, f);
  }
}

}  // namespace

std::string CanonicalBytes(const google::protobuf::Message& m) {
  std::unique_ptr<google::protobuf::Message> copy(m.New());
  copy->CopyFrom(m);
  ClearDefaults(*copy);
  return copy->SerializeAsString();
}

crypto::Digest TaskDigest(const config::ModelConfig& model, const config::TrainConfig& train,
                          bool evaluate, std::span<const float> payload) {
  static constexpr char kLabel[] = "cohort-secagg-task-v1";
  const std::string architecture = CanonicalBytes(model);
  const std::string settings = CanonicalBytes(train);
  const uint64_t sizes[2] = {architecture.size(), settings.size()};  // The payload comes last.
  const uint8_t eval = evaluate ? 1 : 0;
  auto bytes = [](const auto& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&v), sizeof(v));
  };
  auto text = [](std::string_view t) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(t.data()), t.size());
  };
  return crypto::Hash256(
      {text(kLabel),
       bytes(sizes),
       text(architecture),
       text(settings),
       bytes(eval),
       {reinterpret_cast<const uint8_t*>(payload.data()), payload.size_bytes()}});
}

StatusOr<aggregation::SeedCommit> FromWire(const wire::SecAggSeed& m, uint32_t from) {
  aggregation::SeedCommit c;
  c.from = from;
  COHORT_RETURN_IF_ERROR(Copy(m.commitment(), c.commitment, "seed commitment"));
  return c;
}

StatusOr<aggregation::CheckedConfirmation> FromWire(const wire::SecAggConfirm& m, uint32_t from) {
  aggregation::CheckedConfirmation c;
  c.from = from;
  COHORT_ASSIGN_OR_RETURN(c.tags, TagsFromWire(m));
  return c;
}

StatusOr<aggregation::SeedRoot> FromWire(const wire::SecAggSeed& m) {
  aggregation::SeedRoot r;
  COHORT_RETURN_IF_ERROR(Copy(m.root(), r.root, "seed root"));
  COHORT_ASSIGN_OR_RETURN(r.proof, ProofFromWire(m.proof(), "seed root proof"));
  return r;
}

StatusOr<aggregation::Confirmations> FromWire(const wire::SecAggConfirm& m) {
  aggregation::Confirmations c;
  COHORT_ASSIGN_OR_RETURN(c.from, TagsFromWire(m));
  return c;
}

StatusOr<aggregation::KeyAdvert> FromWire(const wire::SecAggKeys& m, uint32_t from) {
  if (m.adverts_size() != 1 || m.adverts(0).index() != from) {
    return InvalidArgumentError("key advert must hold one advert with this client's index");
  }
  return AdvertFromWire(m.adverts(0));
}

StatusOr<aggregation::SealedShares> FromWire(const wire::SecAggShares& m, uint32_t from) {
  aggregation::SealedShares s;
  s.from = from;
  COHORT_ASSIGN_OR_RETURN(s.to, SharesFromWire(m));
  return s;
}

StatusOr<aggregation::ShareCheck> FromWire(const wire::SecAggShareCheck& m, uint32_t from) {
  aggregation::ShareCheck check;
  check.from = from;
  for (const auto& w : m.complaints()) {
    aggregation::Complaint c;
    c.about = w.about();
    if (!w.point().empty() || !w.proof().empty()) {
      c.point.emplace();
      COHORT_RETURN_IF_ERROR(Copy(w.point(), *c.point, "complaint point"));
      COHORT_RETURN_IF_ERROR(Copy(w.proof(), c.proof, "complaint proof"));
    }
    check.complaints.push_back(c);
  }
  return check;
}

StatusOr<aggregation::SurvivorSignature> FromWire(const wire::SecAggSignature& m, uint32_t from) {
  aggregation::SurvivorSignature s;
  s.from = from;
  COHORT_RETURN_IF_ERROR(Copy(m.signature(), s.signature, "survivor signature"));
  for (const auto& w : m.tags()) {
    aggregation::SurvivorTag tag;
    COHORT_RETURN_IF_ERROR(Copy(w.tag(), tag, "survivor tag"));
    if (!s.tags.emplace(w.to(), tag).second) {
      return InvalidArgumentError("two survivor tags for client " + std::to_string(w.to()));
    }
  }
  return s;
}

StatusOr<aggregation::UnmaskResponse> FromWire(const wire::SecAggUnmask& m, uint32_t from) {
  aggregation::UnmaskResponse r;
  r.from = from;
  for (const auto& w : m.shares()) {
    if (w.share().size() != crypto::kShamirShareBytes) {
      return InvalidArgumentError("unmasking share about client " + std::to_string(w.about()) +
                                  " has " + std::to_string(w.share().size()) + " bytes");
    }
    aggregation::UnmaskShare u;
    u.about = w.about();
    u.is_self_mask = w.self_mask();
    u.share = SecretBytes(crypto::kShamirShareBytes);
    std::memcpy(u.share.bytes().data(), w.share().data(), crypto::kShamirShareBytes);
    COHORT_RETURN_IF_ERROR(Copy(w.dealer_signature(), u.proof.signature, "dealer signature"));
    COHORT_RETURN_IF_ERROR(Copy(w.salt(), u.proof.salt, "share salt"));
    COHORT_RETURN_IF_ERROR(Copy(w.other_commitment(), u.proof.other, "other share commitment"));
    COHORT_RETURN_IF_ERROR(Copy(w.blob_hash(), u.proof.blob_hash, "sealed blob hash"));
    r.shares.push_back(std::move(u));
  }
  return r;
}

StatusOr<aggregation::KeyList> FromWire(const wire::SecAggKeys& m) {
  aggregation::KeyList list;
  COHORT_RETURN_IF_ERROR(Copy(m.advert_root(), list.advert_root, "advert root"));
  for (const auto& w : m.listed()) {
    aggregation::ListedAdvert e;
    e.index = w.index();
    const std::string who = "key list entry " + std::to_string(w.index());
    if (w.has_advert()) {
      COHORT_ASSIGN_OR_RETURN(e.advert, AdvertFromWire(w.advert()));
      COHORT_RETURN_IF_ERROR(Copy(w.identity(), e.identity, (who + " identity").c_str()));
      COHORT_ASSIGN_OR_RETURN(e.identity_proof,
                              ProofFromWire(w.identity_proof(), who + " identity proof"));
    }
    COHORT_ASSIGN_OR_RETURN(e.advert_proof, ProofFromWire(w.advert_proof(), who + " advert proof"));
    list.entries.push_back(std::move(e));
  }
  // One per roster position; the client checks the count against its n.
  for (const auto& w : m.seeds()) {
    auto& seed = list.seeds.emplace_back();
    if (w.empty()) continue;
    seed.emplace();
    COHORT_RETURN_IF_ERROR(Copy(w, *seed, "seed contribution"));
  }
  return list;
}

StatusOr<aggregation::InboundShares> FromWire(const wire::SecAggShares& m) {
  aggregation::InboundShares in;
  COHORT_ASSIGN_OR_RETURN(in.from, SharesFromWire(m));
  return in;
}

aggregation::CheckedList FromWire(const wire::SecAggChecked& m) {
  return {{m.members().begin(), m.members().end()}};
}

aggregation::SurvivorList FromWire(const wire::SecAggSurvivors& m) {
  return {{m.survivors().begin(), m.survivors().end()}};
}

StatusOr<aggregation::UnmaskRequest> FromWire(const wire::SecAggUnmaskRequest& m) {
  aggregation::UnmaskRequest r;
  r.survivors.assign(m.survivors().begin(), m.survivors().end());
  r.dropped.assign(m.dropped().begin(), m.dropped().end());
  for (const auto& w : m.signatures()) {
    aggregation::SurvivorSignature s;
    s.from = w.index();
    COHORT_RETURN_IF_ERROR(Copy(w.signature(), s.signature, "survivor signature"));
    COHORT_RETURN_IF_ERROR(Copy(w.identity(), s.identity, "signer identity"));
    COHORT_ASSIGN_OR_RETURN(s.identity_proof,
                            ProofFromWire(w.identity_proof(), "signer identity proof"));
    if (!w.tag().empty()) {
      s.tag.emplace();
      COHORT_RETURN_IF_ERROR(Copy(w.tag(), *s.tag, "survivor tag"));
    }
    r.signatures.push_back(std::move(s));
  }
  return r;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SeedCommit& commit) {
  wire::Header h = NewHeader();
  Name(h.mutable_secagg_seed(), round, task_id);
  Put(h.mutable_secagg_seed()->mutable_commitment(), commit.commitment);
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SeedRoot& root) {
  wire::Header h = NewHeader();
  Name(h.mutable_secagg_seed(), round, task_id);
  Put(h.mutable_secagg_seed()->mutable_root(), root.root);
  ProofToWire(root.proof, h.mutable_secagg_seed()->mutable_proof());
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::CheckedConfirmation& c) {
  return TagsToWire(round, task_id, c.tags);
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::Confirmations& c) {
  return TagsToWire(round, task_id, c.from);
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::KeyAdvert& advert) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_keys();
  Name(m, round, task_id);
  AdvertToWire(advert, m->add_adverts());
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::KeyList& list) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_keys();
  Name(m, round, task_id);
  Put(m->mutable_advert_root(), list.advert_root);
  for (const auto& e : list.entries) {
    auto* w = m->add_listed();
    w->set_index(e.index);
    if (e.advert) {
      AdvertToWire(*e.advert, w->mutable_advert());
      Put(w->mutable_identity(), e.identity);
      ProofToWire(e.identity_proof, w->mutable_identity_proof());
    }
    ProofToWire(e.advert_proof, w->mutable_advert_proof());
  }
  for (const auto& seed : list.seeds) {
    std::string* w = m->add_seeds();
    if (seed) Put(w, *seed);
  }
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SealedShares& shares) {
  wire::Header h = NewHeader();
  Name(h.mutable_secagg_shares(), round, task_id);
  SharesToWire(shares.to, h.mutable_secagg_shares());
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::InboundShares& shares) {
  wire::Header h = NewHeader();
  Name(h.mutable_secagg_shares(), round, task_id);
  SharesToWire(shares.from, h.mutable_secagg_shares());
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::ShareCheck& check) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_share_check();
  Name(m, round, task_id);
  for (const auto& c : check.complaints) {
    auto* w = m->add_complaints();
    w->set_about(c.about);
    if (c.point) {
      Put(w->mutable_point(), *c.point);
      Put(w->mutable_proof(), c.proof);
    }
  }
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SurvivorSignature& sig) {
  wire::Header h = NewHeader();
  Name(h.mutable_secagg_signature(), round, task_id);
  Put(h.mutable_secagg_signature()->mutable_signature(), sig.signature);
  for (const auto& [to, tag] : sig.tags) {
    auto* w = h.mutable_secagg_signature()->add_tags();
    w->set_to(to);
    Put(w->mutable_tag(), tag);
  }
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::UnmaskRequest& request) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_unmask_request();
  Name(m, round, task_id);
  for (uint32_t s : request.survivors) m->add_survivors(s);
  for (uint32_t d : request.dropped) m->add_dropped(d);
  for (const auto& sig : request.signatures) {
    auto* w = m->add_signatures();
    w->set_index(sig.from);
    Put(w->mutable_signature(), sig.signature);
    Put(w->mutable_identity(), sig.identity);
    ProofToWire(sig.identity_proof, w->mutable_identity_proof());
    if (sig.tag) Put(w->mutable_tag(), *sig.tag);
  }
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::UnmaskResponse& response) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_unmask();
  Name(m, round, task_id);
  for (const auto& s : response.shares) {
    auto* w = m->add_shares();
    w->set_about(s.about);
    w->set_self_mask(s.is_self_mask);
    w->set_share(reinterpret_cast<const char*>(s.share.bytes().data()), s.share.size());
    Put(w->mutable_dealer_signature(), s.proof.signature);
    Put(w->mutable_salt(), s.proof.salt);
    Put(w->mutable_other_commitment(), s.proof.other);
    Put(w->mutable_blob_hash(), s.proof.blob_hash);
  }
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::CheckedList& checked) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_checked();
  Name(m, round, task_id);
  for (uint32_t u : checked.members) m->add_members(u);
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SurvivorList& survivors) {
  wire::Header h = NewHeader();
  auto* m = h.mutable_secagg_survivors();
  Name(m, round, task_id);
  for (uint32_t s : survivors.survivors) m->add_survivors(s);
  return h;
}

wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SecAggServerMessage& m) {
  return std::visit([&](const auto& message) { return ToWire(round, task_id, message); }, m);
}

namespace {

// What ServerMessageFromWire holds each list of a server message to.
Status CheckListSizes(const wire::Header& h, uint32_t n, uint32_t k) {
  const auto at_most = [&](int size, uint64_t most, const char* list) {
    if (static_cast<uint64_t>(size) <= most) return OkStatus();
    return InvalidArgumentError(std::string(list) + " of " + std::to_string(size) +
                                " entries, more than the " + std::to_string(most) +
                                " a cohort of " + std::to_string(n) + " with " + std::to_string(k) +
                                " neighbours each can have");
  };
  const uint64_t own_and_neighbours = uint64_t{k} + 1;
  switch (h.body_case()) {
    case wire::Header::kSecaggKeys:
      COHORT_RETURN_IF_ERROR(
          at_most(h.secagg_keys().listed_size(), own_and_neighbours, "a key list"));
      return at_most(h.secagg_keys().seeds_size(), n, "a list of seed contributions");
    case wire::Header::kSecaggShares:
      return at_most(h.secagg_shares().shares_size(), k, "a list of neighbours' shares");
    case wire::Header::kSecaggChecked:
      return at_most(h.secagg_checked().members_size(), n, "a checked list");
    case wire::Header::kSecaggConfirm:
      return at_most(h.secagg_confirm().tags_size(), k, "a list of confirmations");
    case wire::Header::kSecaggSurvivors:
      return at_most(h.secagg_survivors().survivors_size(), n, "a survivor list");
    case wire::Header::kSecaggUnmaskRequest: {
      const wire::SecAggUnmaskRequest& r = h.secagg_unmask_request();
      COHORT_RETURN_IF_ERROR(at_most(r.survivors_size(), n, "an unmask request's survivors"));
      COHORT_RETURN_IF_ERROR(at_most(r.dropped_size(), n, "an unmask request's dropped"));
      return at_most(r.signatures_size(), n, "an unmask request's signatures");
    }
    default:  // The seed root's proof: ProofFromWire's 32 siblings.
      return OkStatus();
  }
}

template <typename M>
StatusOr<aggregation::SecAggClientMessage> AsClientMessage(StatusOr<M> m) {
  if (!m.ok()) return m.status();
  return aggregation::SecAggClientMessage(std::move(*m));
}

template <typename M>
StatusOr<aggregation::SecAggServerMessage> AsServerMessage(StatusOr<M> m) {
  if (!m.ok()) return m.status();
  return aggregation::SecAggServerMessage(std::move(*m));
}

}  // namespace

StatusOr<aggregation::SecAggServerMessage> ServerMessageFromWire(const wire::Header& h, uint32_t n,
                                                                 uint32_t k) {
  COHORT_RETURN_IF_ERROR(CheckListSizes(h, n, k));
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      return AsServerMessage(FromWire(h.secagg_seed()));
    case wire::Header::kSecaggKeys:
      return AsServerMessage(FromWire(h.secagg_keys()));
    case wire::Header::kSecaggShares:
      return AsServerMessage(FromWire(h.secagg_shares()));
    case wire::Header::kSecaggChecked:
      return aggregation::SecAggServerMessage(FromWire(h.secagg_checked()));
    case wire::Header::kSecaggConfirm:
      return AsServerMessage(FromWire(h.secagg_confirm()));
    case wire::Header::kSecaggSurvivors:
      return aggregation::SecAggServerMessage(FromWire(h.secagg_survivors()));
    case wire::Header::kSecaggUnmaskRequest:
      return AsServerMessage(FromWire(h.secagg_unmask_request()));
    default:
      return InvalidArgumentError("not a secure-aggregation message from the coordinator");
  }
}

StatusOr<aggregation::SecAggClientMessage> ClientMessageFromWire(const wire::Header& h,
                                                                 uint32_t from) {
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      return AsClientMessage(FromWire(h.secagg_seed(), from));
    case wire::Header::kSecaggKeys:
      return AsClientMessage(FromWire(h.secagg_keys(), from));
    case wire::Header::kSecaggShares:
      return AsClientMessage(FromWire(h.secagg_shares(), from));
    case wire::Header::kSecaggShareCheck:
      return AsClientMessage(FromWire(h.secagg_share_check(), from));
    case wire::Header::kSecaggConfirm:
      return AsClientMessage(FromWire(h.secagg_confirm(), from));
    case wire::Header::kSecaggSignature:
      return AsClientMessage(FromWire(h.secagg_signature(), from));
    case wire::Header::kSecaggUnmask:
      return AsClientMessage(FromWire(h.secagg_unmask(), from));
    default:
      return InvalidArgumentError("not a secure-aggregation message from a client");
  }
}

}  // namespace cohort::aggregation
