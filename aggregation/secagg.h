// Secure aggregation: SecAgg (Bonawitz et al., CCS 2017) over the k-regular
// Harary graph of SecAgg+ (Bell et al., CCS 2020), as two sans-I/O state
// machines. Messages are plain structs; the daemons carry them over the wire.
//
// The server learns only the sum (mod 2^32) of the inputs of the clients
// that survived to the masked-input stage, and only if at least t of each
// client's neighbours stay to the end. Clients are indexed 0..n-1; client i
// uses Shamir x-coordinate i + 1.
//
// Stages:
//   1 AdvertiseKeys   client -> server: two fresh X25519 public keys (enc,
//                     mask; the mask pair is derived from a 32-byte seed),
//                     signed with the client's Ed25519 identity.
//     server -> all:  the list of every advert (U1).
//   2 ShareKeys       client -> server: for each neighbour in U1, its shares
//                     of the mask seed and of a self-mask seed b, sealed
//                     with XChaCha20-Poly1305 under the X25519(enc) key.
//     server -> each: the ciphertexts addressed to it from U2.
//   3 MaskedInput     client -> server: x + PRG(b) + sum over neighbours v
//                     in U2 of +-PRG(k_uv) (mod 2^32; + when u < v).
//     server -> all:  U3 (who sent a masked input).
//   4 Consistency     client -> server: a signature over U3 (optional).
//   5 Unmasking       server -> all: U3, dropped D = U2 \ U3, >= t signatures.
//                     client -> server: per neighbour exactly one share: b
//                     for survivors, the mask seed for the dropped.
// A client refuses (kPermissionDenied-like kFailedPrecondition) when lists
// overlap, contradict what it saw, carry bad signatures or fall below t.
#ifndef COHORT_AGGREGATION_SECAGG_H_
#define COHORT_AGGREGATION_SECAGG_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/secret_bytes.h"
#include "common/status.h"
#include "crypto/keys.h"
#include "crypto/prg.h"
#include "crypto/shamir.h"

namespace cohort::aggregation {

struct SecAggParams {
  uint32_t n = 0;                 // Clients in the cohort.
  uint32_t k = 0;                 // Neighbours per client (n - 1: complete graph).
  uint32_t t = 0;                 // Shamir threshold.
  uint64_t graph_seed = 0;        // Permutation of the Harary ring.
  size_t length = 0;              // Vector length.
  bool consistency_check = true;  // Stage 4.
  crypto::MaskPrg prg = crypto::MaskPrg::kAes256Ctr;  // The mask generator.
  std::array<uint8_t, 32> context{};                  // Hash of run, round and config.
};

// The documented rule for k and t (see secagg.cc): complete graph when
// `complete` or n <= 16; otherwise the smallest even k such that, with
// t = max(floor(k/2) + 1, floor(corrupt * k) + 1), union bounds over the n
// clients put P[t or more neighbours are corrupt] below 2^-20 and
// P[fewer than t neighbours survive] (dropout rate `dropout`; the round
// aborts) below 2^-10.
StatusOr<SecAggParams> ChooseSecAggParams(uint32_t n, double dropout, double corrupt, bool complete,
                                          size_t length);

// The session context (SecAggParams::context), computed by every party from
// the round's public parameters: a coordinator that tells two clients
// different parameters (weights, scale, cohort, identities) makes their
// signatures over each other's keys fail.
std::array<uint8_t, 32> SecAggContext(std::span<const uint8_t> nonce, uint32_t round,
                                      uint64_t task_id, const SecAggParams& params, float clip,
                                      double scale, double total_weight,
                                      std::span<const crypto::Ed25519Public> identities);

// Neighbour lists of H(k, n) over a seeded permutation (sorted indices).
std::vector<std::vector<uint32_t>> HararyNeighbours(uint32_t n, uint32_t k, uint64_t seed);

// --- Messages ---------------------------------------------------------------

struct KeyAdvert {
  uint32_t index = 0;
  crypto::X25519Public enc_key{};
  crypto::X25519Public mask_key{};
  crypto::Signature signature{};
};
struct KeyList {
  std::vector<KeyAdvert> adverts;  // U1, sorted by index.
};
struct SealedShares {
  uint32_t from = 0;
  std::map<uint32_t, std::string> to;  // Recipient -> ciphertext.
};
struct InboundShares {
  std::map<uint32_t, std::string> from;  // Sender -> ciphertext, senders in U2.
};
struct MaskedInput {
  uint32_t from = 0;
  std::vector<uint32_t> values;
};
struct SurvivorList {
  std::vector<uint32_t> survivors;  // U3, sorted.
};
struct SurvivorSignature {
  uint32_t from = 0;
  crypto::Signature signature{};
};
struct UnmaskRequest {
  std::vector<uint32_t> survivors;  // U3, sorted.
  std::vector<uint32_t> dropped;    // U2 \ U3, sorted.
  std::vector<SurvivorSignature> signatures;
};
struct UnmaskShare {
  uint32_t about = 0;
  bool is_self_mask = false;  // b share (survivor) vs mask-seed share (dropped).
  SecretBytes share;
};
struct UnmaskResponse {
  uint32_t from = 0;
  std::vector<UnmaskShare> shares;
};

// --- Client half ------------------------------------------------------------

// One instance per client per round. Methods must be called in stage order;
// any error means the client leaves the round (and says nothing more).
class SecAggClient {
 public:
  // `identities[i]` is client i's Ed25519 public key; `identity` is this
  // client's own key pair (not owned; must outlive the object).
  SecAggClient(const SecAggParams& params, uint32_t index, const crypto::Ed25519KeyPair* identity,
               std::vector<crypto::Ed25519Public> identities);

