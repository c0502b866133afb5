// The honest cohort the secure-aggregation harnesses start from, and the
// edits they make to its messages.
//
// Each configuration runs one honest round once per process (client n-1
// shares its keys and passes the share check, then drops before the masked
// input) and records every message of it. The harnesses replay those messages, and edited copies of
// them, into a fresh SecAggServer or SecAggClient per input.
//
// libsodium's randomness is replaced by a seeded generator for the whole
// harness process (never in the library or the daemons), so a harness can
// rebuild client i with exactly the keys the recorded round saw, and a
// crashing input replays the same way in every process.
#ifndef COHORT_TESTS_FUZZ_SECAGG_COHORT_H_
#define COHORT_TESTS_FUZZ_SECAGG_COHORT_H_

#include <cstdint>
#include <map>
#include <vector>

#include "aggregation/secagg.h"
#include "crypto/keys.h"
#include "tests/fuzz/fuzz_input.h"

namespace cohort::fuzz {

// Restarts the seeded generator behind randombytes_* (installing it on the
// first call).
void SeedRandom(uint64_t seed);

struct HonestRound {
  aggregation::SecAggParams params;
  std::vector<crypto::Ed25519KeyPair> identity_keys;  // By index.
  std::vector<crypto::Ed25519Public> identities;
  std::vector<crypto::MerkleProof> roster_proofs;  // By index.
  std::vector<std::vector<uint32_t>> inputs;       // Each client's plain input.
  uint32_t dropped = 0;                            // In U3, not in U4.
  // Each client's neighbours in the recorded round (the graph is seeded
  // from the key list, so it holds whenever U1 is the recorded key list).
  std::vector<std::vector<uint32_t>> neighbours;

  std::vector<aggregation::SeedCommit> commits;          // By index.
  std::map<uint32_t, aggregation::SeedRoot> seed_roots;  // By recipient.
  std::vector<aggregation::KeyAdvert> adverts;           // By index.
  std::map<uint32_t, aggregation::KeyList> key_lists;    // By recipient.
  std::vector<aggregation::SealedShares> sealed;         // By index.
  std::map<uint32_t, aggregation::InboundShares> inbound;
  std::vector<aggregation::ShareCheck> checks;                  // By index (no complaints).
  aggregation::CheckedList checked;                             // U3.
  std::vector<aggregation::CheckedConfirmation> confirmations;  // By index.
  std::map<uint32_t, aggregation::Confirmations> confirmed;     // By recipient.
  std::vector<aggregation::MaskedInput> masked;                 // By index, the dropped one's too.
  aggregation::SurvivorList survivors;
  std::map<uint32_t, aggregation::SurvivorSignature> signatures;  // By signer.
  std::map<uint32_t, aggregation::UnmaskRequest> requests;        // By recipient.
  std::map<uint32_t, aggregation::UnmaskResponse> responses;      // By responder.
  std::vector<uint32_t> sum;                                      // Of U4's inputs.
};

// The operations of the two harnesses' input programs (one byte each, taken
// modulo kNumOps). make_corpus.cc writes seed programs with them.
enum class ServerOp : uint8_t {
  kAdvert,
  kEditedAdvert,
  kCloseAdvertise,
  kShares,
  kEditedShares,
  kCloseShares,
  kMasked,
  kEditedMasked,
  kRawMasked,
  kCloseMaskedInput,
  kSignature,
  kEditedSignature,
  kCloseConsistency,
  kUnmask,
  kEditedUnmask,
  kFinalize,
  kShareCheck,
  kEditedShareCheck,
  kCloseShareCheck,
  kConfirm,
  kEditedConfirm,
  kCloseConfirmation,
  kNumOps,
};
enum class ClientOp : uint8_t {
  kAdvertise,
  kShareKeys,
  kEditedShareKeys,
  kMaskInput,
  kSignSurvivors,
  kEditedSignSurvivors,
  kUnmask,
  kEditedUnmask,
  kCheckShares,
  kEditedCheckShares,
  kReceiveChecked,
  kEditedReceiveChecked,
  kEditedAdvertise,
  kReceiveConfirmations,
  kEditedReceiveConfirmations,
  kNumOps,
};

inline constexpr int kNumConfigs = 2;
// 0: n = 5, complete graph (k = 4, t = SecureThreshold(5, 4, 0.1) = 3),
//    AES-256-CTR.
// 1: n = 6, Harary graph k = 4, t = 3, ChaCha20.
// (n = 4 with t = 3 cannot lose a client at all: each client needs t
// neighbours in U3, and each survivor's self mask t responders.)
// Built on first use; aborts if the honest round itself fails.
const HonestRound& GetHonestRound(int config);
// Seed under which client `index` of `config` made its seed contribution:
// SeedRandom it before CommitSeed to get the same one again, and
// ClientSeed + kAdvertSeedOffset before AdvertiseKeys for the same keys.
uint64_t ClientSeed(int config, uint32_t index);
inline constexpr uint64_t kAdvertSeedOffset = 0x100000;

aggregation::UnmaskResponse CopyResponse(const aggregation::UnmaskResponse& r);

// Edits: each applies one to three changes chosen by `in` to its argument.
// Indices are drawn from [0, n + 2), so unknown clients come up too.
void MutateAdvert(FuzzInput& in, const HonestRound& h, aggregation::KeyAdvert& a);
void MutateSeedRoot(FuzzInput& in, const HonestRound& h, aggregation::SeedRoot& r);
// Tags by peer: flipped, dropped, or added for any index.
void MutateTags(FuzzInput& in, const HonestRound& h,
                std::map<uint32_t, std::array<uint8_t, 32>>& tags);
void MutateKeyList(FuzzInput& in, const HonestRound& h, aggregation::KeyList& list);
void MutateSealed(FuzzInput& in, const HonestRound& h, aggregation::SealedShares& s);
void MutateInbound(FuzzInput& in, const HonestRound& h, aggregation::InboundShares& s);
// Complaints about any index, with or without a (random or copied) point
// and proof.
void MutateShareCheck(FuzzInput& in, const HonestRound& h, aggregation::ShareCheck& c);
void MutateChecked(FuzzInput& in, const HonestRound& h, aggregation::CheckedList& list);
void MutateMasked(FuzzInput& in, const HonestRound& h, aggregation::MaskedInput& m);
void MutateIndexList(FuzzInput& in, const HonestRound& h, std::vector<uint32_t>& list);
void MutateSignature(FuzzInput& in, const HonestRound& h, aggregation::SurvivorSignature& s);
void MutateRequest(FuzzInput& in, const HonestRound& h, aggregation::UnmaskRequest& r);
void MutateResponse(FuzzInput& in, const HonestRound& h, aggregation::UnmaskResponse& r);

}  // namespace cohort::fuzz

#endif  // COHORT_TESTS_FUZZ_SECAGG_COHORT_H_
