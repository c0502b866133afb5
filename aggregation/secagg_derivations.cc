#include "aggregation/secagg_derivations.h"

#include <sodium.h>

#include <cstdlib>
#include <cstring>

#include "aggregation/secagg_internal.h"
#include "crypto/aead.h"

namespace cohort::aggregation {
namespace secagg_internal {

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

Sealed ParseSealed(std::span<const uint8_t> bytes) {
  if (bytes.size() != kSealedBytes) std::abort();  // A caller's bug: never read past the end.
  Sealed s;
  s.blob = bytes.first(kBlobBytes);
  std::memcpy(s.mask.data(), bytes.data() + kBlobBytes, kCommit);
  std::memcpy(s.self.data(), bytes.data() + kBlobBytes + kCommit, kCommit);
  s.signature = SignatureAt(bytes.subspan(kBlobBytes + 2 * kCommit, kSig));
  return s;
}

bool DealSigned(const crypto::Ed25519Public& dealer_identity,
                const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                const Sealed& s) {
  return crypto::Verify(
      dealer_identity,
      DealMessage(session, dealer, holder, crypto::Hash256({s.blob}), s.mask, s.self), s.signature);
}

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

}  // namespace secagg_internal

using secagg_internal::AsBytes;
using secagg_internal::PutBytes;
using secagg_internal::PutU32;

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

InputRules InputRulesOf(const SecAggSetup& setup) {
  return {setup.l2_clip,
          setup.dp_clip_norm,
          setup.dp_scale,
          setup.dp_l2_bound,
          setup.dp_share_variance,
          setup.dp_count_scale,
          setup.dp_count_share_variance,
          setup.task_digest};
}

std::array<uint8_t, 32> SecAggContext(std::span<const uint8_t> nonce, uint32_t round,
                                      uint64_t task_id, const SecAggParams& params, float clip,
                                      double scale, double total_weight, const InputRules& rules) {
  // v4: one dealer signature per holder (DealMessage). A client of another
  // version fails every advert signature here, which the server refuses
  // without blaming anyone, instead of mistaking the other's sealed shares
  // (the same size) for a bad signature.
  // v5: the roster travels as a Merkle root, the key list as proofs.
  // v6: the input rules (l2_clip, distributed DP's grid, bound and share).
  // v7: the task's digest (TaskDigest), so that every client of a session
  // trains the same architecture from the same parameters with the same
  // settings.
  std::string m = "cohort-secagg-context-v7";
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
  put(rules.l2_clip);
  put(rules.dp_clip_norm);
  put(rules.dp_scale);
  put(rules.dp_l2_bound);
  put(rules.dp_share_variance);
  // Only with adaptive clipping's count word (which came after v6's rules).
  if (rules.dp_count_scale != 0 || rules.dp_count_share_variance != 0) {
    put(rules.dp_count_scale);
    put(rules.dp_count_share_variance);
  }
  m.append(reinterpret_cast<const char*>(rules.task.data()), rules.task.size());
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

}  // namespace cohort::aggregation
