// The server half of secure aggregation (secagg.h has the protocol).
#ifndef COHORT_AGGREGATION_SECAGG_SERVER_H_
#define COHORT_AGGREGATION_SECAGG_SERVER_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/harary_graph.h"
#include "aggregation/secagg_derivations.h"
#include "aggregation/secagg_messages.h"
#include "aggregation/secagg_params.h"
#include "aggregation/secagg_stage.h"
#include "common/env.h"
#include "common/secret_bytes.h"
#include "common/status.h"
#include "crypto/keys.h"
#include "crypto/merkle.h"
#include "crypto/shamir.h"

namespace cohort::aggregation {

// One instance per round. On* calls take untrusted client messages and
// return kInvalidArgument for a bad one (the client is then out of the
// round); Close* end a stage and return kFailedPrecondition ("aborted") when
// fewer than t clients remain, after which the instance reveals nothing more.
// A complaint may put another client than its sender out of the round: the
// engine reads TakeMisbehaviour() after every call.
class SecAggServer {
 public:
  // `identities[i]` is client i's key; their RosterTree's root must be
  // params.roster. `env` (not owned) runs the parallel loops.
  SecAggServer(const SecAggParams& params, std::vector<crypto::Ed25519Public> identities,
               Env* env = Env::Default());

  // Client `index`'s proof that its key is in the roster (for its setup).
  crypto::MerkleProof RosterProof(uint32_t index) const { return roster_.Proof(index); }

  // The one entry point for a client's message: the On* call of its stage.
  // `from` is the sender's index as its connection authenticated it; it
  // replaces the sender the message names.
  Status Handle(uint32_t from, SecAggClientMessage message);
  // Ends the current stage (its Close* call) and returns what to send, each
  // message addressed to one client or to every client still in. The
  // unmasking stage ends with Finalize instead (kFailedPrecondition here).
  StatusOr<std::vector<AddressedMessage>> Close();
  // The stage whose messages the server takes now; kNone once finalized.
  SecAggStage stage() const { return stage_; }

  Status OnSeedCommit(const SeedCommit& commit);
  // Per committer (U0): the commitment root and its proof.
  StatusOr<std::map<uint32_t, SeedRoot>> CloseSeedCommit();
  // A refused advert (a bad key or signature, a contribution that does not
  // open its commitment) also names its sender (TakeMisbehaviour).
  Status OnAdvertise(const KeyAdvert& advert);
  // Per client in U1: its key list. Aborts, naming them, when a committer
  // revealed no contribution: the seed is every committer's.
  StatusOr<std::map<uint32_t, KeyList>> CloseAdvertise();
  Status OnShares(SealedShares shares);
  // Per client in U2: what to send it.
  StatusOr<std::map<uint32_t, InboundShares>> CloseShares();
  // kInvalidArgument when the sender's own complaint was false; a true one
  // puts the accused out (see TakeMisbehaviour).
  Status OnShareCheck(const ShareCheck& check);
  StatusOr<CheckedList> CloseShareCheck();
  // Routes each tag to its recipient (only neighbours in U3).
  Status OnConfirmation(const CheckedConfirmation& c);
  // Per client in U3 that confirmed: the tags addressed to it. Aborts when
  // fewer than t confirmed.
  StatusOr<std::map<uint32_t, Confirmations>> CloseConfirmation();
  // Adds the masked vector to the running sum at once; nothing per client is
  // kept.
  Status OnMaskedInput(const MaskedInput& input);
  // Same, straight from a received frame: `words` holds the masked vector as
  // little-endian 32-bit words (4 x length bytes), so nothing is copied.
  Status OnMaskedInput(uint32_t from, std::span<const uint8_t> words);
  StatusOr<SurvivorList> CloseMaskedInput();
  Status OnSignature(const SurvivorSignature& signature);
  // Per client in U4: its unmask request.
  StatusOr<std::map<uint32_t, UnmaskRequest>> CloseConsistency();
  Status OnUnmask(UnmaskResponse response);
  // Rebuilds the self masks of U4 and the mask keys of D (tolerating and
  // naming bad shares), removes them and returns the sum of U4's inputs mod
  // 2^32.
  StatusOr<std::vector<uint32_t>> Finalize();

  // Clients found misbehaving since the last call (each at most once).
  std::vector<Misbehaviour> TakeMisbehaviour() { return std::exchange(misbehaviour_, {}); }
  // Clients out of the round because of another's complaint.
  bool excluded(uint32_t client) const { return excluded_.count(client) != 0; }

