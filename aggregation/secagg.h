// Secure aggregation: SecAgg (Bonawitz et al., CCS 2017) over the k-regular
// Harary graph of SecAgg+ (Bell et al., CCS 2020), as two sans-I/O state
// machines, hardened against a malicious server and malicious clients.
// Messages are plain structs; the daemons carry them over the wire.
//
// The server learns only the sum (mod 2^32) of the inputs of the clients
// that survived to the masked-input stage. Clients are indexed 0..n-1; client
// i uses Shamir x-coordinate i + 1.
//
// Stages:
//   0 CommitSeed      client -> server: a commitment to a fresh 32-byte
//                     contribution to the neighbour graph's seed.
//     server -> each: the Merkle root over every commitment (one leaf per
//                     roster position, empty where none came) and the
//                     client's own proof. The server fixes the root before
//                     it has seen any contribution, so it cannot choose
//                     among graph seeds (docs/architecture.md).
//   1 AdvertiseKeys   client -> server: its seed contribution, a fresh
//                     ristretto255 encryption key,
//                     an X25519 mask key (derived from a 32-byte seed) and a
//                     commitment to a fresh self-mask seed b, signed with the
//                     client's Ed25519 identity. The server checks every key.
//     server -> each: the Merkle root over every advert (U1; one leaf per
//                     roster position, empty where none came), the
//                     client's own and its neighbours' adverts with their
//                     identity keys, each proven against that root and the
//                     roster's, and every committed contribution (32 bytes
//                     a client). Each client rebuilds the commitment root
//                     from them; the graph is seeded by all of them, and
//                     each party computes its own neighbours in O(k)
//                     (harary_graph.h). No message to a client grows with n
//                     but the contributions and the survivor lists.
//   2 ShareKeys       client -> server: for each neighbour in U1, its shares
//                     of the mask seed and of b, sealed with
//                     XChaCha20-Poly1305, beside salted commitments to both
//                     shares, under one dealer signature over the sealed
//                     blob's hash and the two commitments.
//     server -> each: the ciphertexts addressed to it from U2.
//   3 CheckShares     client -> server: the shares it could not open, each a
//                     complaint the server can verify (a bad signature, or
//                     the shared point with a proof). The server drops
//                     whichever side lied. Only these shares' signatures
//                     are verified: shares that open are the dealer's.
//     server -> all:  U3, the clients of U2 that passed the check.
//   3b ConfirmChecked client -> server: for each neighbour in U3, a tag over
//                     U3 keyed by the pair's sealing key (as in stage 5).
//     server -> each: the tags addressed to it. A client masks only when t
//                     of its neighbours confirmed the very U3 it holds, so
//                     the server cannot show it a checked list of its own.
//   4 MaskedInput     client -> server: x + PRG(b) + sum over neighbours v
//                     in U3 of +-PRG(k_uv) (mod 2^32; + when u < v).
//     server -> all:  U4 (who sent a masked input).
//   5 Consistency     client -> server: a signature over U4, and for each
//                     neighbour in U4 a tag over U4 keyed by the pair's
//                     sealing key (SurvivorTag).
//   6 Unmasking       server -> U4: U4, dropped D = U3 \ U4, the signatures
//                     of its neighbours' neighbours with their identity keys
//                     proven against the roster root, and the tags those
//                     signers made for the recipient. A tag that checks
//                     stands for its signature; a bad one costs only the
//                     signature's check.
//                     client -> server: per neighbour exactly one share: b
//                     for survivors, the mask seed for the dropped.
//
// Threat model (docs/architecture.md): a server colluding with at most
// c_max of any client's k neighbours learns nothing about an honest
// client's input beyond the sum. The threshold is t = floor((k + c_max)/2)
// + 1, so no two disjoint sets of honest neighbours can each complete a
// threshold with the corrupt ones: a server that shows different clients
// different lists still collects t shares of at most one of b_v and the
// mask seed of v. On top, a client reveals a share about v only when t of
// v's neighbours signed the same U4.
#ifndef COHORT_AGGREGATION_SECAGG_H_
#define COHORT_AGGREGATION_SECAGG_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/aggregator.h"
#include "aggregation/fixed_point.h"
#include "aggregation/harary_graph.h"
#include "common/env.h"
#include "common/secret_bytes.h"
#include "common/status.h"
#include "crypto/enc_keys.h"
#include "crypto/keys.h"
#include "crypto/merkle.h"
#include "crypto/prg.h"
#include "crypto/shamir.h"

