#include "aggregation/secagg_client.h"

#include <sodium.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "aggregation/secagg_internal.h"
#include "common/parallel.h"
#include "common/rng.h"
#include "crypto/aead.h"
#include "crypto/prg.h"

namespace cohort::aggregation {

using secagg_internal::AsBytes;
using secagg_internal::ComplaintContext;
using secagg_internal::Contains;
using secagg_internal::DealSigned;
using secagg_internal::kCommit;
using secagg_internal::kPlainBytes;
using secagg_internal::kSalt;
using secagg_internal::kSealedBytes;
using secagg_internal::kShare;
using secagg_internal::kSig;
using secagg_internal::Opened;
using secagg_internal::OpenSealed;
using secagg_internal::PairMaskKey;
using secagg_internal::ParseSealed;
using secagg_internal::PutBytes;
using secagg_internal::PutU32;
using secagg_internal::Sealed;
using secagg_internal::ShareAd;
using secagg_internal::SortedUnique;
using secagg_internal::Str;

namespace {

// The key of a pair's survivor tags: a hash of its sealing key, which is
// never itself used as a MAC key. Only the pair holds it. A point revealed
// in a complaint always belongs to a pair with a misbehaving member (a
// dealer that signed shares that do not open, or a complainant that lies),
// and a tag forged under it is that member's own word, which counts among
// the corrupt anyway, or convinces only that member.
SecretBytes SurvivorTagKey(const SecretBytes& sealing_key) {
  static constexpr char kLabel[] = "cohort-secagg-survivor-tag-key";
  auto h = crypto::Hash256(
      {{reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel)}, sealing_key.bytes()});
  SecretBytes key(32);
  std::memcpy(key.bytes().data(), h.data(), 32);
  sodium_memzero(h.data(), h.size());
  return key;
}

// Signer `from`'s word to neighbour `to` that it signed the survivor list
// whose SurvivorListMessage hashes to `list` (keyed BLAKE2b; the session is
// in the message). Bound to both indices: a tag neither moves to another
// recipient nor comes back to its maker as the other's.
SurvivorTag MakeSurvivorTag(const SecretBytes& key, uint32_t from, uint32_t to,
                            const crypto::Digest& list) {
  static constexpr char kLabel[] = "cohort-secagg-survivor-tag";
  std::string who;
  PutU32(who, from);
  PutU32(who, to);
  return crypto::Hash256(
      {{reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel)}, AsBytes(who), list},
      key.bytes());
}

// For each subject (a checked neighbour of the client), how many survivors
// among the subject's own neighbours vouch for one survivor list. Positions
// are on the ring (indices on the complete graph, where all are adjacent).
class VouchCount {
 public:
  VouchCount(std::vector<uint32_t> positions, uint32_t t, uint32_t n, uint32_t half, bool complete)
      : positions_(std::move(positions)),
        counts_(positions_.size(), 0),
        short_of_t_(positions_.size()),
        t_(t),
        n_(n),
        half_(half),
        complete_(complete) {}

  uint32_t Distance(uint32_t p, uint32_t q) const {
    const uint32_t d = p > q ? p - q : q - p;
    return complete_ ? std::min<uint32_t>(d, 1) : std::min(d, n_ - d);
  }
  // The subjects still short of t that a voucher at position p counts for
  // (never a subject for itself).
  std::vector<size_t> Helps(uint32_t p) const {
    std::vector<size_t> out;
    for (size_t i = 0; i < positions_.size(); ++i) {
      const uint32_t d = Distance(positions_[i], p);
      if (d != 0 && d <= half_ && counts_[i] < t_) out.push_back(i);
    }
    return out;
  }
  void Add(const std::vector<size_t>& helps) {
    for (size_t i : helps) {
      if (++counts_[i] == t_) --short_of_t_;
    }
  }
  bool done() const { return short_of_t_ == 0; }
  // The first subject short of t, if any.
  std::optional<size_t> Short() const {
    for (size_t i = 0; i < counts_.size(); ++i) {
      if (counts_[i] < t_) return i;
    }
    return std::nullopt;
  }
  uint32_t count(size_t i) const { return counts_[i]; }

 private:
  std::vector<uint32_t> positions_, counts_;
  size_t short_of_t_;
  uint32_t t_, n_, half_;
  bool complete_;
};

}  // namespace

// --- Client -----------------------------------------------------------------

