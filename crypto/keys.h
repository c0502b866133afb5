// Key pairs and key agreement (libsodium). X25519 for encryption and mask
// keys, Ed25519 for identities. Secret halves live only in SecretBytes.
#ifndef COHORT_CRYPTO_KEYS_H_
#define COHORT_CRYPTO_KEYS_H_

#include <array>
#include <cstdint>
#include <span>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

inline constexpr size_t kX25519PublicBytes = 32;
inline constexpr size_t kX25519SecretBytes = 32;
inline constexpr size_t kSharedKeyBytes = 32;
inline constexpr size_t kEd25519PublicBytes = 32;
inline constexpr size_t kEd25519SecretBytes = 64;
inline constexpr size_t kSignatureBytes = 64;

using X25519Public = std::array<uint8_t, kX25519PublicBytes>;
using Ed25519Public = std::array<uint8_t, kEd25519PublicBytes>;
using Signature = std::array<uint8_t, kSignatureBytes>;

// kInternal if libsodium cannot initialise. Safe to call repeatedly.
Status InitSodium();

struct X25519KeyPair {
  X25519Public public_key{};
  SecretBytes secret_key;  // 32 bytes.
};

// A fresh random key pair.
[[nodiscard]] StatusOr<X25519KeyPair> GenerateX25519();
// The key pair whose secret key is `seed` (32 bytes): sharing the seed shares
// the key pair. kInvalidArgument on a wrong seed size.
[[nodiscard]] StatusOr<X25519KeyPair> X25519FromSeed(const SecretBytes& seed);

// Symmetric key both sides derive: BLAKE2b-256(X25519(secret, peer) ||
// smaller public key || larger public key). kInvalidArgument when the peer's
// key is a low-order point (the shared point is all zeros).
[[nodiscard]] StatusOr<SecretBytes> AgreeX25519(const SecretBytes& my_secret,
                                                const X25519Public& my_public,
                                                const X25519Public& their_public);

// False when `key` is a low-order point (it gives the all-zero agreement
// with every secret, so each peer's key agreement would fail) or has the
// top bit set (a second spelling of another key). Untrusted keys must pass
// this before they are used or forwarded.
bool IsContributoryX25519(const X25519Public& key);

struct Ed25519KeyPair {
  Ed25519Public public_key{};
  SecretBytes secret_key;  // 64 bytes (libsodium's seed || public layout).
};

[[nodiscard]] StatusOr<Ed25519KeyPair> GenerateEd25519();
[[nodiscard]] StatusOr<Signature> Sign(const Ed25519KeyPair& key, std::span<const uint8_t> message);
// False for a bad signature; never aborts.
bool Verify(const Ed25519Public& key, std::span<const uint8_t> message, const Signature& signature);

// BLAKE2b-256 of the concatenated parts, keyed by `key` when not empty.
std::array<uint8_t, 32> Hash256(std::initializer_list<std::span<const uint8_t>> parts,
                                std::span<const uint8_t> key = {});

// Cryptographically random bytes into a new SecretBytes.
SecretBytes RandomSecret(size_t size);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_KEYS_H_
