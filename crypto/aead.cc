#include "crypto/aead.h"

#include <sodium.h>

#include "crypto/keys.h"

namespace cohort::crypto {

StatusOr<std::string> Seal(const SecretBytes& key, std::span<const uint8_t> plaintext,
                           std::span<const uint8_t> associated_data) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (key.size() != kAeadKeyBytes) return InvalidArgumentError("aead key must have 32 bytes");
  std::string out(kAeadNonceBytes + plaintext.size() + kAeadTagBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  randombytes_buf(p, kAeadNonceBytes);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_encrypt(
          p + kAeadNonceBytes, &written, plaintext.data(), plaintext.size(), associated_data.data(),
          associated_data.size(), nullptr, p, key.bytes().data()) != 0) {
    return InternalError("xchacha20poly1305 encrypt failed");
  }
  out.resize(kAeadNonceBytes + written);
  return out;
}

StatusOr<SecretBytes> Open(const SecretBytes& key, std::span<const uint8_t> sealed,
                           std::span<const uint8_t> associated_data) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (key.size() != kAeadKeyBytes) return InvalidArgumentError("aead key must have 32 bytes");
  if (sealed.size() < kAeadNonceBytes + kAeadTagBytes) {
    return InvalidArgumentError("ciphertext too short");
  }
  SecretBytes plain(sealed.size() - kAeadNonceBytes - kAeadTagBytes);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          plain.bytes().data(), &written, nullptr, sealed.data() + kAeadNonceBytes,
          sealed.size() - kAeadNonceBytes, associated_data.data(), associated_data.size(),
          sealed.data(), key.bytes().data()) != 0) {
    return InvalidArgumentError("authentication failed");
  }
  return plain;
}

}  // namespace cohort::crypto