SecAggClient::SecAggClient(const SecAggParams& params, uint32_t index,
                           const crypto::Ed25519KeyPair* identity, crypto::MerkleProof roster_proof,
                           Env* env)
    : params_(params),
      env_(env),
      index_(index),
      identity_(identity),
      roster_proof_(std::move(roster_proof)) {}

StatusOr<SeedCommit> SecAggClient::CommitSeed() {
  if (stage_ != 0) return FailedPreconditionError("secagg client: seed already committed");
  if (!crypto::VerifyMerkleProof(params_.roster, params_.n, index_,
                                 RosterLeaf(index_, identity_->public_key), roster_proof_)) {
    return InvalidArgumentError(
        "secagg setup: the roster does not hold this client's identity at "
        "its index");
  }
  randombytes_buf(seed_.data(), seed_.size());
  stage_ = 1;
  return SeedCommit{index_, SeedCommitment(params_.context, index_, seed_)};
}

StatusOr<KeyAdvert> SecAggClient::AdvertiseKeys(const SeedRoot& root) {
  if (stage_ != 1) return FailedPreconditionError("secagg client: AdvertiseKeys out of order");
  stage_ = -1;
  // The root must hold this client's commitment before it reveals what the
  // commitment hides: otherwise the server could fix the root after seeing
  // the contribution.
  if (!crypto::VerifyMerkleProof(
          root.root, params_.n, index_,
          SeedLeaf(params_.context, index_, SeedCommitment(params_.context, index_, seed_)),
          root.proof)) {
    return InvalidArgumentError(
        "seed commitments: the root does not hold this client's commitment at its index");
  }
  seed_root_ = root.root;
  COHORT_ASSIGN_OR_RETURN(enc_, crypto::GenerateEncKey());
  mask_seed_ = crypto::RandomSecret(crypto::kX25519SecretBytes);
  COHORT_ASSIGN_OR_RETURN(mask_, crypto::X25519FromSeed(mask_seed_));
  self_seed_ = crypto::RandomSecret(crypto::kShamirSecretBytes);
  KeyAdvert advert;
  advert.index = index_;
  advert.enc_key = enc_.public_key;
  advert.mask_key = mask_.public_key;
  advert.self_commitment = SelfMaskCommitment(params_.context, index_, self_seed_.bytes());
  advert.seed = seed_;
  COHORT_ASSIGN_OR_RETURN(
      advert.signature, crypto::Sign(*identity_, AsBytes(AdvertMessage(params_.context, advert))));
  stage_ = 2;
  return advert;
}

Status SecAggClient::CheckListedAdvert(const crypto::Digest& root, const ListedAdvert& e) const {
  const std::string who = "key list: client " + Str(e.index);
  if (!crypto::VerifyMerkleProof(root, params_.n, e.index,
                                 AdvertLeaf(params_.context, e.index, e.advert), e.advert_proof)) {
    return InvalidArgumentError(who + "'s entry is not under the list's root");
  }
  if (!e.advert) return OkStatus();
  const KeyAdvert& a = *e.advert;
  if (a.index != e.index) return InvalidArgumentError(who + "'s advert names another index");
  if (!crypto::VerifyMerkleProof(params_.roster, params_.n, e.index,
                                 RosterLeaf(e.index, e.identity), e.identity_proof)) {
    return InvalidArgumentError(who + "'s identity key is not the roster's");
  }
  if (!crypto::Verify(e.identity, AsBytes(AdvertMessage(params_.context, a)), a.signature)) {
    return InvalidArgumentError(who + " has a bad signature");
  }
  // The server must have refused these; one that forwards them is broken.
  if (!crypto::IsValidEncPublic(a.enc_key) || !crypto::IsContributoryX25519(a.mask_key)) {
    return InvalidArgumentError(who + " advertised an invalid key, which the server forwarded");
  }
  return OkStatus();
}

Status SecAggClient::CheckIdentity(uint32_t index, const crypto::Ed25519Public& identity) {
  auto [it, added] = known_identities_.emplace(identity, index);
  if (!added && it->second != index) {
    return InvalidArgumentError("the identity key of client " + Str(index) + " is also client " +
                                Str(it->second) + "'s");
  }
  return OkStatus();
}

