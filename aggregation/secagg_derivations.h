// What every party of secure aggregation derives alike: the context and
// session, the roster, commitments and Merkle leaves, the graph seed and the
// graph, and the bytes that are signed or tagged (secagg.h has the protocol).
#ifndef COHORT_AGGREGATION_SECAGG_DERIVATIONS_H_
#define COHORT_AGGREGATION_SECAGG_DERIVATIONS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aggregation/harary_graph.h"
#include "aggregation/secagg_messages.h"
#include "aggregation/secagg_params.h"
#include "crypto/keys.h"
#include "crypto/merkle.h"

namespace cohort::aggregation {

// The session context (SecAggParams::context), computed by every party from
// the round's public parameters, the roster root among them: a coordinator
// that tells two clients different parameters (weights, scale, cohort,
// identities) makes their signatures over each other's keys fail.
// `rules`: what each client does to its input before masking (the setup's
// l2_clip and distributed DP's numbers), bound too, so that no client can be
// told a coarser grid or a smaller noise share than the others unnoticed.
struct InputRules {
  float l2_clip = 0;
  double dp_clip_norm = 0, dp_scale = 0, dp_l2_bound = 0, dp_share_variance = 0;
  // Adaptive clipping's count word (0, 0: none; then the context is what
  // it was before the word existed).
  double dp_count_scale = 0, dp_count_share_variance = 0;
  // The task the input is trained from (SecAggSetup::task_digest).
  crypto::Digest task{};
};
InputRules InputRulesOf(const SecAggSetup& setup);
std::array<uint8_t, 32> SecAggContext(std::span<const uint8_t> nonce, uint32_t round,
                                      uint64_t task_id, const SecAggParams& params, float clip,
                                      double scale, double total_weight,
                                      const InputRules& rules = {});

// The roster: client i's identity key is leaf i (RosterLeaf) of a Merkle
// tree whose root every party binds into the context.
crypto::Digest RosterLeaf(uint32_t index, const crypto::Ed25519Public& identity);
crypto::MerkleTree RosterTree(std::span<const crypto::Ed25519Public> identities);

// Stage 0: the commitment to client `index`'s contribution to the graph
// seed, and the leaf of its roster position in the commitment tree (none:
// it committed nothing, and contributes nothing).
Commitment SeedCommitment(const std::array<uint8_t, 32>& context, uint32_t index,
                          const SeedContribution& contribution);
crypto::Digest SeedLeaf(const std::array<uint8_t, 32>& context, uint32_t index,
                        const std::optional<Commitment>& commitment);

// The commitment to client `index`'s self-mask seed in its advert.
Commitment SelfMaskCommitment(const std::array<uint8_t, 32>& context, uint32_t index,
                              std::span<const uint8_t> seed);

// What an advert's signature covers (tests play corrupt clients with it).
std::string AdvertMessage(const std::array<uint8_t, 32>& context, const KeyAdvert& a);
// The leaf of roster position `index` in the advert tree: its advert, or
// none when that client did not advertise.
crypto::Digest AdvertLeaf(const std::array<uint8_t, 32>& context, uint32_t index,
                          const std::optional<KeyAdvert>& advert);

// The session id every party derives from the context and U1's root, the
// graph seed (from the commitment root and every contribution it holds),
// the neighbour graph that seeds, and the bytes a client signs for a
// survivor list (tests play a malicious server with them).
std::array<uint8_t, 32> SecAggSession(const std::array<uint8_t, 32>& context,
                                      const crypto::Digest& advert_root,
                                      const std::array<uint8_t, 32>& graph_seed);
std::array<uint8_t, 32> GraphSeed(const std::array<uint8_t, 32>& context,
                                  const crypto::Digest& seed_root,
                                  std::span<const std::optional<SeedContribution>> seeds);
// GraphSeed on a sparse graph; zeros on the complete graph, which needs no
// seed (a committer that revealed nothing is a plain dropout there).
std::array<uint8_t, 32> SecAggGraphSeed(const SecAggParams& params, const crypto::Digest& seed_root,
                                        std::span<const std::optional<SeedContribution>> seeds);
HararyGraph SecAggGraph(const SecAggParams& params, const std::array<uint8_t, 32>& graph_seed);
std::vector<uint8_t> CheckedListMessage(const std::array<uint8_t, 32>& session,
                                        std::span<const uint32_t> members);
std::vector<uint8_t> SurvivorListMessage(const std::array<uint8_t, 32>& session,
                                         std::span<const uint32_t> survivors);
// The salted commitment to one share `dealer` deals `holder`.
Commitment ShareCommitment(const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                           bool self_mask, std::span<const uint8_t> salt,
                           std::span<const uint8_t> share);
// What a dealer signs, once per holder: the hash of the AEAD blob it seals
// for the holder and the commitments to the two shares inside. On the wire
// the sealed shares are blob || mask commitment || self commitment ||
// signature.
std::vector<uint8_t> DealMessage(const std::array<uint8_t, 32>& session, uint32_t dealer,
                                 uint32_t holder, const std::array<uint8_t, 32>& blob_hash,
                                 const Commitment& mask, const Commitment& self);
// Whether `s`, revealed by `holder`, is a share `dealer` signed for it.
bool DealtShareValid(const crypto::Ed25519Public& dealer_identity,
                     const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                     const UnmaskShare& s);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_DERIVATIONS_H_