namespace cohort::aggregation {

struct SecAggParams {
  uint32_t n = 0;     // Clients in the cohort.
  uint32_t k = 0;     // Neighbours per client (n - 1: complete graph).
  uint32_t t = 0;     // Shamir threshold.
  size_t length = 0;  // Vector length.
  crypto::MaskPrg prg = crypto::MaskPrg::kAes128Ctr;  // The mask generator.
  std::array<uint8_t, 32> context{};                  // Hash of run, round and config.
  // Merkle root over the cohort's identity keys (RosterLeaf, by index): the
  // setup carries it instead of n keys, and the context binds it.
  crypto::Digest roster{};
};

// The most corrupt neighbours of one client the parameters tolerate, for a
// cohort of n with a fraction `corrupt` colluding with the server: complete
// graph (k = n - 1): ceil(corrupt * n); sparse graph: the smallest c with
// n * P[Binomial(k, corrupt) > c] <= 2^-20, and never above ceil(corrupt * n).
uint32_t MaxCorruptNeighbours(uint32_t n, uint32_t k, double corrupt);
// floor((k + MaxCorruptNeighbours) / 2) + 1: the threshold against a
// malicious server.
uint32_t SecureThreshold(uint32_t n, uint32_t k, double corrupt);

// The documented rule for k and t: complete graph when `complete` or
// n <= 16; otherwise the smallest even k with t = SecureThreshold <= k and
// n * P[fewer than t of k neighbours survive] <= 2^-10 (dropout rate
// `dropout`; that event aborts the round); the complete graph when no
// sparse k fits.
StatusOr<SecAggParams> ChooseSecAggParams(uint32_t n, double dropout, double corrupt, bool complete,
                                          size_t length);

// A client's check of the parameters a server sent: kFailedPrecondition,
// naming what is weaker, when t is below SecureThreshold(n, k, corrupt) for
// this client's own `corrupt`, or n, k, t do not describe a graph.
Status CheckSecAggParams(uint32_t n, uint32_t k, uint32_t t, double corrupt);

// The session context (SecAggParams::context), computed by every party from
// the round's public parameters, the roster root among them: a coordinator
// that tells two clients different parameters (weights, scale, cohort,
// identities) makes their signatures over each other's keys fail.
std::array<uint8_t, 32> SecAggContext(std::span<const uint8_t> nonce, uint32_t round,
                                      uint64_t task_id, const SecAggParams& params, float clip,
                                      double scale, double total_weight);

// The roster: client i's identity key is leaf i (RosterLeaf) of a Merkle
// tree whose root every party binds into the context.
crypto::Digest RosterLeaf(uint32_t index, const crypto::Ed25519Public& identity);
crypto::MerkleTree RosterTree(std::span<const crypto::Ed25519Public> identities);

// --- Messages ---------------------------------------------------------------

using Commitment = std::array<uint8_t, 32>;
using SeedContribution = std::array<uint8_t, 32>;

// Stage 0: the commitment to client `index`'s contribution to the graph
// seed, and the leaf of its roster position in the commitment tree (none:
// it committed nothing, and contributes nothing).
Commitment SeedCommitment(const std::array<uint8_t, 32>& context, uint32_t index,
                          const SeedContribution& contribution);
crypto::Digest SeedLeaf(const std::array<uint8_t, 32>& context, uint32_t index,
                        const std::optional<Commitment>& commitment);
struct SeedCommit {
  uint32_t from = 0;
  Commitment commitment{};
};
// What the server tells each committer when it closes stage 0.
struct SeedRoot {
  crypto::Digest root{};      // Over every roster position's SeedLeaf.
  crypto::MerkleProof proof;  // The recipient's own leaf.
};

// The commitment to client `index`'s self-mask seed in its advert.
Commitment SelfMaskCommitment(const std::array<uint8_t, 32>& context, uint32_t index,
                              std::span<const uint8_t> seed);

struct KeyAdvert {
  uint32_t index = 0;
  crypto::EncPublic enc_key{};
  crypto::X25519Public mask_key{};
  Commitment self_commitment{};  // Binds the self-mask seed b.
  SeedContribution seed{};       // Reveals what stage 0 committed to.
  crypto::Signature signature{};
};
// What an advert's signature covers (tests play corrupt clients with it).
std::string AdvertMessage(const std::array<uint8_t, 32>& context, const KeyAdvert& a);
// The leaf of roster position `index` in the advert tree: its advert, or
// none when that client did not advertise.
crypto::Digest AdvertLeaf(const std::array<uint8_t, 32>& context, uint32_t index,
                          const std::optional<KeyAdvert>& advert);
// One roster position as a key list shows it to one client.
struct ListedAdvert {
  uint32_t index = 0;
  std::optional<KeyAdvert> advert;     // None: this client did not advertise.
  crypto::Ed25519Public identity{};    // With an advert: the key that signed it,
  crypto::MerkleProof identity_proof;  // proven against the roster root.
  crypto::MerkleProof advert_proof;    // AdvertLeaf's, against advert_root.
};
// What a server tells one client of U1 (CloseAdvertise).
struct KeyList {
  crypto::Digest advert_root{};       // Over all n positions, U1's adverts.
  std::vector<ListedAdvert> entries;  // The client and its neighbours, by index.
  // Every roster position's revealed seed contribution, none where nothing
  // was committed: n entries, the same for every client.
  std::vector<std::optional<SeedContribution>> seeds;
};
struct SealedShares {
  uint32_t from = 0;
  std::map<uint32_t, std::string> to;  // Recipient -> sealed shares (opaque to the server).
};
struct InboundShares {
  std::map<uint32_t, std::string> from;  // Sender -> sealed shares, senders in U2.
};
struct Complaint {
  uint32_t about = 0;
  // Empty: the sealed shares carry a bad signature. Otherwise the shared
  // point of the two encryption keys and its proof: the server opens the
  // shares itself.
  std::optional<std::array<uint8_t, crypto::kEncPointBytes>> point;
  crypto::DleqProof proof{};
};
struct ShareCheck {
  uint32_t from = 0;
  std::vector<Complaint> complaints;
};
struct CheckedList {
  std::vector<uint32_t> members;  // U3, sorted.
};
// A client's word to each of its neighbours in U3 that it holds that very
// U3 (a tag keyed like SurvivorTag, over CheckedListMessage).
struct CheckedConfirmation {
  uint32_t from = 0;
  std::map<uint32_t, std::array<uint8_t, 32>> tags;  // By recipient.
};
// The confirmations addressed to one client, by sender.
struct Confirmations {
  std::map<uint32_t, std::array<uint8_t, 32>> from;
};
struct MaskedInput {
  uint32_t from = 0;
  std::vector<uint32_t> values;
};
struct SurvivorList {
  std::vector<uint32_t> survivors;  // U4, sorted.
};
// A survivor's MAC over the survivor list for one neighbour (SurvivorTag in
// secagg.cc): keyed by what only the pair shares, so it convinces that
// neighbour alone, for a hash instead of a signature check.
using SurvivorTag = std::array<uint8_t, 32>;
struct SurvivorSignature {
  uint32_t from = 0;
  crypto::Signature signature{};
  // From the signer: a tag for each of its neighbours in the list.
  std::map<uint32_t, SurvivorTag> tags;
  // Set by the server in an UnmaskRequest: the signer's key, proven against
  // the roster root (clients hold only their neighbours' keys), and the
  // signer's tag for the request's recipient, when it made one.
  crypto::Ed25519Public identity{};
  crypto::MerkleProof identity_proof;
  std::optional<SurvivorTag> tag;
};
struct UnmaskRequest {
  std::vector<uint32_t> survivors;  // U4, sorted.
  std::vector<uint32_t> dropped;    // U3 \ U4, sorted.
  // The survivors' signatures over U4 that count for the recipient's
  // neighbours: those of the neighbours' neighbours.
  std::vector<SurvivorSignature> signatures;
};
// What lets anyone check one revealed share against the dealer's single
// signature over what it dealt the holder (DealMessage): the signature
// binds both shares through salted commitments, and the proof carries the
// salt of this one and the commitment to the other. The holder does not
// verify the signature on shares that open, so it may be bad; the server
// then checks the share against the commitment it relayed from the dealer.
struct DealProof {
  std::array<uint8_t, 32> salt{};       // Of this share's commitment.
  Commitment other{};                   // The commitment to the other share.
  std::array<uint8_t, 32> blob_hash{};  // Hash256 of the sealed blob.
  crypto::Signature signature{};        // By the dealer, over DealMessage.
};
struct UnmaskShare {
  uint32_t about = 0;
  bool is_self_mask = false;  // b share (survivor) vs mask-seed share (dropped).
  SecretBytes share;
  DealProof proof;  // That `about` dealt this share to the sender.
};
struct UnmaskResponse {
  uint32_t from = 0;
  std::vector<UnmaskShare> shares;
};

// Who broke the protocol, and how (for the run store and the logs).
struct Misbehaviour {
  uint32_t client = 0;
  std::string what;
};

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

// --- Client half ------------------------------------------------------------

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

  uint32_t index() const { return index_; }
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

// --- Server half ------------------------------------------------------------

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
  int stage_ = 0;
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

// The hub's secure sum behind the Aggregator interface (aggregator.h):
// Accept takes a masked input, Finalize unmasks and decodes the weighted
// means (the delta, and the metrics from the slots after it). The stages
// around the input are driven through secagg(). `params.length` is
// num_params + kSecureMetricSlots; `cohort_weight` is W, the sum of the
// cohort's registered sample counts that clients weigh their inputs by.
StatusOr<std::unique_ptr<Aggregator>> NewSecureAggregator(
    const SecAggParams& params, std::vector<crypto::Ed25519Public> identities,
    const FixedPoint& fixed_point, double cohort_weight, size_t num_params,
    Env* env = Env::Default());

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_H_
