#include "crypto/enc_keys.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "crypto/keys.h"

namespace cohort::crypto {
namespace {

static_assert(crypto_core_ristretto255_BYTES == kEncPublicBytes);
static_assert(crypto_core_ristretto255_SCALARBYTES == 32);

using Point = std::array<uint8_t, crypto_core_ristretto255_BYTES>;
using Scalar = std::array<uint8_t, crypto_core_ristretto255_SCALARBYTES>;

// The Fiat-Shamir challenge: BLAKE2b-512 of everything the proof is about,
// reduced modulo the group order.
Scalar Challenge(std::span<const uint8_t> context, const EncPublic& a, const EncPublic& b,
                 std::span<const uint8_t> p, const Point& r1, const Point& r2) {
  static constexpr char kDomain[] = "cohort-dleq-ristretto255-v1";
  uint8_t wide[crypto_core_ristretto255_NONREDUCEDSCALARBYTES];
  crypto_generichash_state state;
  (void)crypto_generichash_init(&state, nullptr, 0, sizeof(wide));
  (void)crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(kDomain),
                                  sizeof(kDomain));
  const uint64_t context_size = context.size();
  (void)crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(&context_size), 8);
  for (std::span<const uint8_t> part :
       {context, std::span<const uint8_t>(a), std::span<const uint8_t>(b), p,
        std::span<const uint8_t>(r1), std::span<const uint8_t>(r2)}) {
    (void)crypto_generichash_update(&state, part.data(), part.size());
  }
  (void)crypto_generichash_final(&state, wide, sizeof(wide));
  Scalar c;
  crypto_core_ristretto255_scalar_reduce(c.data(), wide);
  return c;
}

bool ValidPoint(std::span<const uint8_t> p) {
  return p.size() == crypto_core_ristretto255_BYTES &&
         crypto_core_ristretto255_is_valid_point(p.data()) == 1 &&
         !sodium_is_zero(p.data(), p.size());
}

}  // namespace

StatusOr<EncKeyPair> GenerateEncKey() {
  COHORT_RETURN_IF_ERROR(InitSodium());
  EncKeyPair pair;
  pair.secret_key = SecretBytes(crypto_core_ristretto255_SCALARBYTES);
  for (;;) {
    crypto_core_ristretto255_scalar_random(pair.secret_key.bytes().data());
    if (crypto_scalarmult_ristretto255_base(pair.public_key.data(),
                                            pair.secret_key.bytes().data()) == 0) {
      return pair;
    }
  }
}

bool IsValidEncPublic(const EncPublic& key) { return sodium_init() >= 0 && ValidPoint(key); }

StatusOr<SecretBytes> EncSharedPoint(const SecretBytes& my_secret, const EncPublic& their_public) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (my_secret.size() != crypto_core_ristretto255_SCALARBYTES) {
    return InvalidArgumentError("encryption secret key must have 32 bytes");
  }
  // The multiplication decodes the key itself (ValidPoint's check: it
  // fails on a non-canonical or off-group encoding) and refuses an identity
  // result, which the identity key gives; a second decode would cost a
  // fifth of the agreement.
  SecretBytes point(crypto_core_ristretto255_BYTES);
  if (crypto_scalarmult_ristretto255(point.bytes().data(), my_secret.bytes().data(),
                                     their_public.data()) != 0) {
    return InvalidArgumentError(
        "peer encryption key is not a valid ristretto255 point, or the shared point is the "
        "identity");
  }
  return point;
}

SecretBytes EncKeyFromPoint(std::span<const uint8_t> point, const EncPublic& a,
                            const EncPublic& b) {
  const bool a_first = std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  const EncPublic& lo = a_first ? a : b;
  const EncPublic& hi = a_first ? b : a;
  static constexpr char kLabel[] = "cohort-secagg-share-key";
  auto h = Hash256({{reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel)}, point, lo, hi});
  SecretBytes key(h.size());
  std::memcpy(key.bytes().data(), h.data(), h.size());
  sodium_memzero(h.data(), h.size());
  return key;
}

StatusOr<DleqProof> ProveSharedPoint(const SecretBytes& my_secret, const EncPublic& my_public,
                                     const EncPublic& their_public, std::span<const uint8_t> point,
                                     std::span<const uint8_t> context) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (my_secret.size() != crypto_core_ristretto255_SCALARBYTES || !ValidPoint(their_public) ||
      !ValidPoint(point)) {
    return InvalidArgumentError("dleq proof: malformed key or point");
  }
  // r random; R1 = r G; R2 = r B; c = H(...); s = r - c a.
  SecretBytes r(crypto_core_ristretto255_SCALARBYTES);
  Point r1, r2;
  do {
    crypto_core_ristretto255_scalar_random(r.bytes().data());
  } while (crypto_scalarmult_ristretto255_base(r1.data(), r.bytes().data()) != 0 ||
           crypto_scalarmult_ristretto255(r2.data(), r.bytes().data(), their_public.data()) != 0);
  const Scalar c = Challenge(context, my_public, their_public, point, r1, r2);
  SecretBytes ca(crypto_core_ristretto255_SCALARBYTES);
  crypto_core_ristretto255_scalar_mul(ca.bytes().data(), c.data(), my_secret.bytes().data());
  DleqProof proof;
  std::memcpy(proof.data(), c.data(), 32);
  crypto_core_ristretto255_scalar_sub(proof.data() + 32, r.bytes().data(), ca.bytes().data());
  return proof;
}

bool VerifySharedPoint(const EncPublic& prover_public, const EncPublic& their_public,
                       std::span<const uint8_t> point, const DleqProof& proof,
                       std::span<const uint8_t> context) {
  if (sodium_init() < 0 || !ValidPoint(prover_public) || !ValidPoint(their_public) ||
      !ValidPoint(point)) {
    return false;
  }
  Scalar c, s;
  std::memcpy(c.data(), proof.data(), 32);
  std::memcpy(s.data(), proof.data() + 32, 32);
  // Both halves must be canonical scalars: reject any with bits beyond the
  // group order rather than reduce them (one proof, one encoding).
  uint8_t wide[crypto_core_ristretto255_NONREDUCEDSCALARBYTES] = {};
  for (const Scalar* x : {&c, &s}) {
    std::memcpy(wide, x->data(), 32);
    Scalar reduced;
    crypto_core_ristretto255_scalar_reduce(reduced.data(), wide);
    if (reduced != *x) return false;
  }
  // R1 = s G + c A; R2 = s B + c P.
  Point sg, ca, sb, cp, r1, r2;
  if (crypto_scalarmult_ristretto255_base(sg.data(), s.data()) != 0 ||
      crypto_scalarmult_ristretto255(ca.data(), c.data(), prover_public.data()) != 0 ||
      crypto_scalarmult_ristretto255(sb.data(), s.data(), their_public.data()) != 0 ||
      crypto_scalarmult_ristretto255(cp.data(), c.data(), point.data()) != 0 ||
      crypto_core_ristretto255_add(r1.data(), sg.data(), ca.data()) != 0 ||
      crypto_core_ristretto255_add(r2.data(), sb.data(), cp.data()) != 0) {
    return false;
  }
  const Scalar expected = Challenge(context, prover_public, their_public, point, r1, r2);
  return sodium_memcmp(expected.data(), c.data(), c.size()) == 0;
}

}  // namespace cohort::crypto