  const std::vector<uint32_t>& u0() const { return u0_; }
  const std::vector<uint32_t>& u1() const { return u1_; }
  const std::vector<uint32_t>& u2() const { return u2_; }
  const std::vector<uint32_t>& u3() const { return u3_; }
  const std::vector<uint32_t>& u4() const { return u4_; }
  const std::vector<uint32_t>& u6() const { return u6_; }

 private:
  Status Abort(const std::string& why);
  void Blame(uint32_t client, std::string what);
  // Puts `client` out of the round and names it: kInvalidArgument(what).
  Status Refuse(uint32_t client, std::string what);
  // Resolves one complaint: true when the accused is to blame.
  StatusOr<bool> ResolveComplaint(uint32_t from, const Complaint& c);
  struct Share {
    uint32_t from;
    const UnmaskShare* share;
  };
  KeyList KeyListFor(uint32_t client, const crypto::MerkleTree& adverts) const;
  // The survivors whose signatures the unmask request for `client` carries
  // (those that can count for its checked neighbours), sorted.
  std::vector<uint32_t> SignersFor(uint32_t client) const;
  // Every secret still needed (b_u for u in U4, the mask seed of u in
  // U3 \ U4) is rebuilt from t shares held by u's neighbours, and only
  // neighbours in `left` can still reveal one (`left_as`: what they did,
  // for the message). Aborts naming the first u in U3 with fewer than t
  // of its neighbours in `left`: the round cannot end (honest clients
  // refuse to sign or unmask below t as well); OK otherwise.
  Status AbortIfTooFewNeighboursLeft(const std::vector<uint32_t>& left, const char* left_as);
  // Rebuilds one secret from the responders' shares (see Finalize).
  StatusOr<SecretBytes> Rebuild(uint32_t about, bool self_mask, std::vector<Share> shares,
                                crypto::ShamirCombiner& combiner);
  // Whether `dealer` dealt `s` to `holder` (Rebuild's check of a revealed
  // share; relayed_ first).
  bool Dealt(uint32_t dealer, uint32_t holder, const UnmaskShare& s) const;

  SecAggParams params_;
  Env* env_;
  std::vector<crypto::Ed25519Public> identities_;
  crypto::MerkleTree roster_;
  std::optional<HararyGraph> graph_;
  std::vector<std::vector<uint32_t>> neighbours_;  // From CloseAdvertise on.
  SecAggStage stage_ = SecAggStage::kCommitSeed;   // kNone once finalized.
  bool aborted_ = false;
  std::map<uint32_t, Commitment> seed_commits_;              // Stage 0, by client.
  std::map<uint32_t, SeedContribution> seeds_;               // Revealed, by client.
  std::vector<std::optional<SeedContribution>> seeds_list_;  // The same, by position.
  crypto::Digest seed_root_{};  // Over seed_commits_, from CloseSeedCommit on.
  std::map<uint32_t, CheckedConfirmation> confirmations_;  // Stage 3b, by sender.
  std::map<uint32_t, KeyAdvert> adverts_;
  // Whose advert holds a key.
  std::map<crypto::EncPublic, uint32_t> enc_owner_;
  std::map<crypto::X25519Public, uint32_t> mask_owner_;
  std::array<uint8_t, 32> session_{};
  std::map<uint32_t, SealedShares> shares_;  // Kept until the check closes.
  // By dealer in U3, by holder in U3 (ascending): the commitments to the
  // mask-seed and the self-mask share the dealer sent for the holder. From
  // CloseShareCheck to Finalize.
  struct Relayed {
    uint32_t holder;
    std::array<Commitment, 2> commitments;
  };
  std::vector<std::vector<Relayed>> relayed_;
  std::set<uint32_t> checked_, excluded_, blamed_;
  std::vector<uint32_t> u0_, u1_, u2_, u3_, u4_, u6_;
  std::vector<uint32_t> sum_;
  std::map<uint32_t, SurvivorSignature> signatures_;          // Their tags moved to tags_.
  std::map<uint32_t, std::map<uint32_t, SurvivorTag>> tags_;  // By signer, by recipient.
  std::map<uint32_t, UnmaskResponse> unmasks_;
  std::vector<Misbehaviour> misbehaviour_;
};

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_SERVER_H_