Status SecAggClient::CheckKeyList(const KeyList& list) {
  // Exactly this client and its neighbours, by index: the graph is keyed by
  // the root, so the server can hide no neighbour's entry (an absent one
  // has its own leaf) and add no other.
  std::vector<uint32_t> expected = neighbours_;
  expected.insert(std::upper_bound(expected.begin(), expected.end(), index_), index_);
  if (list.entries.size() != expected.size()) {
    return InvalidArgumentError("key list: " + Str(list.entries.size()) + " entries, expected " +
                                Str(expected.size()) + " (this client and its neighbours)");
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (list.entries[i].index != expected[i]) {
      return InvalidArgumentError("key list: entry " + Str(list.entries[i].index) +
                                  " where neighbour " + Str(expected[i]) + " was due");
    }
  }
  COHORT_RETURN_IF_ERROR(env_->ParallelFor(list.entries.size(), [&](size_t i) -> Status {
    return CheckListedAdvert(list.advert_root, list.entries[i]);
  }));
  std::set<crypto::EncPublic> enc_keys;
  std::set<crypto::X25519Public> mask_keys;
  for (const ListedAdvert& e : list.entries) {
    if (!e.advert) {
      if (e.index == index_)
        return InvalidArgumentError("key list: this client's keys are missing");
      continue;
    }
    const KeyAdvert& a = *e.advert;
    // The advert must reveal the contribution the list seeds the graph with
    // (the server checked it against the commitment).
    if (!complete_ && (e.index >= list.seeds.size() || list.seeds[e.index] != a.seed)) {
      return InvalidArgumentError("key list: client " + Str(e.index) +
                                  "'s advert reveals another seed contribution than the list");
    }
    if (!enc_keys.insert(a.enc_key).second || !mask_keys.insert(a.mask_key).second) {
      return InvalidArgumentError("key list: repeated public key (client " + Str(a.index) + ")");
    }
    COHORT_RETURN_IF_ERROR(CheckIdentity(e.index, e.identity));
    if (e.index == index_) {
      if (e.identity != identity_->public_key || a.enc_key != enc_.public_key ||
          a.mask_key != mask_.public_key ||
          a.self_commitment != SelfMaskCommitment(params_.context, index_, self_seed_.bytes())) {
        return InvalidArgumentError("key list: this client's keys were replaced");
      }
      continue;
    }
    neighbour_adverts_[e.index] = a;
    neighbour_identities_[e.index] = e.identity;
  }
  return OkStatus();
}

StatusOr<std::array<uint8_t, 32>> SecAggClient::CheckSeeds(
    std::span<const std::optional<SeedContribution>> seeds) const {
  // The complete graph needs no seed: every client is every other's
  // neighbour, so a committer that revealed nothing is a plain dropout.
  if (params_.k + 1 >= params_.n) return std::array<uint8_t, 32>{};
  if (seeds.size() != params_.n) {
    return InvalidArgumentError("key list: " + Str(seeds.size()) +
                                " seed contributions, expected " + Str(params_.n));
  }
  if (!seeds[index_] || *seeds[index_] != seed_) {
    return InvalidArgumentError("key list: this client's seed contribution was replaced");
  }
  // Every committed contribution, and nothing else: the root this client
  // checked before it revealed must come back from them.
  std::vector<crypto::Digest> leaves(params_.n);
  for (uint32_t i = 0; i < params_.n; ++i) {
    leaves[i] = SeedLeaf(
        params_.context, i,
        seeds[i] ? std::optional(SeedCommitment(params_.context, i, *seeds[i])) : std::nullopt);
  }
  if (crypto::MerkleTree(std::move(leaves)).root() != seed_root_) {
    return InvalidArgumentError(
        "key list: the seed contributions do not rebuild the committed root (one was left out, "
        "added or changed)");
  }
  return SecAggGraphSeed(params_, seed_root_, seeds);
}

