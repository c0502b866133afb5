// XChaCha20-Poly1305 (IETF) authenticated encryption with associated data.
#ifndef COHORT_CRYPTO_AEAD_H_
#define COHORT_CRYPTO_AEAD_H_

#include <cstdint>
#include <span>
#include <string>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

inline constexpr size_t kAeadKeyBytes = 32;
inline constexpr size_t kAeadNonceBytes = 24;
inline constexpr size_t kAeadTagBytes = 16;

// Returns nonce (24 random bytes) || ciphertext || tag.
[[nodiscard]] StatusOr<std::string> Seal(const SecretBytes& key, std::span<const uint8_t> plaintext,
                                         std::span<const uint8_t> associated_data);
// kInvalidArgument ("authentication failed") on any tampering, a wrong key or
// wrong associated data. The plaintext is returned as a secret.
[[nodiscard]] StatusOr<SecretBytes> Open(const SecretBytes& key, std::span<const uint8_t> sealed,
                                         std::span<const uint8_t> associated_data);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_AEAD_H_
