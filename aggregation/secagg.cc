#include "aggregation/secagg.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "common/parallel.h"
#include "common/rng.h"
#include "crypto/aead.h"
#include "crypto/prg.h"

namespace cohort::aggregation {
namespace {

constexpr size_t kShare = crypto::kShamirShareBytes;
constexpr size_t kSig = crypto::kSignatureBytes;
constexpr size_t kSalt = 32;
constexpr size_t kCommit = sizeof(Commitment);
// Plaintext of one neighbour's sealed shares: the mask-seed share and the
// salt of its commitment, then the self-mask share and its salt.
constexpr size_t kPlainBytes = 2 * (kShare + kSalt);
constexpr size_t kBlobBytes = crypto::kAeadNonceBytes + kPlainBytes + crypto::kAeadTagBytes;
// The AEAD blob, the commitments to the mask-seed share and to the self-mask
// share, and the dealer's one signature over the three (DealMessage).
constexpr size_t kSealedBytes = kBlobBytes + 2 * kCommit + kSig;

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void PutBytes(std::string& out, std::span<const uint8_t> b) {
  out.append(reinterpret_cast<const char*>(b.data()), b.size());
}

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string ShareAd(const std::array<uint8_t, 32>& session, uint32_t from, uint32_t to) {
  std::string ad(reinterpret_cast<const char*>(session.data()), session.size());
  ad += "sharekeys";
  PutU32(ad, from);
  PutU32(ad, to);
  return ad;
}

std::string ComplaintContext(const std::array<uint8_t, 32>& session, uint32_t dealer,
                             uint32_t holder) {
  std::string m = "cohort-secagg-complaint";
  PutBytes(m, session);
  PutU32(m, dealer);
  PutU32(m, holder);
  return m;
}

crypto::Signature SignatureAt(std::span<const uint8_t> bytes) {
  crypto::Signature s;
  std::memcpy(s.data(), bytes.data(), s.size());
  return s;
}

// The pairwise mask key: a hash of the X25519 agreement and the session.
StatusOr<SecretBytes> PairMaskKey(const SecretBytes& my_secret, const crypto::X25519Public& mine,
                                  const crypto::X25519Public& theirs,
                                  const std::array<uint8_t, 32>& session) {
  static constexpr char kLabel[] = "cohort-secagg-pair-mask";
  COHORT_ASSIGN_OR_RETURN(SecretBytes shared, crypto::AgreeX25519(my_secret, mine, theirs));
  auto h = crypto::Hash256(
      {{reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel)}, shared.bytes(), session});
  SecretBytes key(32);
  std::memcpy(key.bytes().data(), h.data(), 32);
  sodium_memzero(h.data(), h.size());  // std::fill may be elided as a dead store.
  return key;
}

// One neighbour's sealed shares as they travel (kSealedBytes long).
struct Sealed {
  std::span<const uint8_t> blob;
  Commitment mask{}, self{};
  crypto::Signature signature{};
};
// Only for bytes of kSealedBytes (every caller has checked the size).
Sealed ParseSealed(std::span<const uint8_t> bytes) {
  if (bytes.size() != kSealedBytes) std::abort();  // A caller's bug: never read past the end.
  Sealed s;
  s.blob = bytes.first(kBlobBytes);
  std::memcpy(s.mask.data(), bytes.data() + kBlobBytes, kCommit);
  std::memcpy(s.self.data(), bytes.data() + kBlobBytes + kCommit, kCommit);
  s.signature = SignatureAt(bytes.subspan(kBlobBytes + 2 * kCommit, kSig));
  return s;
}

// Whether `dealer` signed these sealed shares for `holder`.
bool DealSigned(const crypto::Ed25519Public& dealer_identity,
                const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                const Sealed& s) {
  return crypto::Verify(
      dealer_identity,
      DealMessage(session, dealer, holder, crypto::Hash256({s.blob}), s.mask, s.self), s.signature);
}

// A neighbour's sealed shares, opened and checked against the signed
// commitments: the AEAD, the share x-coordinates and both commitments. The
// signature is checked apart (DealSigned), and only when this fails.
struct Opened {
  SecretBytes mask_share, self_share;
  std::array<uint8_t, kSalt> mask_salt{}, self_salt{};
};
StatusOr<Opened> OpenSealed(const SecretBytes& key, const Sealed& s,
                            const std::array<uint8_t, 32>& session, uint32_t dealer,
                            uint32_t holder) {
  auto plain = crypto::Open(key, s.blob, AsBytes(ShareAd(session, dealer, holder)));
  if (!plain.ok()) return InvalidArgumentError("sealed shares do not open");
  if (plain->size() != kPlainBytes)
    return InvalidArgumentError("sealed shares have the wrong size");
  const uint8_t* p = plain->bytes().data();
  Opened o;
  o.mask_share = SecretBytes(kShare);
  o.self_share = SecretBytes(kShare);
  std::memcpy(o.mask_share.bytes().data(), p, kShare);
  std::memcpy(o.mask_salt.data(), p + kShare, kSalt);
  std::memcpy(o.self_share.bytes().data(), p + kShare + kSalt, kShare);
  std::memcpy(o.self_salt.data(), p + 2 * kShare + kSalt, kSalt);
  if (crypto::ShamirShareX(o.mask_share) != holder + 1 ||
      crypto::ShamirShareX(o.self_share) != holder + 1) {
    return InvalidArgumentError("shares are not addressed to this client");
  }
  if (ShareCommitment(session, dealer, holder, false, o.mask_salt, o.mask_share.bytes()) !=
          s.mask ||
      ShareCommitment(session, dealer, holder, true, o.self_salt, o.self_share.bytes()) != s.self) {
    return InvalidArgumentError("a share does not match its signed commitment");
  }
  return o;
}

bool SortedUnique(const std::vector<uint32_t>& v, uint32_t n) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

bool Contains(const std::vector<uint32_t>& sorted, uint32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

// log P[X = i] for X ~ Binomial(k, p).
double LogBinomialPmf(uint32_t k, uint32_t i, double p) {
  return std::lgamma(k + 1.0) - std::lgamma(i + 1.0) - std::lgamma(k - i + 1.0) + i * std::log(p) +
         (k - i) * std::log1p(-p);
}

double BinomialCdfBelow(uint32_t k, uint32_t t, double p) {  // P[X < t]
  if (p <= 0) return t > 0 ? 1.0 : 0.0;
  if (p >= 1) return t > k ? 1.0 : 0.0;
  double sum = 0;
  for (uint32_t i = 0; i < t && i <= k; ++i) sum += std::exp(LogBinomialPmf(k, i, p));
  return std::min(sum, 1.0);
}

std::string Str(uint32_t v) { return std::to_string(v); }

}  // namespace

std::string AdvertMessage(const std::array<uint8_t, 32>& context, const KeyAdvert& a) {
  std::string m = "cohort-secagg-advert-v3";
  PutBytes(m, context);
  PutU32(m, a.index);
  PutBytes(m, a.enc_key);
  PutBytes(m, a.mask_key);
  PutBytes(m, a.self_commitment);
  PutBytes(m, a.seed);
  return m;
}

Commitment SelfMaskCommitment(const std::array<uint8_t, 32>& context, uint32_t index,
                              std::span<const uint8_t> seed) {
  std::string m = "cohort-secagg-self-commitment";
  PutBytes(m, context);
  PutU32(m, index);
  return crypto::Hash256({AsBytes(m), seed});
}

crypto::Digest AdvertLeaf(const std::array<uint8_t, 32>& context, uint32_t index,
                          const std::optional<KeyAdvert>& advert) {
  std::string m = "cohort-secagg-advert-leaf";
  PutU32(m, index);
  if (!advert) {
    m.push_back(0);
    return crypto::Hash256({AsBytes(m), context});
  }
  m.push_back(1);
  PutBytes(m, advert->signature);
  return crypto::Hash256({AsBytes(m), AsBytes(AdvertMessage(context, *advert))});
}

// The graph seed is in the session, so clients shown different commitment
// roots (or contributions) hold different sessions, and nothing they sign,
// seal or tag for each other checks (a review of issue 29's change).
std::array<uint8_t, 32> SecAggSession(const std::array<uint8_t, 32>& context,
                                      const crypto::Digest& advert_root,
                                      const std::array<uint8_t, 32>& graph_seed) {
  static constexpr char kLabel[] = "cohort-secagg-session-v3";
  return crypto::Hash256({{reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel)},
                          context,
                          advert_root,
                          graph_seed});
}

