// The client half of secure aggregation (secagg.h has the protocol).
#ifndef COHORT_AGGREGATION_SECAGG_CLIENT_H_
#define COHORT_AGGREGATION_SECAGG_CLIENT_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aggregation/secagg_derivations.h"
#include "aggregation/secagg_messages.h"
#include "aggregation/secagg_params.h"
#include "common/env.h"
#include "common/secret_bytes.h"
#include "common/status.h"
#include "crypto/enc_keys.h"
#include "crypto/keys.h"
#include "crypto/merkle.h"

namespace cohort::aggregation {

// One instance per client per round. Methods must be called in stage order;
// any error means the client leaves the round (and says nothing more).
class SecAggClient {
 public:
  // `identity` is this client's own key pair (not owned; must outlive the
  // object); `roster_proof` proves its public key is leaf `index` under
  // params.roster (AdvertiseKeys refuses a roster without it). `env` (not
  // owned) runs the parallel loops.
  SecAggClient(const SecAggParams& params, uint32_t index, const crypto::Ed25519KeyPair* identity,
               crypto::MerkleProof roster_proof, Env* env = Env::Default());

  // Stage 0: draws this round's seed contribution and commits to it.
  StatusOr<SeedCommit> CommitSeed();
  // Checks that `root` holds this client's commitment at its index, then
  // reveals the contribution in the advert.
  StatusOr<KeyAdvert> AdvertiseKeys(const SeedRoot& root);
  // Rebuilds the commitment root from the list's contributions (all n) and
  // derives the graph from them before it checks the entries.
  StatusOr<SealedShares> ShareKeys(const KeyList& list);
  // Opens the shares neighbours sent; what cannot be opened becomes a
  // complaint (the client stays in the round).
  StatusOr<ShareCheck> CheckShares(const InboundShares& inbound);
  // U3: the neighbours whose pair masks the input will carry. Returns this
  // client's confirmation of it for each of its neighbours in U3.
  StatusOr<CheckedConfirmation> ReceiveChecked(const CheckedList& list);
  // kFailedPrecondition unless t of this client's neighbours in U3 sent a
  // valid confirmation of the U3 it holds: only then does it mask.
  Status ReceiveConfirmations(const Confirmations& confirmations);
  // `input`: this client's fixed-point encoded, already weighted vector;
  // it is masked in place and returned as the MaskedInput's values.
  StatusOr<MaskedInput> MaskInput(std::vector<uint32_t> input);
  StatusOr<SurvivorSignature> SignSurvivors(const SurvivorList& list);
  StatusOr<UnmaskResponse> Unmask(const UnmaskRequest& request);

  // The one entry point for the server's messages (SecAggServer::Close's):
  // the call of the stage `message` belongs to, and the reply to send; none
  // after Confirmations, when the client waits for its input (MaskInput).
  // An error means the client leaves the round.
  StatusOr<std::optional<SecAggClientMessage>> Handle(const SecAggServerMessage& message);

  uint32_t index() const { return index_; }
  const SecAggParams& params() const { return params_; }
  const std::vector<uint32_t>& neighbours() const { return neighbours_; }
  // Testing only: copies of the two shares `dealer` sealed for this client
  // (mask seed, then self mask), i.e. what a corrupt client could hand the
  // server. Empty when it holds none.
  std::vector<UnmaskShare> HeldSharesForTesting(uint32_t dealer) const;
  // Testing only: the confirmation tag this client would send neighbour
  // `to` for `list` (what a corrupt client could hand the server for any
  // list); none when it holds no tag key for `to`.
  std::optional<std::array<uint8_t, 32>> ConfirmationForTesting(uint32_t to,
                                                                const CheckedList& list) const;
  // Testing only: a complaint about `dealer` with the true shared point and
  // a valid proof, as a client that lies about good shares would send.
  StatusOr<Complaint> ComplaintForTesting(uint32_t dealer) const;

 private:
  struct Held {  // What a neighbour dealt this client.
    SecretBytes mask_share, self_share;
    DealProof mask_proof, self_proof;
  };
  // Checks every entry's proofs, signature and keys; fills the neighbours'
  // adverts and identities.
  Status CheckKeyList(const KeyList& list);
  Status CheckListedAdvert(const crypto::Digest& root, const ListedAdvert& e) const;
  // That `seeds` rebuild the commitment root this client checked, with its
  // own contribution; returns the graph seed.
  StatusOr<std::array<uint8_t, 32>> CheckSeeds(
      std::span<const std::optional<SeedContribution>> seeds) const;
  // That a key the roster proves for client `index` is not another's too,
  // as far as this client sees (a key at two places would hold two shares;
  // a client with --peers checks the whole roster in its setup).
  Status CheckIdentity(uint32_t index, const crypto::Ed25519Public& identity);
  // Seals the two shares dealt to neighbour v under one signature.
  StatusOr<std::string> SealFor(uint32_t v, const SecretBytes& key, const SecretBytes& mask_share,
                                const SecretBytes& self_share) const;
  // Opens one neighbour's sealed shares; an error is the complaint's reason.
  Status OpenShares(uint32_t v, const std::string& sealed, Held& held) const;
  // That t of each checked neighbour's own neighbours vouch for the survivor
  // list: this client itself, then tags, then signatures (nearest first).
  Status CheckSignatures(const UnmaskRequest& request);
  // A client's ring position (its index on the complete graph); none when
  // it is farther than k, where it counts for no neighbour.
  std::optional<uint32_t> RingPosition(uint32_t v) const;
  // Whether s carries its signer's valid tag for this client over the list
  // whose message hashes to list_hash.
  bool TagChecks(const SurvivorSignature& s, const crypto::Digest& list_hash) const;

  SecAggParams params_;
  Env* env_;
  uint32_t index_;
  const crypto::Ed25519KeyPair* identity_;
  crypto::MerkleProof roster_proof_;
  std::map<crypto::Ed25519Public, uint32_t> known_identities_;  // Key -> index, as seen.
  std::vector<uint32_t> neighbours_;
  // From stage 2 on: the ring positions of the clients within k of this
  // one (its neighbours' neighbours, the only signers that can count for a
  // neighbour), by index; empty on the complete graph. O(k), whatever n.
  std::map<uint32_t, uint32_t> window_;
  bool complete_ = false;
  int stage_ = 0;
  // This round's graph-seed contribution: hidden only until stage 1
  // reveals it to everyone, and it protects nothing after that, so it is
  // not a SecretBytes.
  SeedContribution seed_{};
  crypto::Digest seed_root_{};  // The commitment root it was revealed against.
  crypto::EncKeyPair enc_;
  SecretBytes mask_seed_;
  crypto::X25519KeyPair mask_;
  SecretBytes self_seed_;  // b_u.
  std::array<uint8_t, 32> session_{};
  std::map<uint32_t, KeyAdvert> neighbour_adverts_;                 // N(u) ∩ U1.
  std::map<uint32_t, crypto::Ed25519Public> neighbour_identities_;  // The same, their keys.
  std::map<uint32_t, Held> held_;                                   // N(u) ∩ U2, opened.
  std::map<uint32_t, SecretBytes> pair_keys_;                       // Sealing keys, by neighbour.
  // Survivor-tag keys, by neighbour: from the sealing keys, kept to Unmask.
  std::map<uint32_t, SecretBytes> tag_keys_;
  std::vector<uint32_t> checked_;  // U3 as this client saw it.
  std::vector<uint32_t> signed_survivors_;
};

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_CLIENT_H_