StatusOr<SealedShares> SecAggClient::ShareKeys(const KeyList& list) {
  if (stage_ != 2) return FailedPreconditionError("secagg client: ShareKeys out of order");
  stage_ = -1;  // Any early return leaves the round.
  COHORT_ASSIGN_OR_RETURN(const auto graph_seed, CheckSeeds(list.seeds));
  session_ = SecAggSession(params_.context, list.advert_root, graph_seed);
  {
    const HararyGraph graph = SecAggGraph(params_, graph_seed);
    neighbours_ = graph.Neighbours(index_);
    complete_ = graph.complete();
    const uint32_t n = params_.n, pos = graph.Position(index_);
    for (uint32_t d = 0; !complete_ && d <= params_.k; ++d) {
      for (uint32_t p : {(pos + d) % n, (pos + n - d % n) % n}) window_[graph.At(p)] = p;
    }
  }
  COHORT_RETURN_IF_ERROR(CheckKeyList(list));
  if (neighbour_adverts_.size() < params_.t) {
    return FailedPreconditionError("key list: " + Str(neighbour_adverts_.size()) +
                                   " neighbours, below the threshold " + Str(params_.t));
  }
  std::vector<uint32_t> xs;
  std::vector<const KeyAdvert*> recipients;
  for (const auto& [v, a] : neighbour_adverts_) {
    xs.push_back(v + 1);
    recipients.push_back(&a);
  }
  COHORT_ASSIGN_OR_RETURN(auto mask_shares, crypto::ShamirSplit(mask_seed_, params_.t, xs));
  COHORT_ASSIGN_OR_RETURN(auto self_shares, crypto::ShamirSplit(self_seed_, params_.t, xs));
  std::vector<std::string> sealed(recipients.size());
  std::vector<SecretBytes> keys(recipients.size());
  COHORT_RETURN_IF_ERROR(env_->ParallelFor(recipients.size(), [&](size_t i) -> Status {
    const uint32_t v = recipients[i]->index;
    COHORT_ASSIGN_OR_RETURN(SecretBytes point,
                            crypto::EncSharedPoint(enc_.secret_key, recipients[i]->enc_key));
    keys[i] = crypto::EncKeyFromPoint(point.bytes(), enc_.public_key, recipients[i]->enc_key);
    COHORT_ASSIGN_OR_RETURN(sealed[i], SealFor(v, keys[i], mask_shares[i], self_shares[i]));
    return OkStatus();
  }));
  SealedShares out;
  out.from = index_;
  for (size_t i = 0; i < recipients.size(); ++i) {
    out.to[recipients[i]->index] = std::move(sealed[i]);
    // The key is symmetric: the same one opens what this neighbour deals.
    tag_keys_[recipients[i]->index] = SurvivorTagKey(keys[i]);
    pair_keys_[recipients[i]->index] = std::move(keys[i]);
  }
  stage_ = 3;
  return out;
}

StatusOr<std::string> SecAggClient::SealFor(uint32_t v, const SecretBytes& key,
                                            const SecretBytes& mask_share,
                                            const SecretBytes& self_share) const {
  // Plaintext: each share with the salt of its commitment. The commitments
  // travel in the clear beside the ciphertext, under one signature, so
  // either share can later be shown to the server and checked on its own.
  SecretBytes plain(kPlainBytes);
  uint8_t* p = plain.bytes().data();
  std::memcpy(p, mask_share.bytes().data(), kShare);
  randombytes_buf(p + kShare, kSalt);
  std::memcpy(p + kShare + kSalt, self_share.bytes().data(), kShare);
  randombytes_buf(p + 2 * kShare + kSalt, kSalt);
  const Commitment mask =
      ShareCommitment(session_, index_, v, false, {p + kShare, kSalt}, mask_share.bytes());
  const Commitment self = ShareCommitment(session_, index_, v, true,
                                          {p + 2 * kShare + kSalt, kSalt}, self_share.bytes());
  COHORT_ASSIGN_OR_RETURN(std::string sealed,
                          crypto::Seal(key, plain.bytes(), AsBytes(ShareAd(session_, index_, v))));
  COHORT_ASSIGN_OR_RETURN(
      auto signature,
      crypto::Sign(*identity_, DealMessage(session_, index_, v, crypto::Hash256({AsBytes(sealed)}),
                                           mask, self)));
  PutBytes(sealed, mask);
  PutBytes(sealed, self);
  PutBytes(sealed, signature);
  return sealed;
}

Status SecAggClient::OpenShares(uint32_t v, const std::string& sealed, Held& held) const {
  auto key = pair_keys_.find(v);
  if (key == pair_keys_.end()) return InvalidArgumentError("no key shared with client " + Str(v));
  const Sealed s = ParseSealed(AsBytes(sealed));
  COHORT_ASSIGN_OR_RETURN(Opened o, OpenSealed(key->second, s, session_, v, index_));
  const auto blob_hash = crypto::Hash256({s.blob});
  held.mask_share = std::move(o.mask_share);
  held.self_share = std::move(o.self_share);
  held.mask_proof = {o.mask_salt, s.self, blob_hash, s.signature};
  held.self_proof = {o.self_salt, s.mask, blob_hash, s.signature};
  return OkStatus();
}