Commitment SeedCommitment(const std::array<uint8_t, 32>& context, uint32_t index,
                          const SeedContribution& contribution) {
  std::string m = "cohort-secagg-seed-commitment";
  PutBytes(m, context);
  PutU32(m, index);
  return crypto::Hash256({AsBytes(m), contribution});
}

crypto::Digest SeedLeaf(const std::array<uint8_t, 32>& context, uint32_t index,
                        const std::optional<Commitment>& commitment) {
  std::string m = "cohort-secagg-seed-leaf";
  PutU32(m, index);
  m.push_back(commitment ? 1 : 0);
  if (commitment) PutBytes(m, *commitment);
  return crypto::Hash256({AsBytes(m), context});
}

// Every contribution the commitment root holds, in roster order. The root
// was fixed before any was revealed, and each honest contribution is 32
// fresh random bytes hidden by its commitment, so the seed is uniform
// whatever the server chose before: it can abort a round, never pick among
// seeds (docs/architecture.md, "The graph seed").
std::array<uint8_t, 32> GraphSeed(const std::array<uint8_t, 32>& context,
                                  const crypto::Digest& seed_root,
                                  std::span<const std::optional<SeedContribution>> seeds) {
  std::string m = "cohort-secagg-graph-seed";
  PutBytes(m, context);
  PutBytes(m, seed_root);
  PutU32(m, static_cast<uint32_t>(seeds.size()));
  for (const auto& s : seeds) {
    m.push_back(s ? 1 : 0);
    if (s) PutBytes(m, *s);
  }
  return crypto::Hash256({AsBytes(m)});
}