  StatusOr<KeyAdvert> AdvertiseKeys();
  StatusOr<SealedShares> ShareKeys(const KeyList& list);
  // Opens the shares neighbours sent (stage 2 -> 3, part one).
  Status ReceiveShares(const InboundShares& inbound);
  // `input`: this client's fixed-point encoded, already weighted vector;
  // it is masked in place and returned as the MaskedInput's values.
  StatusOr<MaskedInput> MaskInput(std::vector<uint32_t> input);
  // Both of the above.
  StatusOr<MaskedInput> MaskInput(const InboundShares& inbound, std::vector<uint32_t> input);
  StatusOr<SurvivorSignature> SignSurvivors(const SurvivorList& list);
  StatusOr<UnmaskResponse> Unmask(const UnmaskRequest& request);

  const std::vector<uint32_t>& neighbours() const { return neighbours_; }

 private:
  SecAggParams params_;
  uint32_t index_;
  const crypto::Ed25519KeyPair* identity_;
  std::vector<crypto::Ed25519Public> identities_;
  std::vector<uint32_t> neighbours_;
  int stage_ = 0;
  bool shares_received_ = false;
  crypto::X25519KeyPair enc_;
  SecretBytes mask_seed_;
  crypto::X25519KeyPair mask_;
  SecretBytes self_seed_;  // b_u.
  std::array<uint8_t, 32> session_{};
  std::map<uint32_t, KeyAdvert> neighbour_adverts_;   // N(u) ∩ U1.
  std::map<uint32_t, SecretBytes> held_mask_shares_;  // Of v's mask seed, v in N(u) ∩ U2.
  std::map<uint32_t, SecretBytes> held_self_shares_;  // Of v's b.
  std::vector<uint32_t> signed_survivors_;
};

// --- Server half ------------------------------------------------------------

// One instance per round. On* calls take untrusted client messages and
// return kInvalidArgument for a bad one (the client is then out of the round);
// Close* end a stage and return kFailedPrecondition ("aborted") when fewer
// than t clients remain, after which the instance reveals nothing more.
class SecAggServer {
 public:
  SecAggServer(const SecAggParams& params, std::vector<crypto::Ed25519Public> identities);

  Status OnAdvertise(const KeyAdvert& advert);
  StatusOr<KeyList> CloseAdvertise();
  Status OnShares(const SealedShares& shares);
  // Per client in U2: what to send it.
  StatusOr<std::map<uint32_t, InboundShares>> CloseShares();
  // Adds the masked vector to the running sum at once; nothing per client is
  // kept.
  Status OnMaskedInput(const MaskedInput& input);
  // Same, straight from a received frame: `words` holds the masked vector as
  // little-endian 32-bit words (4 x length bytes), so nothing is copied.
  Status OnMaskedInput(uint32_t from, std::span<const uint8_t> words);
  StatusOr<SurvivorList> CloseMaskedInput();
  Status OnSignature(const SurvivorSignature& signature);
  StatusOr<UnmaskRequest> CloseConsistency();
  Status OnUnmask(UnmaskResponse response);
  // Rebuilds the self masks of U3 and the mask keys of D, removes them and
  // returns the sum of U3's inputs mod 2^32.
  StatusOr<std::vector<uint32_t>> Finalize();

  const std::vector<uint32_t>& u1() const { return u1_; }
  const std::vector<uint32_t>& u2() const { return u2_; }
  const std::vector<uint32_t>& u3() const { return u3_; }
  const std::vector<uint32_t>& u5() const { return u5_; }

 private:
  Status Abort(const std::string& why);

  SecAggParams params_;
  std::vector<crypto::Ed25519Public> identities_;
  std::vector<std::vector<uint32_t>> neighbours_;
  int stage_ = 1;
  bool aborted_ = false;
  std::map<uint32_t, KeyAdvert> adverts_;
  std::array<uint8_t, 32> session_{};
  std::map<uint32_t, SealedShares> shares_;
  std::vector<uint32_t> u1_, u2_, u3_, u5_;
  std::vector<uint32_t> sum_;
  std::map<uint32_t, SurvivorSignature> signatures_;
  std::map<uint32_t, UnmaskResponse> unmasks_;
};

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_H_