StatusOr<ShareCheck> SecAggClient::CheckShares(const InboundShares& inbound) {
  if (stage_ != 3) return FailedPreconditionError("secagg client: CheckShares out of order");
  stage_ = -1;
  std::vector<std::pair<uint32_t, const std::string*>> items;
  for (const auto& [v, sealed] : inbound.from) {
    if (neighbour_adverts_.count(v) == 0) {
      return InvalidArgumentError("shares from client " + Str(v) +
                                  ", not a neighbour that advertised keys");
    }
    items.emplace_back(v, &sealed);
  }
  enum class Verdict { kOk, kBadSignature, kBadShares };
  std::vector<Verdict> verdicts(items.size(), Verdict::kOk);
  std::vector<Held> held(items.size());
  COHORT_RETURN_IF_ERROR(env_->ParallelFor(items.size(), [&](size_t i) -> Status {
    const auto [v, sealed] = items[i];
    const auto bytes = AsBytes(*sealed);
    // Shares that open are v's: the AEAD key is v's and this client's
    // alone. Their signature is not checked here (38 verifications a round
    // at k = 38); the server checks a revealed share against what it
    // relayed from v (SecAggServer::Rebuild). Before a complaint, though,
    // the sender's signature: without it the server (which relays the
    // bytes) could be the one who changed them, and the complaint's proof
    // would hand it the key to an honest sender's shares.
    if (bytes.size() == kSealedBytes && OpenShares(v, *sealed, held[i]).ok()) return OkStatus();
    verdicts[i] = bytes.size() == kSealedBytes && DealSigned(neighbour_identities_.at(v), session_,
                                                             v, index_, ParseSealed(bytes))
                      ? Verdict::kBadShares
                      : Verdict::kBadSignature;
    return OkStatus();
  }));
  ShareCheck out;
  out.from = index_;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint32_t v = items[i].first;
    if (verdicts[i] == Verdict::kOk) {
      held_[v] = std::move(held[i]);
      continue;
    }
    Complaint c;
    c.about = v;
    if (verdicts[i] == Verdict::kBadShares) {
      // Signed by v, yet not openable: prove the key, so the server can see
      // for itself what v sealed. This reveals only what v and this client
      // exchanged.
      const KeyAdvert& a = neighbour_adverts_.at(v);
      COHORT_ASSIGN_OR_RETURN(SecretBytes point,
                              crypto::EncSharedPoint(enc_.secret_key, a.enc_key));
      c.point.emplace();
      std::memcpy(c.point->data(), point.bytes().data(), c.point->size());
      COHORT_ASSIGN_OR_RETURN(
          c.proof,
          crypto::ProveSharedPoint(enc_.secret_key, enc_.public_key, a.enc_key, point.bytes(),
                                   AsBytes(ComplaintContext(session_, v, index_))));
    }
    out.complaints.push_back(c);
  }
  pair_keys_.clear();  // Needed only to open what the neighbours sealed.
  stage_ = 4;
  return out;
}

StatusOr<CheckedConfirmation> SecAggClient::ReceiveChecked(const CheckedList& list) {
  if (stage_ != 4) return FailedPreconditionError("secagg client: ReceiveChecked out of order");
  stage_ = -1;
  if (!SortedUnique(list.members, params_.n)) {
    return InvalidArgumentError("checked list: not sorted, unique and < n");
  }
  if (!Contains(list.members, index_)) {
    return FailedPreconditionError("checked list omits this client");
  }
  uint32_t neighbours_in = 0;
  for (uint32_t v : list.members) {
    if (!Contains(neighbours_, v)) continue;
    if (held_.count(v) == 0) {
      return FailedPreconditionError("checked list names client " + Str(v) +
                                     ", whose shares this client does not hold");
    }
    ++neighbours_in;
  }
  if (neighbours_in < params_.t) {
    return FailedPreconditionError("checked list: " + Str(neighbours_in) +
                                   " neighbours left, below the threshold " + Str(params_.t));
  }
  checked_ = list.members;
  // The tag keys of neighbours outside U3 are needed no more. A neighbour
  // this client complained about (its point may be the server's) is either
  // outside U3 or was refused above: this client holds none of its shares.
  std::erase_if(tag_keys_, [&](const auto& e) { return !Contains(checked_, e.first); });
  CheckedConfirmation out;
  out.from = index_;
  const crypto::Digest list_hash = crypto::Hash256({CheckedListMessage(session_, checked_)});
  for (const auto& [v, key] : tag_keys_) {
    out.tags[v] = MakeSurvivorTag(key, index_, v, list_hash);
  }
  stage_ = 5;
  return out;
}

