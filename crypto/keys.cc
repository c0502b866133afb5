#include "crypto/keys.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

namespace cohort::crypto {

Status InitSodium() {
  if (sodium_init() < 0) return InternalError("libsodium failed to initialise");
  return OkStatus();
}

StatusOr<X25519KeyPair> GenerateX25519() {
  COHORT_RETURN_IF_ERROR(InitSodium());
  return X25519FromSeed(RandomSecret(kX25519SecretBytes));
}

StatusOr<X25519KeyPair> X25519FromSeed(const SecretBytes& seed) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (seed.size() != kX25519SecretBytes) {
    return InvalidArgumentError("x25519 seed has " + std::to_string(seed.size()) +
                                " bytes, expected 32");
  }
  X25519KeyPair pair;
  pair.secret_key = SecretBytes(kX25519SecretBytes);
  std::memcpy(pair.secret_key.bytes().data(), seed.bytes().data(), kX25519SecretBytes);
  if (crypto_scalarmult_base(pair.public_key.data(), pair.secret_key.bytes().data()) != 0) {
    return InternalError("crypto_scalarmult_base failed");
  }
  return pair;
}

StatusOr<SecretBytes> AgreeX25519(const SecretBytes& my_secret, const X25519Public& my_public,
                                  const X25519Public& their_public) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (my_secret.size() != kX25519SecretBytes) {
    return InvalidArgumentError("x25519 secret key must have 32 bytes");
  }
  SecretBytes point(crypto_scalarmult_BYTES);
  if (crypto_scalarmult(point.bytes().data(), my_secret.bytes().data(), their_public.data()) != 0) {
    return InvalidArgumentError("peer public key is a low-order point");
  }
  // Order the public keys so both sides hash the same bytes.
  const bool mine_first = std::lexicographical_compare(my_public.begin(), my_public.end(),
                                                       their_public.begin(), their_public.end());
  const X25519Public& lo = mine_first ? my_public : their_public;
  const X25519Public& hi = mine_first ? their_public : my_public;
  SecretBytes shared(kSharedKeyBytes);
  crypto_generichash_state state;
  if (crypto_generichash_init(&state, nullptr, 0, kSharedKeyBytes) != 0 ||
      crypto_generichash_update(&state, point.bytes().data(), point.size()) != 0 ||
      crypto_generichash_update(&state, lo.data(), lo.size()) != 0 ||
      crypto_generichash_update(&state, hi.data(), hi.size()) != 0 ||
      crypto_generichash_final(&state, shared.bytes().data(), kSharedKeyBytes) != 0) {
    sodium_memzero(&state, sizeof(state));
    return InternalError("blake2b failed");
  }
  sodium_memzero(&state, sizeof(state));
  return shared;
}

bool IsContributoryX25519(const X25519Public& key) {
  // The top bit is ignored by X25519: a key with it set is a second
  // spelling of another and is refused, so keys compare by their bytes.
  if (sodium_init() < 0 || (key[31] & 0x80) != 0) return false;
  // X25519 clamps every scalar to a multiple of the cofactor 8, so a point of
  // order dividing 8 gives the all-zero output for any scalar, and libsodium
  // reports it. A fixed scalar suffices.
  static constexpr uint8_t kProbe[crypto_scalarmult_SCALARBYTES] = {9};
  uint8_t out[crypto_scalarmult_BYTES];
  const bool ok = crypto_scalarmult(out, kProbe, key.data()) == 0;
  sodium_memzero(out, sizeof(out));
  return ok;
}

StatusOr<Ed25519KeyPair> GenerateEd25519() {
  COHORT_RETURN_IF_ERROR(InitSodium());
  Ed25519KeyPair pair;
  pair.secret_key = SecretBytes(kEd25519SecretBytes);
  if (crypto_sign_keypair(pair.public_key.data(), pair.secret_key.bytes().data()) != 0) {
    return InternalError("crypto_sign_keypair failed");
  }
  return pair;
}

StatusOr<Signature> Sign(const Ed25519KeyPair& key, std::span<const uint8_t> message) {
  if (key.secret_key.size() != kEd25519SecretBytes) {
    return InvalidArgumentError("ed25519 secret key must have 64 bytes");
  }
  Signature sig{};
  if (crypto_sign_detached(sig.data(), nullptr, message.data(), message.size(),
                           key.secret_key.bytes().data()) != 0) {
    return InternalError("crypto_sign_detached failed");
  }
  return sig;
}

bool Verify(const Ed25519Public& key, std::span<const uint8_t> message,
            const Signature& signature) {
  if (sodium_init() < 0) return false;
  return crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                     key.data()) == 0;
}

std::array<uint8_t, 32> Hash256(std::initializer_list<std::span<const uint8_t>> parts,
                                std::span<const uint8_t> key) {
  std::array<uint8_t, 32> out{};
  crypto_generichash_state state;
  // Only fails for out-of-range sizes, which are constants here.
  (void)crypto_generichash_init(&state, key.empty() ? nullptr : key.data(), key.size(), out.size());
  for (auto part : parts) (void)crypto_generichash_update(&state, part.data(), part.size());
  (void)crypto_generichash_final(&state, out.data(), out.size());
  sodium_memzero(&state, sizeof(state));
  return out;
}

SecretBytes RandomSecret(size_t size) {
  SecretBytes s(size);
  if (size > 0) randombytes_buf(s.bytes().data(), size);
  return s;
}

}  // namespace cohort::crypto