std::array<uint8_t, 32> SecAggGraphSeed(const SecAggParams& params, const crypto::Digest& seed_root,
                                        std::span<const std::optional<SeedContribution>> seeds) {
  if (params.k + 1 >= params.n) return {};
  return GraphSeed(params.context, seed_root, seeds);
}

HararyGraph SecAggGraph(const SecAggParams& params, const std::array<uint8_t, 32>& graph_seed) {
  // v4: keyed by the committed contributions (GraphSeed), no longer by the
  // advert root, which the server could grind by leaving adverts out.
  static constexpr char kLabel[] = "cohort-secagg-graph-v4";
  const auto h =
      crypto::Hash256({graph_seed, {reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel)}});
  GraphKey key;
  std::memcpy(key.data(), h.data(), key.size());
  return HararyGraph(params.n, params.k, key);
}

std::vector<uint8_t> CheckedListMessage(const std::array<uint8_t, 32>& session,
                                        std::span<const uint32_t> members) {
  std::string m = "cohort-secagg-checked";
  PutBytes(m, session);
  PutU32(m, static_cast<uint32_t>(members.size()));
  for (uint32_t u : members) PutU32(m, u);
  return {m.begin(), m.end()};
}

std::vector<uint8_t> SurvivorListMessage(const std::array<uint8_t, 32>& session,
                                         std::span<const uint32_t> survivors) {
  std::string m = "cohort-secagg-survivors";
  PutBytes(m, session);
  PutU32(m, static_cast<uint32_t>(survivors.size()));
  for (uint32_t s : survivors) PutU32(m, s);
  return {m.begin(), m.end()};
}

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

Commitment ShareCommitment(const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                           bool self_mask, std::span<const uint8_t> salt,
                           std::span<const uint8_t> share) {
  std::string m = "cohort-secagg-share-commitment";
  PutBytes(m, session);
  PutU32(m, dealer);
  PutU32(m, holder);
  m.push_back(self_mask ? 1 : 0);
  return crypto::Hash256({AsBytes(m), salt, share});
}

std::vector<uint8_t> DealMessage(const std::array<uint8_t, 32>& session, uint32_t dealer,
                                 uint32_t holder, const std::array<uint8_t, 32>& blob_hash,
                                 const Commitment& mask, const Commitment& self) {
  std::string m = "cohort-secagg-deal";
  PutBytes(m, session);
  PutU32(m, dealer);
  PutU32(m, holder);
  PutBytes(m, blob_hash);
  PutBytes(m, mask);
  PutBytes(m, self);
  return {m.begin(), m.end()};
}

bool DealtShareValid(const crypto::Ed25519Public& dealer_identity,
                     const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                     const UnmaskShare& s) {
  const Commitment c =
      ShareCommitment(session, dealer, holder, s.is_self_mask, s.proof.salt, s.share.bytes());
  const Commitment& mask = s.is_self_mask ? s.proof.other : c;
  const Commitment& self = s.is_self_mask ? c : s.proof.other;
  return crypto::Verify(dealer_identity,
                        DealMessage(session, dealer, holder, s.proof.blob_hash, mask, self),
                        s.proof.signature);
}

