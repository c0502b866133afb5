// Share-encryption keys of secure aggregation: ristretto255 key pairs whose
// Diffie-Hellman point can be proven to a third party.
//
// Two clients seal their Shamir shares for each other under a key derived
// from P = a * B (a: one's secret scalar, B: the other's public point). When a
// recipient cannot open what a sender sealed, it reveals P together with a
// proof that P = a * B for the `a` behind its own advertised public key A
// (a Chaum-Pedersen proof of equal discrete logarithms, made non-interactive
// with BLAKE2b). The coordinator checks the proof and opens the ciphertext
// itself: whichever of the two lied is caught, and nothing else is revealed
// (P only protects the shares these two exchanged).
#ifndef COHORT_CRYPTO_ENC_KEYS_H_
#define COHORT_CRYPTO_ENC_KEYS_H_

#include <array>
#include <cstdint>
#include <span>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

inline constexpr size_t kEncPublicBytes = 32;
inline constexpr size_t kEncPointBytes = 32;
inline constexpr size_t kDleqProofBytes = 64;

using EncPublic = std::array<uint8_t, kEncPublicBytes>;
using DleqProof = std::array<uint8_t, kDleqProofBytes>;  // Challenge c || response s.

struct EncKeyPair {
  EncPublic public_key{};
  SecretBytes secret_key;  // A ristretto255 scalar (32 bytes).
};

[[nodiscard]] StatusOr<EncKeyPair> GenerateEncKey();

// True for a canonical ristretto255 encoding of a point other than the
// identity. Untrusted keys must pass this before any other use.
bool IsValidEncPublic(const EncPublic& key);

// P = my_secret * their_public. kInvalidArgument when `their_public` is not a
// valid key (see above).
[[nodiscard]] StatusOr<SecretBytes> EncSharedPoint(const SecretBytes& my_secret,
                                                   const EncPublic& their_public);

// The 32-byte AEAD key both sides derive from P: BLAKE2b-256(P || smaller
// public key || larger public key).
SecretBytes EncKeyFromPoint(std::span<const uint8_t> point, const EncPublic& a, const EncPublic& b);

// Proves that `point` = my_secret * their_public where my_public =
// my_secret * G, bound to `context`.
[[nodiscard]] StatusOr<DleqProof> ProveSharedPoint(const SecretBytes& my_secret,
                                                   const EncPublic& my_public,
                                                   const EncPublic& their_public,
                                                   std::span<const uint8_t> point,
                                                   std::span<const uint8_t> context);

// Checks a proof from ProveSharedPoint. False on any malformed input; never
// aborts.
bool VerifySharedPoint(const EncPublic& prover_public, const EncPublic& their_public,
                       std::span<const uint8_t> point, const DleqProof& proof,
                       std::span<const uint8_t> context);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_ENC_KEYS_H_
