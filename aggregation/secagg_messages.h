// The messages of secure aggregation's stages, as plain structs (secagg.h
// has the protocol; secagg_wire.h their wire form).
#ifndef COHORT_AGGREGATION_SECAGG_MESSAGES_H_
#define COHORT_AGGREGATION_SECAGG_MESSAGES_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/secret_bytes.h"
#include "crypto/enc_keys.h"
#include "crypto/keys.h"
#include "crypto/merkle.h"
#include "crypto/prg.h"

namespace cohort::aggregation {

using Commitment = std::array<uint8_t, 32>;
using SeedContribution = std::array<uint8_t, 32>;

struct SeedCommit {
  uint32_t from = 0;
  Commitment commitment{};
};
// What the server tells each committer when it closes stage 0.
struct SeedRoot {
  crypto::Digest root{};      // Over every roster position's SeedLeaf.
  crypto::MerkleProof proof;  // The recipient's own leaf.
};

struct KeyAdvert {
  uint32_t index = 0;
  crypto::EncPublic enc_key{};
  crypto::X25519Public mask_key{};
  Commitment self_commitment{};  // Binds the self-mask seed b.
  SeedContribution seed{};       // Reveals what stage 0 committed to.
  crypto::Signature signature{};
};
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
// secagg_client.cc): keyed by what only the pair shares, so it convinces that
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

// Every message a client sends the server, one type per stage
// (SecAggServer::Handle).
using SecAggClientMessage =
    std::variant<SeedCommit, KeyAdvert, SealedShares, ShareCheck, CheckedConfirmation, MaskedInput,
                 SurvivorSignature, UnmaskResponse>;
// Every message the server sends when it closes a stage (SecAggServer::Close).
using SecAggServerMessage = std::variant<SeedRoot, KeyList, InboundShares, CheckedList,
                                         Confirmations, SurvivorList, UnmaskRequest>;
struct AddressedMessage {
  std::optional<uint32_t> to;  // The recipient's index; none: every client still in.
  SecAggServerMessage message;
};

// What a coordinator tells each client of a securely aggregated round before
// stage 0 (wire.SecAggSetup): the parameters, this client's place in the
// roster, and what its input is encoded with. Untrusted: the client checks
// every number before it takes part (client/session.cc).
struct SecAggSetup {
  bool sparse = false;  // SecAgg+ graph (else complete).
  uint32_t n = 0;       // Cohort size.
  uint32_t k = 0;       // Neighbours per client.
  uint32_t t = 0;       // Shamir threshold.
  uint32_t index = 0;   // The recipient's index in the cohort.
  // The round's nonce; each client hashes it with the rest into
  // SecAggParams::context (SecAggContext).
  std::array<uint8_t, 32> nonce{};
  crypto::Digest roster_root{};      // SecAggParams::roster.
  crypto::MerkleProof roster_proof;  // The recipient's own leaf.
  // All n identity keys, by index, only to a client that asked for them
  // (one with --peers); empty otherwise.
  std::vector<crypto::Ed25519Public> roster;
  float clip = 0;
  double scale = 0;         // Fixed-point scale.
  double total_weight = 0;  // The cohort's registered sample counts, summed.
  crypto::MaskPrg prg = crypto::MaskPrg::kAes256Ctr;
  float corrupt_fraction = 0;  // The coordinator's planning figure.
  // The coordinator's stage timeout and round deadline, in ms.
  uint32_t stage_timeout_ms = 0;
  uint32_t round_deadline_ms = 0;
  // The masked vector carries kSecureEvalSlots after the training metrics
  // (federated evaluation; fixed_point.h).
  bool eval_slots = false;
  // secagg.l2_clip: the client bounds its delta's L2 norm by this before
  // encoding (aggregation/fixed_point.h BoundL2Norm). 0: no bound.
  float l2_clip = 0;
  // train.fednova: one more slot after those, the client's FedNova
  // normaliser (aggregation/fednova.h).
  bool fednova_slot = false;
  // Distributed DP (config privacy.mechanism DISTRIBUTED_SKELLAM,
  // privacy/skellam.h EncodeSkellam): the delta is clipped to L2 norm
  // dp_clip_norm, put on the grid dp_scale, rounded within L2 norm
  // dp_l2_bound and noised with Skellam of variance dp_share_variance per
  // coordinate; the metric slots keep the fixed-point encoding above.
  // dp_scale 0: no distributed DP.
  double dp_clip_norm = 0;
  double dp_scale = 0;
  double dp_l2_bound = 0;
  double dp_share_variance = 0;
  // Adaptive clipping under distributed DP: one word after the delta, the
  // bit [||delta|| <= dp_clip_norm] times dp_count_scale plus Skellam noise
  // of variance dp_count_share_variance. 0: no such word.
  double dp_count_scale = 0;
  double dp_count_share_variance = 0;
  // The round's task, as TaskDigest (secagg_wire.h) hashes it: every client
  // signs it within the session context and checks its own task against it.
  crypto::Digest task_digest{};
};

// Who broke the protocol, and how (for the run store and the logs).
struct Misbehaviour {
  uint32_t client = 0;
  std::string what;
};

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_MESSAGES_H_