uint32_t MaxCorruptNeighbours(uint32_t n, uint32_t k, double corrupt) {
  const auto in_cohort = static_cast<uint32_t>(std::ceil(corrupt * n - 1e-9));
  if (k + 1 >= n || corrupt <= 0) return std::min(in_cohort, k);
  // Union bound over the n clients of P[more than c of k neighbours
  // corrupt], with the tail summed from the top (one pass, O(k), and no
  // cancellation in 1 - CDF).
  const double budget = std::ldexp(1.0, -20) / n;
  double tail = 0;  // P[X > c] for the c of the current step.
  uint32_t c = k;
  while (c > 0) {
    const double next = tail + std::exp(LogBinomialPmf(k, c, corrupt));  // P[X > c - 1]
    if (next > budget) break;
    tail = next;
    --c;
  }
  return std::min(c, in_cohort);
}

uint32_t SecureThreshold(uint32_t n, uint32_t k, double corrupt) {
  return (k + MaxCorruptNeighbours(n, k, corrupt)) / 2 + 1;
}

StatusOr<SecAggParams> ChooseSecAggParams(uint32_t n, double dropout, double corrupt, bool complete,
                                          size_t length) {
  // Two clients are a cohort only when neither is assumed to collude with
  // the coordinator (corrupt = 0 gives k = 1, t = 1): each sum then hides
  // both inputs from the coordinator, and a lone survivor is refused
  // (SignSurvivors: fewer than t neighbours left).
  if (n < 2) return InvalidArgumentError("secagg: need at least 2 clients");
  if (!(dropout >= 0 && dropout < 1) || !(corrupt >= 0 && corrupt < 0.5)) {
    return InvalidArgumentError("secagg: dropout must be in [0, 1) and corrupt in [0, 0.5)");
  }
  SecAggParams p;
  p.n = n;
  p.length = length;
  p.k = n - 1;
  if (!complete && n > 16) {
    // Union bounds over the clients. Security (the corrupt neighbours of
    // one client exceed what t tolerates) has 2^-20 inside SecureThreshold;
    // an abort (too few neighbours survive) gets 2^-10: it costs one round,
    // not privacy.
    const double abort_budget = std::ldexp(1.0, -10) / n;
    for (uint32_t k = 4; k < n - 1; k += 2) {
      const uint32_t t = SecureThreshold(n, k, corrupt);
      if (t <= k && BinomialCdfBelow(k, t, 1.0 - dropout) <= abort_budget) {
        p.k = k;
        break;
      }
    }
  }
  p.t = SecureThreshold(n, p.k, corrupt);
  if (p.t > p.k) {
    return InvalidArgumentError("secagg: no threshold fits " + Str(n) + " clients with " +
                                std::to_string(corrupt) + " of them corrupt");
  }
  return p;
}

Status CheckSecAggParams(uint32_t n, uint32_t k, uint32_t t, double corrupt) {
  if (n < 2 || k == 0 || k >= n || t == 0 || t > k || (k + 1 < n && k % 2 != 0)) {
    return FailedPreconditionError("secagg setup: n=" + Str(n) + ", k=" + Str(k) + ", t=" + Str(t) +
                                   " do not describe a neighbour graph and threshold");
  }
  const uint32_t needed = SecureThreshold(n, k, corrupt);
  if (t < needed) {
    return FailedPreconditionError(
        "secagg setup: threshold t=" + Str(t) + " is weaker than this client's t=" + Str(needed) +
        " for n=" + Str(n) + ", k=" + Str(k) + " with up to " +
        Str(MaxCorruptNeighbours(n, k, corrupt)) + " corrupt neighbours (corrupt fraction " +
        std::to_string(corrupt) + "): two halves of the neighbours could each reach t");
  }
  return OkStatus();
}