Status SecAggClient::ReceiveConfirmations(const Confirmations& confirmations) {
  if (stage_ != 5) return FailedPreconditionError("secagg client: confirmations out of order");
  stage_ = -1;
  // Only a neighbour's tag counts, and only over the U3 this client holds:
  // t of them mean that at least t - c honest neighbours mask with this
  // very list, so the server cannot make this client mask against a list
  // of its own making (issue 29).
  const crypto::Digest list_hash = crypto::Hash256({CheckedListMessage(session_, checked_)});
  uint32_t confirmed = 0;
  for (const auto& [v, tag] : confirmations.from) {
    auto key = tag_keys_.find(v);
    if (key == tag_keys_.end()) continue;  // Not a neighbour in U3.
    const SurvivorTag expected = MakeSurvivorTag(key->second, v, index_, list_hash);
    if (sodium_memcmp(expected.data(), tag.data(), tag.size()) == 0) ++confirmed;
  }
  if (confirmed < params_.t) {
    return FailedPreconditionError("checked list: " + Str(confirmed) +
                                   " neighbours confirmed it, below the threshold " +
                                   Str(params_.t) + "; not masking against it");
  }
  stage_ = 6;
  return OkStatus();
}

StatusOr<MaskedInput> SecAggClient::MaskInput(std::vector<uint32_t> input) {
  if (stage_ != 6) return FailedPreconditionError("secagg client: MaskInput out of order");
  stage_ = -1;
  if (input.size() != params_.length) {
    return InvalidArgumentError("input has " + std::to_string(input.size()) + " values, expected " +
                                std::to_string(params_.length));
  }
  MaskedInput out;
  out.from = index_;
  out.values = std::move(input);  // Masked in place.
  std::vector<uint32_t> peers;
  for (uint32_t v : neighbours_) {
    if (Contains(checked_, v)) peers.push_back(v);
  }
  std::vector<SecretBytes> pair_keys(peers.size());
  COHORT_RETURN_IF_ERROR(env_->ParallelFor(peers.size(), [&](size_t i) -> Status {
    COHORT_ASSIGN_OR_RETURN(pair_keys[i],
                            PairMaskKey(mask_.secret_key, mask_.public_key,
                                        neighbour_adverts_.at(peers[i]).mask_key, session_));
    return OkStatus();
  }));
  std::vector<crypto::MaskJob> jobs = {{&self_seed_, false}};
  for (size_t i = 0; i < peers.size(); ++i) {
    // The smaller index adds, the larger subtracts: the pair cancels.
    jobs.push_back({&pair_keys[i], /*subtract=*/peers[i] < index_});
  }
  COHORT_RETURN_IF_ERROR(
      crypto::AddMasks(jobs, out.values, 0, crypto::PrgImpl::kAuto, params_.prg, env_));
  self_seed_.Reset();
  stage_ = 7;
  return out;
}

StatusOr<SurvivorSignature> SecAggClient::SignSurvivors(const SurvivorList& list) {
  if (stage_ != 7) return FailedPreconditionError("secagg client: SignSurvivors out of order");
  stage_ = -1;
  if (!SortedUnique(list.survivors, params_.n)) {
    return InvalidArgumentError("survivor list: not sorted, unique and < n");
  }
  if (!Contains(list.survivors, index_)) {
    return FailedPreconditionError("survivor list omits this client, which sent its input");
  }
  uint32_t neighbours_left = 0;
  for (uint32_t v : list.survivors) {
    if (!Contains(checked_, v)) {
      return FailedPreconditionError("survivor list names client " + Str(v) +
                                     ", which is not in the checked list");
    }
    neighbours_left += Contains(neighbours_, v) ? 1 : 0;
  }
  if (neighbours_left < params_.t) {
    return FailedPreconditionError("survivor list: " + Str(neighbours_left) +
                                   " neighbours left, below the threshold");
  }
  signed_survivors_ = list.survivors;
  SurvivorSignature out;
  out.from = index_;
  const std::vector<uint8_t> msg = SurvivorListMessage(session_, list.survivors);
  COHORT_ASSIGN_OR_RETURN(out.signature, crypto::Sign(*identity_, msg));
  const crypto::Digest list_hash = crypto::Hash256({msg});
  for (const auto& [v, key] : tag_keys_) {
    if (Contains(list.survivors, v)) out.tags[v] = MakeSurvivorTag(key, index_, v, list_hash);
  }
  stage_ = 8;
  return out;
}

