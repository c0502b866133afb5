#include "aggregation/secagg_server.h"

#include <sodium.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <variant>

#include "aggregation/secagg_internal.h"
#include "common/parallel.h"
#include "crypto/aead.h"
#include "crypto/prg.h"

namespace cohort::aggregation {

using secagg_internal::AsBytes;
using secagg_internal::ComplaintContext;
using secagg_internal::Contains;
using secagg_internal::DealSigned;
using secagg_internal::kCommit;
using secagg_internal::kSealedBytes;
using secagg_internal::kShare;
using secagg_internal::OpenSealed;
using secagg_internal::PairMaskKey;
using secagg_internal::ParseSealed;
using secagg_internal::Sealed;
using secagg_internal::Str;

// --- Server -----------------------------------------------------------------

SecAggServer::SecAggServer(const SecAggParams& params,
                           std::vector<crypto::Ed25519Public> identities, Env* env)
    : params_(params),
      env_(env),
      identities_(std::move(identities)),
      roster_(RosterTree(identities_)),
      sum_(params.length, 0) {
  // A caller's bug: every client would refuse the round.
  if (identities_.size() != params_.n || roster_.root() != params_.roster) std::abort();
}

namespace {

// std::visit over lambdas, one per alternative.
template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

// A Close* result as addressed messages, by recipient.
template <typename M>
std::vector<AddressedMessage> ToEach(std::map<uint32_t, M> by_client) {
  std::vector<AddressedMessage> out;
  out.reserve(by_client.size());
  for (auto& [to, m] : by_client) out.push_back({to, std::move(m)});
  return out;
}

template <typename M>
std::vector<AddressedMessage> ToAll(M m) {
  std::vector<AddressedMessage> out;
  out.push_back({std::nullopt, std::move(m)});
  return out;
}

}  // namespace

Status SecAggServer::Handle(uint32_t from, SecAggClientMessage message) {
  return std::visit(Overloaded{
                        [&](SeedCommit& m) {
                          m.from = from;
                          return OnSeedCommit(m);
                        },
                        [&](KeyAdvert& m) {
                          m.index = from;
                          return OnAdvertise(m);
                        },
                        [&](SealedShares& m) {
                          m.from = from;
                          return OnShares(std::move(m));
                        },
                        [&](ShareCheck& m) {
                          m.from = from;
                          return OnShareCheck(m);
                        },
                        [&](CheckedConfirmation& m) {
                          m.from = from;
                          return OnConfirmation(m);
                        },
                        [&](MaskedInput& m) {
                          m.from = from;
                          return OnMaskedInput(m);
                        },
                        [&](SurvivorSignature& m) {
                          m.from = from;
                          return OnSignature(m);
                        },
                        [&](UnmaskResponse& m) {
                          m.from = from;
                          return OnUnmask(std::move(m));
                        },
                    },
                    message);
}

StatusOr<std::vector<AddressedMessage>> SecAggServer::Close() {
  switch (stage_) {
    case SecAggStage::kCommitSeed: {
      COHORT_ASSIGN_OR_RETURN(auto roots, CloseSeedCommit());
      return ToEach(std::move(roots));
    }
    case SecAggStage::kAdvertiseKeys: {
      COHORT_ASSIGN_OR_RETURN(auto lists, CloseAdvertise());
      return ToEach(std::move(lists));
    }
    case SecAggStage::kShareKeys: {
      COHORT_ASSIGN_OR_RETURN(auto inbound, CloseShares());
      return ToEach(std::move(inbound));
    }
    case SecAggStage::kCheckShares: {
      COHORT_ASSIGN_OR_RETURN(CheckedList checked, CloseShareCheck());
      return ToAll(std::move(checked));
    }
    case SecAggStage::kConfirmChecked: {
      COHORT_ASSIGN_OR_RETURN(auto confirmations, CloseConfirmation());
      return ToEach(std::move(confirmations));
    }
    case SecAggStage::kMaskedInput: {
      COHORT_ASSIGN_OR_RETURN(SurvivorList survivors, CloseMaskedInput());
      return ToAll(std::move(survivors));
    }
    case SecAggStage::kConsistency: {
      COHORT_ASSIGN_OR_RETURN(auto requests, CloseConsistency());
      return ToEach(std::move(requests));
    }
    default:
      return FailedPreconditionError(
          std::string("secagg server: no stage to close at ") +
          (stage_ == SecAggStage::kNone ? "the end" : StageName(stage_)));
  }
}

Status SecAggServer::Abort(const std::string& why) {
  aborted_ = true;
  sum_.assign(sum_.size(), 0);
  relayed_.clear();
  return FailedPreconditionError("secure aggregation aborted: " + why);
}

void SecAggServer::Blame(uint32_t client, std::string what) {
  // Once a round: a client refused at its advert also revealed no seed,
  // and is not named again for that at CloseAdvertise.
  if (!blamed_.insert(client).second) return;
  misbehaviour_.push_back({client, std::move(what)});
}

Status SecAggServer::OnSeedCommit(const SeedCommit& c) {
  if (aborted_ || stage_ != SecAggStage::kCommitSeed) {
    return FailedPreconditionError("seed commitment outside the CommitSeed stage");
  }
  if (c.from >= params_.n) return InvalidArgumentError("seed commitment from unknown index");
  if (!seed_commits_.emplace(c.from, c.commitment).second) {
    return InvalidArgumentError("second seed commitment from client " + Str(c.from));
  }
  return OkStatus();
}

StatusOr<std::map<uint32_t, SeedRoot>> SecAggServer::CloseSeedCommit() {
  if (aborted_ || stage_ != SecAggStage::kCommitSeed)
    return FailedPreconditionError("CloseSeedCommit out of order");
  for (const auto& [i, c] : seed_commits_) u0_.push_back(i);
  if (u0_.size() < params_.t) {
    return Abort(Str(u0_.size()) + " clients committed to the graph seed, need " + Str(params_.t));
  }
  std::vector<crypto::Digest> leaves(params_.n);
  for (uint32_t i = 0; i < params_.n; ++i) {
    auto it = seed_commits_.find(i);
    leaves[i] = SeedLeaf(params_.context, i,
                         it == seed_commits_.end() ? std::nullopt : std::optional(it->second));
  }
  const crypto::MerkleTree tree(std::move(leaves));
  seed_root_ = tree.root();
  std::map<uint32_t, SeedRoot> out;
  for (uint32_t u : u0_) out.emplace(u, SeedRoot{seed_root_, tree.Proof(u)});
  stage_ = SecAggStage::kAdvertiseKeys;
  return out;
}

Status SecAggServer::OnAdvertise(const KeyAdvert& a) {
  if (aborted_ || stage_ != SecAggStage::kAdvertiseKeys) {
    return FailedPreconditionError("advert outside the AdvertiseKeys stage");
  }
  if (a.index >= params_.n) return InvalidArgumentError("advert from unknown index");
  if (adverts_.count(a.index) || seeds_.count(a.index)) {
    return InvalidArgumentError("second advert from client " + Str(a.index));
  }
  if (excluded_.count(a.index)) {
    return FailedPreconditionError("client " + Str(a.index) + " is out of the round already");
  }
  auto commit = seed_commits_.find(a.index);
  if (commit == seed_commits_.end()) {
    return InvalidArgumentError("advert from client " + Str(a.index) +
                                ", which committed to no graph seed");
  }
  // A contribution that opens its commitment counts toward the seed even
  // when the rest of the advert is refused: the seed needs every one.
  if (SeedCommitment(params_.context, a.index, a.seed) != commit->second) {
    return Refuse(a.index, "advert's seed contribution does not open its commitment");
  }
  seeds_[a.index] = a.seed;
  // Checked here, before anyone else sees them: a bad key would make every
  // neighbour's key agreement fail, and the neighbours would take the blame.
  // The advert came on the client's own connection and is signed: whatever
  // is wrong with it is the client's doing, so it is named and excluded.
  if (!crypto::IsValidEncPublic(a.enc_key)) {
    return Refuse(a.index, "advert's encryption key is not a valid ristretto255 point");
  }
  if (!crypto::IsContributoryX25519(a.mask_key)) {
    return Refuse(a.index, "advert's mask key is a low-order X25519 point");
  }
  auto enc = enc_owner_.find(a.enc_key);
  auto mask = mask_owner_.find(a.mask_key);
  if (enc != enc_owner_.end() || mask != mask_owner_.end()) {
    const uint32_t owner = enc != enc_owner_.end() ? enc->second : mask->second;
    return Refuse(a.index, "advert repeats client " + Str(owner) + "'s public key");
  }
  if (!crypto::Verify(identities_[a.index], AsBytes(AdvertMessage(params_.context, a)),
                      a.signature)) {
    return Refuse(a.index,
                  "advert signature does not match client " + Str(a.index) + "'s identity");
  }
  adverts_[a.index] = a;
  enc_owner_[a.enc_key] = mask_owner_[a.mask_key] = a.index;
  return OkStatus();
}

Status SecAggServer::Refuse(uint32_t client, std::string what) {
  excluded_.insert(client);
  Blame(client, what);
  return InvalidArgumentError(what);
}

StatusOr<std::map<uint32_t, KeyList>> SecAggServer::CloseAdvertise() {
  if (aborted_ || stage_ != SecAggStage::kAdvertiseKeys)
    return FailedPreconditionError("CloseAdvertise out of order");
  // The seed needs every committed contribution: a server that could leave
  // some out would again choose among seeds. A client that committed and
  // then revealed nothing stops the round. It is not blamed: a crash, a
  // reconnect or the engine's own timeout look the same from here, and
  // without CURVE anyone can cause those (review of issue 29's change).
  std::vector<uint32_t> silent;
  const bool complete = params_.k + 1 >= params_.n;  // Needs no seed.
  for (uint32_t u : u0_) {
    if (!seeds_.count(u) && !complete) silent.push_back(u);
  }
  if (!silent.empty()) {
    std::string names;
    for (uint32_t u : silent) names += (names.empty() ? "" : ", ") + Str(u);
    return Abort("client(s) " + names +
                 " committed to the graph seed and revealed nothing; a seed without them would "
                 "be the coordinator's choice");
  }
  for (const auto& [i, a] : adverts_) u1_.push_back(i);
  if (u1_.size() < params_.t) {
    return Abort(Str(u1_.size()) + " clients advertised keys, need " + Str(params_.t));
  }
  std::vector<crypto::Digest> leaves(params_.n);
  for (uint32_t i = 0; i < params_.n; ++i) {
    auto it = adverts_.find(i);
    leaves[i] = AdvertLeaf(params_.context, i,
                           it == adverts_.end() ? std::nullopt : std::optional(it->second));
  }
  const crypto::MerkleTree tree(std::move(leaves));
  seeds_list_.assign(params_.n, std::nullopt);
  for (const auto& [i, seed] : seeds_) seeds_list_[i] = seed;
  const auto graph_seed = SecAggGraphSeed(params_, seed_root_, seeds_list_);
  session_ = SecAggSession(params_.context, tree.root(), graph_seed);
  graph_ = SecAggGraph(params_, graph_seed);
  neighbours_ = HararyNeighbours(*graph_);
  std::map<uint32_t, KeyList> out;
  for (uint32_t u : u1_) out.emplace(u, KeyListFor(u, tree));
  stage_ = SecAggStage::kShareKeys;
  return out;
}

KeyList SecAggServer::KeyListFor(uint32_t client, const crypto::MerkleTree& adverts) const {
  KeyList list;
  list.advert_root = adverts.root();
  list.seeds = seeds_list_;
  std::vector<uint32_t> members = neighbours_[client];
  members.insert(std::upper_bound(members.begin(), members.end(), client), client);
  for (uint32_t v : members) {
    ListedAdvert e;
    e.index = v;
    if (auto it = adverts_.find(v); it != adverts_.end()) {
      e.advert = it->second;
      e.identity = identities_[v];
      e.identity_proof = roster_.Proof(v);
    }
    e.advert_proof = adverts.Proof(v);
    list.entries.push_back(std::move(e));
  }
  return list;
}

Status SecAggServer::OnShares(SealedShares s) {
  if (aborted_ || stage_ != SecAggStage::kShareKeys)
    return FailedPreconditionError("shares outside the ShareKeys stage");
  if (!Contains(u1_, s.from)) return InvalidArgumentError("shares from a client not in U1");
  if (shares_.count(s.from)) return InvalidArgumentError("second set of shares");
  size_t expected = 0;
  for (uint32_t v : neighbours_[s.from]) {
    if (!Contains(u1_, v)) continue;
    ++expected;
    auto it = s.to.find(v);
    if (it == s.to.end()) return InvalidArgumentError("no shares for neighbour " + Str(v));
    if (it->second.size() != kSealedBytes) {
      return InvalidArgumentError("sealed shares for " + Str(v) + " have " +
                                  std::to_string(it->second.size()) + " bytes, expected " +
                                  std::to_string(kSealedBytes));
    }
  }
  if (s.to.size() != expected) return InvalidArgumentError("shares addressed to non-neighbours");
  const uint32_t from = s.from;
  shares_[from] = std::move(s);
  return OkStatus();
}

StatusOr<std::map<uint32_t, InboundShares>> SecAggServer::CloseShares() {
  if (aborted_ || stage_ != SecAggStage::kShareKeys)
    return FailedPreconditionError("CloseShares out of order");
  for (const auto& [u, s] : shares_) u2_.push_back(u);
  if (u2_.size() < params_.t) {
    return Abort(Str(u2_.size()) + " clients shared keys, need " + Str(params_.t));
  }
  std::map<uint32_t, InboundShares> out;
  for (uint32_t v : u2_) out[v];
  for (const auto& [u, s] : shares_) {
    for (const auto& [v, ct] : s.to) {
      if (Contains(u2_, v)) out[v].from[u] = ct;
    }
  }
  stage_ = SecAggStage::kCheckShares;
  return out;
}

StatusOr<bool> SecAggServer::ResolveComplaint(uint32_t from, const Complaint& c) {
  const Sealed sealed = ParseSealed(AsBytes(shares_.at(c.about).to.at(from)));
  // The sender's channel is authenticated: a bad signature on what it sent
  // is its own.
  if (!DealSigned(identities_[c.about], session_, c.about, from, sealed)) return true;
  if (!c.point) return false;  // Claimed a bad signature on a good one.
  const crypto::EncPublic& mine = adverts_.at(from).enc_key;
  const crypto::EncPublic& theirs = adverts_.at(c.about).enc_key;
  if (!crypto::VerifySharedPoint(mine, theirs, *c.point, c.proof,
                                 AsBytes(ComplaintContext(session_, c.about, from)))) {
    return false;
  }
  SecretBytes key = crypto::EncKeyFromPoint(*c.point, mine, theirs);
  return !OpenSealed(key, sealed, session_, c.about, from).ok();
}

Status SecAggServer::OnShareCheck(const ShareCheck& check) {
  if (aborted_ || stage_ != SecAggStage::kCheckShares) {
    return FailedPreconditionError("share check outside the CheckShares stage");
  }
  if (!Contains(u2_, check.from))
    return InvalidArgumentError("share check from a client not in U2");
  if (checked_.count(check.from)) return InvalidArgumentError("second share check");
  if (excluded_.count(check.from)) {
    return FailedPreconditionError("already out of the round after a complaint");
  }
  std::set<uint32_t> seen;
  for (const Complaint& c : check.complaints) {
    if (!seen.insert(c.about).second)
      return InvalidArgumentError("two complaints about one client");
    if (!Contains(neighbours_[check.from], c.about) || !Contains(u2_, c.about)) {
      return InvalidArgumentError("complaint about client " + Str(c.about) +
                                  ", which sent this client no shares");
    }
  }
  for (const Complaint& c : check.complaints) {
    if (excluded_.count(c.about)) continue;
    COHORT_ASSIGN_OR_RETURN(bool accused_lied, ResolveComplaint(check.from, c));
    if (!accused_lied) {
      excluded_.insert(check.from);
      const std::string what = "filed a false complaint about client " + Str(c.about);
      Blame(check.from, what);
      return InvalidArgumentError(what);
    }
    excluded_.insert(c.about);
    Blame(c.about,
          "sent client " + Str(check.from) +
              (c.point ? " shares that do not open or verify" : " shares with a bad signature"));
  }
  checked_.insert(check.from);
  return OkStatus();
}

StatusOr<CheckedList> SecAggServer::CloseShareCheck() {
  if (aborted_ || stage_ != SecAggStage::kCheckShares)
    return FailedPreconditionError("CloseShareCheck out of order");
  for (uint32_t u : checked_) {
    if (!excluded_.count(u)) u3_.push_back(u);
  }
  // What each dealer in U3 committed to for each holder in U3, as it came
  // on the dealer's own connection: a revealed share that matches it was
  // dealt, whatever the signature beside it (holders do not check
  // signatures on shares that open).
  relayed_.assign(params_.n, {});
  for (uint32_t dealer : u3_) {
    for (const auto& [holder, bytes] : shares_.at(dealer).to) {  // In holder order.
      if (!Contains(u3_, holder)) continue;
      const Sealed sealed = ParseSealed(AsBytes(bytes));
      relayed_[dealer].push_back({holder, {sealed.mask, sealed.self}});
    }
  }
  shares_.clear();
  if (u3_.size() < params_.t) {
    return Abort(Str(u3_.size()) + " clients passed the share check, need " + Str(params_.t));
  }
  COHORT_RETURN_IF_ERROR(AbortIfTooFewNeighboursLeft(u3_, "passed the share check"));
  stage_ = SecAggStage::kConfirmChecked;
  return CheckedList{u3_};
}

Status SecAggServer::OnConfirmation(const CheckedConfirmation& c) {
  if (aborted_ || stage_ != SecAggStage::kConfirmChecked) {
    return FailedPreconditionError("confirmation outside the ConfirmChecked stage");
  }
  if (!Contains(u3_, c.from)) return InvalidArgumentError("confirmation from a client not in U3");
  if (confirmations_.count(c.from)) return InvalidArgumentError("second confirmation");
  // The server cannot check a tag, only where it goes: to a neighbour in U3.
  for (const auto& [to, tag] : c.tags) {
    if (!Contains(neighbours_[c.from], to) || !Contains(u3_, to)) {
      return InvalidArgumentError("confirmation for client " + Str(to) +
                                  ", not a neighbour in the checked list");
    }
  }
  confirmations_[c.from] = c;
  return OkStatus();
}

StatusOr<std::map<uint32_t, Confirmations>> SecAggServer::CloseConfirmation() {
  if (aborted_ || stage_ != SecAggStage::kConfirmChecked)
    return FailedPreconditionError("CloseConfirmation out of order");
  if (confirmations_.size() < params_.t) {
    return Abort(Str(confirmations_.size()) + " clients confirmed the checked list, need " +
                 Str(params_.t));
  }
  std::vector<uint32_t> confirmed;
  for (const auto& [i, c] : confirmations_) confirmed.push_back(i);
  COHORT_RETURN_IF_ERROR(AbortIfTooFewNeighboursLeft(confirmed, "confirmed the checked list"));
  std::map<uint32_t, Confirmations> out;
  for (const auto& [from, c] : confirmations_) out[from];
  for (const auto& [from, c] : confirmations_) {
    for (const auto& [to, tag] : c.tags) {
      if (auto it = out.find(to); it != out.end()) it->second.from[from] = tag;
    }
  }
  confirmations_.clear();
  stage_ = SecAggStage::kMaskedInput;
  return out;
}

Status SecAggServer::OnMaskedInput(const MaskedInput& in) {
  return OnMaskedInput(in.from, {reinterpret_cast<const uint8_t*>(in.values.data()),
                                 in.values.size() * sizeof(uint32_t)});
}

Status SecAggServer::OnMaskedInput(uint32_t from, std::span<const uint8_t> words) {
  if (aborted_ || stage_ != SecAggStage::kMaskedInput) {
    return FailedPreconditionError("input outside the MaskedInput stage");
  }
  if (!Contains(u3_, from)) return InvalidArgumentError("masked input from a client not in U3");
  if (Contains(u4_, from)) return InvalidArgumentError("second masked input");
  if (words.size() != params_.length * sizeof(uint32_t)) {
    return InvalidArgumentError("masked input has " + std::to_string(words.size() / 4) +
                                " values, expected " + std::to_string(params_.length));
  }
  // Through a small buffer: the frame's bytes need not be uint32 objects.
  constexpr size_t kChunk = 2048;
  uint32_t chunk[kChunk];
  for (size_t begin = 0; begin < sum_.size(); begin += kChunk) {
    const size_t n = std::min(kChunk, sum_.size() - begin);
    std::memcpy(chunk, words.data() + begin * sizeof(uint32_t), n * sizeof(uint32_t));
    uint32_t* s = sum_.data() + begin;
    for (size_t i = 0; i < n; ++i) s[i] += chunk[i];
  }
  u4_.insert(std::upper_bound(u4_.begin(), u4_.end(), from), from);
  return OkStatus();
}

StatusOr<SurvivorList> SecAggServer::CloseMaskedInput() {
  if (aborted_ || stage_ != SecAggStage::kMaskedInput)
    return FailedPreconditionError("CloseMaskedInput out of order");
  if (u4_.size() < params_.t) {
    return Abort(Str(u4_.size()) + " masked inputs, need " + Str(params_.t));
  }
  COHORT_RETURN_IF_ERROR(AbortIfTooFewNeighboursLeft(u4_, "sent masked input"));
  stage_ = SecAggStage::kConsistency;
  return SurvivorList{u4_};
}

Status SecAggServer::OnSignature(const SurvivorSignature& s) {
  if (aborted_ || stage_ != SecAggStage::kConsistency) {
    return FailedPreconditionError("signature outside the consistency stage");
  }
  if (!Contains(u4_, s.from)) return InvalidArgumentError("signature from a client not in U4");
  if (signatures_.count(s.from)) return InvalidArgumentError("second survivor signature");
  if (!crypto::Verify(identities_[s.from], SurvivorListMessage(session_, u4_), s.signature)) {
    return InvalidArgumentError("bad survivor signature from client " + Str(s.from));
  }
  // The server cannot check a tag (the pair's key is theirs), only where it
  // goes: to a neighbour in U4, which checks it.
  for (const auto& [to, tag] : s.tags) {
    if (!Contains(neighbours_[s.from], to) || !Contains(u4_, to)) {
      return InvalidArgumentError("survivor tag for client " + Str(to) +
                                  ", not a neighbour in the survivor list");
    }
  }
  SurvivorSignature& kept = signatures_[s.from] = s;
  tags_[s.from] = std::move(kept.tags);
  kept.tags.clear();
  return OkStatus();
}

StatusOr<std::map<uint32_t, UnmaskRequest>> SecAggServer::CloseConsistency() {
  if (aborted_ || stage_ != SecAggStage::kConsistency)
    return FailedPreconditionError("CloseConsistency out of order");
  if (signatures_.size() < params_.t) {
    return Abort(Str(signatures_.size()) + " survivor signatures, need " + Str(params_.t));
  }
  std::vector<uint32_t> signers;
  for (const auto& [i, sig] : signatures_) signers.push_back(i);
  COHORT_RETURN_IF_ERROR(AbortIfTooFewNeighboursLeft(signers, "signed the survivor list"));
  std::vector<uint32_t> dropped;
  std::set_difference(u3_.begin(), u3_.end(), u4_.begin(), u4_.end(), std::back_inserter(dropped));
  // Each signature with its signer's key and proof, made once: most go to
  // many clients.
  std::map<uint32_t, SurvivorSignature> proven;
  for (const auto& [i, sig] : signatures_) {
    SurvivorSignature& s = proven.emplace(i, sig).first->second;
    s.identity = identities_[i];
    s.identity_proof = roster_.Proof(i);
  }
  std::map<uint32_t, UnmaskRequest> out;
  for (uint32_t u : u4_) {
    UnmaskRequest& req = out[u];
    req.survivors = u4_;
    req.dropped = dropped;
    for (uint32_t i : SignersFor(u)) {
      SurvivorSignature& s = req.signatures.emplace_back(proven.at(i));
      const auto& tags = tags_.at(i);
      if (auto tag = tags.find(u); tag != tags.end()) s.tag = tag->second;
    }
  }
  stage_ = SecAggStage::kUnmasking;
  return out;
}

Status SecAggServer::AbortIfTooFewNeighboursLeft(const std::vector<uint32_t>& left,
                                                 const char* left_as) {
  const bool inputs_known =
      stage_ == SecAggStage::kMaskedInput || stage_ == SecAggStage::kConsistency;
  for (uint32_t u : u3_) {
    uint32_t count = 0;
    for (uint32_t v : neighbours_[u]) count += Contains(left, v) ? 1 : 0;
    if (count >= params_.t) continue;
    const uint32_t k = neighbours_[u].size();
    return Abort("only " + Str(count) + " of client " + Str(u) + "'s " + Str(k) + " neighbours " +
                 left_as + ", need t = " + Str(params_.t) + " to rebuild its " +
                 (!inputs_known      ? "self mask or mask key"
                  : Contains(u4_, u) ? "self mask"
                                     : "mask key") +
                 ": too many of its neighbours dropped (k = " + Str(k) + ", t = " + Str(params_.t) +
                 ": a round survives at most k - t = " + Str(k - params_.t) +
                 " of a client's neighbours dropping)");
  }
  return OkStatus();
}

std::vector<uint32_t> SecAggServer::SignersFor(uint32_t client) const {
  std::vector<uint32_t> signers;
  if (graph_->complete()) {
    for (const auto& [i, s] : signatures_) signers.push_back(i);
    return signers;
  }
  // The signatures that count for the client's checked neighbours are
  // their own neighbours': on the ring, the positions within k/2 of a
  // checked neighbour's, not counting its own. With offsets from the
  // client's position, that is a sweep over [-k, k]: O(k) a client. (Going
  // through each neighbour's list was O(k^2): 1.5 s a round at n = 500,
  // k = 324.)
  const int64_t n = params_.n, half = params_.k / 2, at = graph_->Position(client);
  auto client_at = [&](int64_t offset) {
    return graph_->At(static_cast<uint32_t>(((at + offset) % n + n) % n));
  };
  // cover[o + k]: how many checked neighbours have offset o within k/2,
  // themselves included (a difference array, then its prefix sums).
  std::vector<int64_t> cover(4 * half + 2, 0);
  std::vector<bool> checked(2 * half + 1, false);  // By offset + k/2.
  for (int64_t d = -half; d <= half; ++d) {
    if (d == 0 || !Contains(u3_, client_at(d))) continue;
    checked[d + half] = true;
    ++cover[d - half + 2 * half];
    --cover[d + half + 1 + 2 * half];
  }
  for (int64_t o = -2 * half, running = 0; o <= 2 * half; ++o) {
    running += cover[o + 2 * half];
    const bool own = o >= -half && o <= half && checked[o + half];
    if (running - (own ? 1 : 0) <= 0) continue;
    const uint32_t w = client_at(o);
    if (signatures_.count(w)) signers.push_back(w);
  }
  // Sorted, and once each (offsets wrap round a ring shorter than 2k + 1).
  std::sort(signers.begin(), signers.end());
  signers.erase(std::unique(signers.begin(), signers.end()), signers.end());
  return signers;
}

Status SecAggServer::OnUnmask(UnmaskResponse r) {
  if (aborted_ || stage_ != SecAggStage::kUnmasking)
    return FailedPreconditionError("unmask outside the Unmasking stage");
  if (!Contains(u4_, r.from)) return InvalidArgumentError("unmask from a client not in U4");
  if (signatures_.count(r.from) == 0) {
    return InvalidArgumentError("unmask from a client that did not sign the survivor list");
  }
  if (unmasks_.count(r.from)) return InvalidArgumentError("second unmask response");
  std::set<uint32_t> seen;
  for (const auto& s : r.shares) {
    if (!seen.insert(s.about).second) return InvalidArgumentError("two shares about one client");
    if (!Contains(neighbours_[r.from], s.about) || !Contains(u3_, s.about)) {
      return InvalidArgumentError("share about client " + Str(s.about) +
                                  ", not a neighbour in the checked list");
    }
    if (s.is_self_mask != Contains(u4_, s.about)) {
      return InvalidArgumentError("share of the wrong kind about client " + Str(s.about));
    }
    if (crypto::ShamirShareX(s.share) != r.from + 1) return InvalidArgumentError("malformed share");
  }
  const uint32_t from = r.from;
  unmasks_.emplace(from, std::move(r));
  u6_.insert(std::upper_bound(u6_.begin(), u6_.end(), from), from);
  return OkStatus();
}

// Dealt by `dealer` to `holder`: the share it committed to on its own
// connection (a comparison), or else one it signed for the holder. The
// signature beside a share may be bad: a holder whose shares opened did
// not check it.
bool SecAggServer::Dealt(uint32_t dealer, uint32_t holder, const UnmaskShare& s) const {
  static const std::vector<Relayed> kNone;
  const auto& from_dealer = dealer < relayed_.size() ? relayed_[dealer] : kNone;
  auto it = std::lower_bound(from_dealer.begin(), from_dealer.end(), holder,
                             [](const Relayed& r, uint32_t h) { return r.holder < h; });
  if (it != from_dealer.end() && it->holder == holder &&
      ShareCommitment(session_, dealer, holder, s.is_self_mask, s.proof.salt, s.share.bytes()) ==
          it->commitments[s.is_self_mask ? 1 : 0]) {
    return true;
  }
  return DealtShareValid(identities_[dealer], session_, dealer, holder, s);
}

StatusOr<SecretBytes> SecAggServer::Rebuild(uint32_t about, bool self_mask,
                                            std::vector<Share> shares,
                                            crypto::ShamirCombiner& combiner) {
  const std::string what = self_mask ? "client " + Str(about) + "'s self mask"
                                     : "dropped client " + Str(about) + "'s mask key";
  const KeyAdvert& advert = adverts_.at(about);
  auto matches = [&](const SecretBytes& secret) {
    if (self_mask) {
      return SelfMaskCommitment(params_.context, about, secret.bytes()) == advert.self_commitment;
    }
    auto pair = crypto::X25519FromSeed(secret);
    return pair.ok() && pair->public_key == advert.mask_key;
  };
  auto combine = [&](const std::vector<Share>& from) -> std::optional<SecretBytes> {
    if (from.size() < params_.t) return std::nullopt;
    std::vector<const SecretBytes*> basis;
    for (uint32_t i = 0; i < params_.t; ++i) basis.push_back(&from[i].share->share);
    auto secret = combiner.Combine(basis, params_.t);
    if (!secret.ok() || !matches(*secret)) return std::nullopt;
    return std::move(*secret);
  };
  auto dealt = [&](const Share& s) { return Dealt(about, s.from, *s.share); };
  std::optional<SecretBytes> secret = combine(shares);
  if (!secret) {
    // A bad share among the first t (rare): keep only the shares `about`
    // itself dealt, and name whoever revealed another.
    std::vector<Share> signed_shares;
    for (const Share& s : shares) {
      if (dealt(s)) {
        signed_shares.push_back(s);
      } else {
        Blame(s.from, "revealed a forged share of " + what);
      }
    }
    shares = std::move(signed_shares);
    if (shares.size() < params_.t) {
      uint32_t answered = 0;
      for (uint32_t v : neighbours_[about]) answered += unmasks_.count(v) ? 1 : 0;
      return Abort(Str(shares.size()) + " valid shares of " + what + ", need " + Str(params_.t) +
                   " (" + Str(answered) + " of its " + Str(neighbours_[about].size()) +
                   " neighbours answered the unmask request)");
    }
    secret = combine(shares);
    if (!secret) {
      Blame(about, "dealt shares that do not rebuild its committed secret");
      return Abort(what + " cannot be rebuilt: client " + Str(about) + " dealt bad shares");
    }
  }
  // Shares beyond the first t were not used; still name a forger among them.
  // A signed share off the polynomial blames the dealer only when every
  // share of the basis is signed too: two colluding holders can forge
  // basis shares whose errors cancel in the secret.
  std::vector<const SecretBytes*> basis;
  for (uint32_t i = 0; i < params_.t; ++i) basis.push_back(&shares[i].share->share);
  std::optional<bool> basis_signed;
  for (size_t j = params_.t; j < shares.size(); ++j) {
    auto consistent = combiner.Consistent(basis, shares[j].share->share);
    if (consistent.ok() && *consistent) continue;
    if (!dealt(shares[j])) {
      Blame(shares[j].from, "revealed a forged share of " + what);
      continue;
    }
    if (!basis_signed) {
      basis_signed = true;
      for (uint32_t i = 0; i < params_.t; ++i) {
        if (!dealt(shares[i])) {
          basis_signed = false;
          Blame(shares[i].from, "revealed a forged share of " + what);
        }
      }
    }
    if (*basis_signed) Blame(about, "dealt shares that are not on one polynomial");
  }
  return std::move(*secret);
}

StatusOr<std::vector<uint32_t>> SecAggServer::Finalize() {
  if (aborted_ || stage_ != SecAggStage::kUnmasking)
    return FailedPreconditionError("Finalize out of order");
  // Shares by (subject, kind), from the responders in index order.
  std::map<std::pair<uint32_t, bool>, std::vector<Share>> by_subject;
  for (const auto& [from, r] : unmasks_) {
    for (const auto& s : r.shares) by_subject[{s.about, s.is_self_mask}].push_back({from, &s});
  }
  crypto::ShamirCombiner combiner;
  // Every mask to take out of the sum: survivors' self masks, and the pair
  // masks survivors shared with dropped neighbours.
  std::vector<SecretBytes> keys;
  std::vector<bool> subtract;
  for (uint32_t u : u4_) {
    COHORT_ASSIGN_OR_RETURN(SecretBytes b, Rebuild(u, true, by_subject[{u, true}], combiner));
    keys.push_back(std::move(b));
    subtract.push_back(true);
  }
  struct Pair {
    const crypto::X25519KeyPair* dropped;
    uint32_t survivor;
    bool survivor_first;
  };
  std::vector<crypto::X25519KeyPair> rebuilt_keys;
  rebuilt_keys.reserve(u3_.size());
  std::vector<Pair> pairs;
  for (uint32_t v : u3_) {
    if (Contains(u4_, v)) continue;
    COHORT_ASSIGN_OR_RETURN(SecretBytes seed, Rebuild(v, false, by_subject[{v, false}], combiner));
    COHORT_ASSIGN_OR_RETURN(crypto::X25519KeyPair rebuilt, crypto::X25519FromSeed(seed));
    rebuilt_keys.push_back(std::move(rebuilt));
    for (uint32_t u : neighbours_[v]) {
      if (Contains(u4_, u)) pairs.push_back({&rebuilt_keys.back(), u, u < v});
    }
  }
  // The X25519 agreements are the other big cost: spread them over the cores.
  const size_t first_pair = keys.size();
  keys.resize(first_pair + pairs.size());
  for (const Pair& p : pairs) subtract.push_back(p.survivor_first);  // u added +PRG when u < v.
  COHORT_RETURN_IF_ERROR(env_->ParallelFor(pairs.size(), [&](size_t i) -> Status {
    COHORT_ASSIGN_OR_RETURN(keys[first_pair + i],
                            PairMaskKey(pairs[i].dropped->secret_key, pairs[i].dropped->public_key,
                                        adverts_.at(pairs[i].survivor).mask_key, session_));
    return OkStatus();
  }));
  std::vector<crypto::MaskJob> jobs;
  jobs.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) jobs.push_back({&keys[i], subtract[i]});
  COHORT_RETURN_IF_ERROR(
      crypto::AddMasks(jobs, sum_, 0, crypto::PrgImpl::kAuto, params_.prg, env_));
  unmasks_.clear();
  relayed_.clear();
  tags_.clear();
  stage_ = SecAggStage::kNone;
  return std::move(sum_);
}

}  // namespace cohort::aggregation