std::array<uint8_t, 32> SecAggContext(std::span<const uint8_t> nonce, uint32_t round,
                                      uint64_t task_id, const SecAggParams& params, float clip,
                                      double scale, double total_weight) {
  // v4: one dealer signature per holder (DealMessage). A client of another
  // version fails every advert signature here, which the server refuses
  // without blaming anyone, instead of mistaking the other's sealed shares
  // (the same size) for a bad signature.
  // v5: the roster travels as a Merkle root, the key list as proofs.
  std::string m = "cohort-secagg-context-v5";
  m.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  auto put = [&m](const auto& v) { m.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(round);
  put(task_id);
  put(params.n);
  put(params.k);
  put(params.t);
  put(static_cast<uint64_t>(params.length));
  put(static_cast<uint8_t>(params.prg));
  put(clip);
  put(scale);
  put(total_weight);
  m.append(reinterpret_cast<const char*>(params.roster.data()), params.roster.size());
  return crypto::Hash256({AsBytes(m)});
}

crypto::Digest RosterLeaf(uint32_t index, const crypto::Ed25519Public& identity) {
  std::string m = "cohort-secagg-roster-leaf";
  PutU32(m, index);
  PutBytes(m, identity);
  return crypto::Hash256({AsBytes(m)});
}

crypto::MerkleTree RosterTree(std::span<const crypto::Ed25519Public> identities) {
  std::vector<crypto::Digest> leaves;
  leaves.reserve(identities.size());
  for (uint32_t i = 0; i < identities.size(); ++i) leaves.push_back(RosterLeaf(i, identities[i]));
  return crypto::MerkleTree(std::move(leaves));
}

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
  if (aborted_ || stage_ != 0) {
    return FailedPreconditionError("seed commitment outside the CommitSeed stage");
  }
  if (c.from >= params_.n) return InvalidArgumentError("seed commitment from unknown index");
  if (!seed_commits_.emplace(c.from, c.commitment).second) {
    return InvalidArgumentError("second seed commitment from client " + Str(c.from));
  }
  return OkStatus();
}

StatusOr<std::map<uint32_t, SeedRoot>> SecAggServer::CloseSeedCommit() {
  if (aborted_ || stage_ != 0) return FailedPreconditionError("CloseSeedCommit out of order");
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
  stage_ = 1;
  return out;
}

Status SecAggServer::OnAdvertise(const KeyAdvert& a) {
  if (aborted_ || stage_ != 1) {
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
  if (aborted_ || stage_ != 1) return FailedPreconditionError("CloseAdvertise out of order");
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
  stage_ = 2;
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
  if (aborted_ || stage_ != 2) return FailedPreconditionError("shares outside the ShareKeys stage");
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
  if (aborted_ || stage_ != 2) return FailedPreconditionError("CloseShares out of order");
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
  stage_ = 3;
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
  if (aborted_ || stage_ != 3) {
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
  if (aborted_ || stage_ != 3) return FailedPreconditionError("CloseShareCheck out of order");
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
  stage_ = 4;
  return CheckedList{u3_};
}

Status SecAggServer::OnConfirmation(const CheckedConfirmation& c) {
  if (aborted_ || stage_ != 4) {
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
  if (aborted_ || stage_ != 4) return FailedPreconditionError("CloseConfirmation out of order");
  if (confirmations_.size() < params_.t) {
    return Abort(Str(confirmations_.size()) + " clients confirmed the checked list, need " +
                 Str(params_.t));
  }
  std::map<uint32_t, Confirmations> out;
  for (const auto& [from, c] : confirmations_) out[from];
  for (const auto& [from, c] : confirmations_) {
    for (const auto& [to, tag] : c.tags) {
      if (auto it = out.find(to); it != out.end()) it->second.from[from] = tag;
    }
  }
  confirmations_.clear();
  stage_ = 5;
  return out;
}

Status SecAggServer::OnMaskedInput(const MaskedInput& in) {
  return OnMaskedInput(in.from, {reinterpret_cast<const uint8_t*>(in.values.data()),
                                 in.values.size() * sizeof(uint32_t)});
}

Status SecAggServer::OnMaskedInput(uint32_t from, std::span<const uint8_t> words) {
  if (aborted_ || stage_ != 5) {
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
  if (aborted_ || stage_ != 5) return FailedPreconditionError("CloseMaskedInput out of order");
  if (u4_.size() < params_.t) {
    return Abort(Str(u4_.size()) + " masked inputs, need " + Str(params_.t));
  }
  stage_ = 6;
  return SurvivorList{u4_};
}

Status SecAggServer::OnSignature(const SurvivorSignature& s) {
  if (aborted_ || stage_ != 6) {
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
  if (aborted_ || stage_ != 6) return FailedPreconditionError("CloseConsistency out of order");
  if (signatures_.size() < params_.t) {
    return Abort(Str(signatures_.size()) + " survivor signatures, need " + Str(params_.t));
  }
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
  stage_ = 7;
  return out;
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
  if (aborted_ || stage_ != 7) return FailedPreconditionError("unmask outside the Unmasking stage");
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
      return Abort(Str(shares.size()) + " valid shares of " + what + ", need " + Str(params_.t));
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
  if (aborted_ || stage_ != 7) return FailedPreconditionError("Finalize out of order");
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
  stage_ = 8;
  return std::move(sum_);
}

}  // namespace cohort::aggregation