std::optional<uint32_t> SecAggClient::RingPosition(uint32_t v) const {
  if (complete_) return v;
  auto it = window_.find(v);
  if (it == window_.end()) return std::nullopt;  // Too far to count.
  return it->second;
}

bool SecAggClient::TagChecks(const SurvivorSignature& s, const crypto::Digest& list_hash) const {
  auto key = tag_keys_.find(s.from);
  if (!s.tag || key == tag_keys_.end()) return false;
  const SurvivorTag expected = MakeSurvivorTag(key->second, s.from, index_, list_hash);
  return sodium_memcmp(expected.data(), s.tag->data(), expected.size()) == 0;
}

Status SecAggClient::CheckSignatures(const UnmaskRequest& request) {
  const std::vector<uint8_t> msg = SurvivorListMessage(session_, request.survivors);
  const crypto::Digest list_hash = crypto::Hash256({msg});
  // Counted among each subject's own neighbours: no two different lists can
  // both reach t there, so every honest client that reveals anything about
  // v saw the same list. Checking stops once every subject has t.
  std::vector<uint32_t> subjects, positions;
  for (uint32_t v : neighbours_) {
    if (!Contains(checked_, v)) continue;
    subjects.push_back(v);
    positions.push_back(*RingPosition(v));
  }
  VouchCount count(positions, params_.t, params_.n, complete_ ? params_.n : params_.k / 2,
                   complete_);
  const uint32_t me = *RingPosition(index_);
  // This client signed this very list (Unmask compared them): its word
  // counts for each of its neighbours. Then the tags, a hash each; the
  // signatures last, nearest first (on the ring, those count for the
  // subjects the tags left short).
  count.Add(count.Helps(me));
  std::set<uint32_t> seen = {index_};
  std::vector<std::pair<uint32_t, const SurvivorSignature*>> rest;  // By distance.
  for (const auto& s : request.signatures) {
    if (count.done()) break;
    if (s.from >= params_.n || seen.count(s.from) || !Contains(request.survivors, s.from)) continue;
    const auto at = RingPosition(s.from);
    if (!at) continue;
    if (TagChecks(s, list_hash)) {
      seen.insert(s.from);
      count.Add(count.Helps(*at));
      continue;
    }
    rest.emplace_back(count.Distance(me, *at), &s);
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [distance, s] : rest) {
    if (count.done()) break;
    if (seen.count(s->from)) continue;
    // A signature that would count for no subject is not worth verifying.
    const std::vector<size_t> helps = count.Helps(*RingPosition(s->from));
    if (helps.empty()) continue;
    if (!crypto::VerifyMerkleProof(params_.roster, params_.n, s->from,
                                   RosterLeaf(s->from, s->identity), s->identity_proof) ||
        !crypto::Verify(s->identity, msg, s->signature)) {
      continue;
    }
    COHORT_RETURN_IF_ERROR(CheckIdentity(s->from, s->identity));
    seen.insert(s->from);
    count.Add(helps);
  }
  if (auto i = count.Short()) {
    return FailedPreconditionError("unmask request carries " + Str(count.count(*i)) +
                                   " valid survivor signatures from client " + Str(subjects[*i]) +
                                   "'s neighbours (tags and this client's own included), below "
                                   "the threshold " +
                                   Str(params_.t));
  }
  return OkStatus();
}

namespace {

// A stage call's result as Handle's reply.
template <typename M>
StatusOr<std::optional<SecAggClientMessage>> Reply(StatusOr<M> m) {
  if (!m.ok()) return m.status();
  return std::optional<SecAggClientMessage>(std::move(*m));
}

}  // namespace

StatusOr<std::optional<SecAggClientMessage>> SecAggClient::Handle(
    const SecAggServerMessage& message) {
  using Result = StatusOr<std::optional<SecAggClientMessage>>;
  struct Stage {
    SecAggClient& c;
    Result operator()(const SeedRoot& m) { return Reply(c.AdvertiseKeys(m)); }
    Result operator()(const KeyList& m) { return Reply(c.ShareKeys(m)); }
    Result operator()(const InboundShares& m) { return Reply(c.CheckShares(m)); }
    Result operator()(const CheckedList& m) { return Reply(c.ReceiveChecked(m)); }
    Result operator()(const Confirmations& m) {
      COHORT_RETURN_IF_ERROR(c.ReceiveConfirmations(m));
      return std::optional<SecAggClientMessage>();
    }
    Result operator()(const SurvivorList& m) { return Reply(c.SignSurvivors(m)); }
    Result operator()(const UnmaskRequest& m) { return Reply(c.Unmask(m)); }
  };
  return std::visit(Stage{*this}, message);
}

