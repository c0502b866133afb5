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

namespace {

// Every encoding, top bit clear, of a point whose order divides the cofactor
// 8 (cr.yp.to/ecdh.html; libsodium's has_small_order list): u = 0, 1, the
// two u of order 8, p - 1, and p and p + 1 (the second spellings of 0 and 1
// below 2^255; no other low-order u has one). X25519 clamps every scalar to
// a multiple of 8, so these, and only these, give the all-zero output for
// every secret. X25519Test.LowOrderListAgreesWithTheScalarMultiplication
// checks the list against libsodium's scalar multiplication.
constexpr uint8_t kFF = 0xff;
constexpr X25519Public kLowOrder[] = {
    {},
    {1},
    {0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3,
     0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32,
     0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00},
    {0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1,
     0x55, 0x9c, 0x83, 0xef, 0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c,
     0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f, 0x11, 0x57},
    {0xec, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF,
     kFF,  kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, 0x7f},
    {0xed, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF,
     kFF,  kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, 0x7f},
    {0xee, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF,
     kFF,  kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, kFF, 0x7f},
};

}  // namespace

bool IsContributoryX25519(const X25519Public& key) {
  // The top bit is ignored by X25519: a key with it set is a second
  // spelling of another and is refused, so keys compare by their bytes.
  if ((key[31] & 0x80) != 0) return false;
  // A comparison, not a scalar multiplication (37 us, once per neighbour's
  // key in every round): public keys, so it need not be constant time.
  return std::find(std::begin(kLowOrder), std::end(kLowOrder), key) == std::end(kLowOrder);
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