StatusOr<UnmaskResponse> SecAggClient::Unmask(const UnmaskRequest& request) {
  if (stage_ != 8) return FailedPreconditionError("secagg client: Unmask out of order");
  stage_ = -1;
  if (!SortedUnique(request.survivors, params_.n) || !SortedUnique(request.dropped, params_.n)) {
    return InvalidArgumentError("unmask request: lists not sorted, unique and < n");
  }
  for (uint32_t v : request.dropped) {
    if (Contains(request.survivors, v)) {
      return FailedPreconditionError(
          "unmask request names client " + Str(v) +
          " both as survivor and as dropped: refusing to reveal both shares");
    }
  }
  if (request.survivors != signed_survivors_) {
    return FailedPreconditionError("unmask request's survivor list differs from the one signed");
  }
  // The dropped are exactly the checked clients that did not survive.
  std::vector<uint32_t> dropped;
  std::set_difference(checked_.begin(), checked_.end(), request.survivors.begin(),
                      request.survivors.end(), std::back_inserter(dropped));
  if (request.dropped != dropped) {
    return FailedPreconditionError(
        "unmask request's dropped list is not the checked list minus the survivors");
  }
  COHORT_RETURN_IF_ERROR(CheckSignatures(request));
  UnmaskResponse out;
  out.from = index_;
  for (uint32_t v : neighbours_) {
    if (!Contains(checked_, v)) continue;
    Held& h = held_.at(v);
    UnmaskShare s;
    s.about = v;
    s.is_self_mask = Contains(request.survivors, v);
    s.share = std::move(s.is_self_mask ? h.self_share : h.mask_share);
    s.proof = s.is_self_mask ? h.self_proof : h.mask_proof;
    out.shares.push_back(std::move(s));
  }
  // Nothing secret is needed any more (the salts hide the unrevealed shares'
  // commitments; wiped with them).
  for (auto& [v, h] : held_) {
    sodium_memzero(h.mask_proof.salt.data(), h.mask_proof.salt.size());
    sodium_memzero(h.self_proof.salt.data(), h.self_proof.salt.size());
  }
  held_.clear();
  tag_keys_.clear();
  enc_.secret_key.Reset();
  mask_.secret_key.Reset();
  mask_seed_.Reset();
  stage_ = 9;
  return out;
}

std::vector<UnmaskShare> SecAggClient::HeldSharesForTesting(uint32_t dealer) const {
  std::vector<UnmaskShare> out;
  auto it = held_.find(dealer);
  if (it == held_.end()) return out;
  for (bool self : {false, true}) {
    UnmaskShare s;
    s.about = dealer;
    s.is_self_mask = self;
    const SecretBytes& from = self ? it->second.self_share : it->second.mask_share;
    s.share = SecretBytes(from.size());
    std::memcpy(s.share.bytes().data(), from.bytes().data(), from.size());
    s.proof = self ? it->second.self_proof : it->second.mask_proof;
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<std::array<uint8_t, 32>> SecAggClient::ConfirmationForTesting(
    uint32_t to, const CheckedList& list) const {
  auto key = tag_keys_.find(to);
  if (key == tag_keys_.end()) return std::nullopt;
  return MakeSurvivorTag(key->second, index_, to,
                         crypto::Hash256({CheckedListMessage(session_, list.members)}));
}

StatusOr<Complaint> SecAggClient::ComplaintForTesting(uint32_t dealer) const {
  const KeyAdvert& a = neighbour_adverts_.at(dealer);
  COHORT_ASSIGN_OR_RETURN(SecretBytes point, crypto::EncSharedPoint(enc_.secret_key, a.enc_key));
  Complaint c;
  c.about = dealer;
  c.point.emplace();
  std::memcpy(c.point->data(), point.bytes().data(), c.point->size());
  COHORT_ASSIGN_OR_RETURN(
      c.proof, crypto::ProveSharedPoint(enc_.secret_key, enc_.public_key, a.enc_key, point.bytes(),
                                        AsBytes(ComplaintContext(session_, dealer, index_))));
  return c;
}

}  // namespace cohort::aggregation
