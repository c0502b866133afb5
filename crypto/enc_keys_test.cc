#include "crypto/enc_keys.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <cstring>
#include <set>

#include "crypto/keys.h"
#include "crypto/shamir.h"

namespace cohort::crypto {
namespace {

std::span<const uint8_t> Bytes(const char* s) {
  return {reinterpret_cast<const uint8_t*>(s), std::strlen(s)};
}

TEST(EncKeysTest, BothSidesDeriveTheSameKey) {
  auto a = GenerateEncKey(), b = GenerateEncKey();
  ASSERT_TRUE(a.ok() && b.ok());
  auto pa = EncSharedPoint(a->secret_key, b->public_key);
  auto pb = EncSharedPoint(b->secret_key, a->public_key);
  ASSERT_TRUE(pa.ok() && pb.ok());
  ASSERT_EQ(0, std::memcmp(pa->bytes().data(), pb->bytes().data(), kEncPointBytes));
  SecretBytes ka = EncKeyFromPoint(pa->bytes(), a->public_key, b->public_key);
  SecretBytes kb = EncKeyFromPoint(pb->bytes(), b->public_key, a->public_key);
  EXPECT_EQ(0, std::memcmp(ka.bytes().data(), kb.bytes().data(), 32));
}

TEST(EncKeysTest, InvalidKeysAreRefused) {
  auto a = GenerateEncKey();
  ASSERT_TRUE(a.ok());
  EncPublic zero{};
  EXPECT_FALSE(IsValidEncPublic(zero));  // The identity.
  EncPublic junk;
  junk.fill(0xff);  // Not a canonical encoding.
  EXPECT_FALSE(IsValidEncPublic(junk));
  EXPECT_TRUE(IsValidEncPublic(a->public_key));
  EXPECT_FALSE(EncSharedPoint(a->secret_key, zero).ok());
  EXPECT_FALSE(EncSharedPoint(a->secret_key, junk).ok());
}

TEST(EncKeysTest, ProofOfTheSharedPointConvincesOnlyForTheTruePoint) {
  auto a = GenerateEncKey(), b = GenerateEncKey(), c = GenerateEncKey();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto point = EncSharedPoint(a->secret_key, b->public_key);
  ASSERT_TRUE(point.ok());
  auto proof = ProveSharedPoint(a->secret_key, a->public_key, b->public_key, point->bytes(),
                                Bytes("round 7"));
  ASSERT_TRUE(proof.ok());
  EXPECT_TRUE(
      VerifySharedPoint(a->public_key, b->public_key, point->bytes(), *proof, Bytes("round 7")));
  // Another context, another peer, another prover, a tampered proof: all fail.
  EXPECT_FALSE(
      VerifySharedPoint(a->public_key, b->public_key, point->bytes(), *proof, Bytes("round 8")));
  EXPECT_FALSE(
      VerifySharedPoint(a->public_key, c->public_key, point->bytes(), *proof, Bytes("round 7")));
  EXPECT_FALSE(
      VerifySharedPoint(c->public_key, b->public_key, point->bytes(), *proof, Bytes("round 7")));
  DleqProof tampered = *proof;
  tampered[40] ^= 1;
  EXPECT_FALSE(
      VerifySharedPoint(a->public_key, b->public_key, point->bytes(), tampered, Bytes("round 7")));
  // A false point (the prover claims a*C instead of a*B) cannot be proven.
  auto wrong = EncSharedPoint(a->secret_key, c->public_key);
  ASSERT_TRUE(wrong.ok());
  auto lie = ProveSharedPoint(a->secret_key, a->public_key, b->public_key, wrong->bytes(),
                              Bytes("round 7"));
  ASSERT_TRUE(lie.ok());
  EXPECT_FALSE(
      VerifySharedPoint(a->public_key, b->public_key, wrong->bytes(), *lie, Bytes("round 7")));
}

TEST(X25519Test, LowOrderPointsAreNotContributory) {
  X25519Public zero{};
  EXPECT_FALSE(IsContributoryX25519(zero));
  X25519Public one{};
  one[0] = 1;  // The point of order 4 at u = 1.
  EXPECT_FALSE(IsContributoryX25519(one));
  auto good = GenerateX25519();
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(IsContributoryX25519(good->public_key));
}

// The list IsContributoryX25519 compares with, against the definition:
// libsodium's scalar multiplication gives the all-zero output (and fails)
// exactly for points of order dividing 8. Probed at every u within 300 of
// 0, 1, p - 1 and p, at the order-8 points and their neighbours, and at
// random keys.
TEST(X25519Test, LowOrderListAgreesWithTheScalarMultiplication) {
  ASSERT_TRUE(InitSodium().ok());
  auto low_order_by_multiplication = [](const X25519Public& u) {
    static constexpr uint8_t kProbe[crypto_scalarmult_SCALARBYTES] = {9};
    uint8_t out[crypto_scalarmult_BYTES];
    return crypto_scalarmult(out, kProbe, u.data()) != 0;
  };
  // u + delta as 256-bit little-endian (wrapping), top bit then cleared.
  auto add = [](X25519Public u, int delta) {
    int carry = delta;
    for (size_t i = 0; i < u.size() && carry != 0; ++i) {
      const int v = u[i] + carry;
      u[i] = static_cast<uint8_t>(v & 0xff);
      carry = v >> 8;  // Arithmetic shift: borrows come out as -1.
    }
    return u;
  };
  X25519Public p{};
  p.fill(0xff);
  p[0] = 0xed;
  p[31] = 0x7f;
  X25519Public order8a{}, order8b{};
  const uint8_t a[] = {0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3,
                       0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32,
                       0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00};
  const uint8_t b[] = {0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1,
                       0x55, 0x9c, 0x83, 0xef, 0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c,
                       0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f, 0x11, 0x57};
  std::memcpy(order8a.data(), a, 32);
  std::memcpy(order8b.data(), b, 32);
  std::set<X25519Public> low_order;
  for (const X25519Public& centre : {X25519Public{}, p, order8a, order8b}) {
    for (int delta = -300; delta <= 300; ++delta) {
      X25519Public u = add(centre, delta);
      u[31] &= 0x7f;
      const bool low = low_order_by_multiplication(u);
      if (low) low_order.insert(u);
      EXPECT_EQ(IsContributoryX25519(u), !low) << "at offset " << delta;
    }
  }
  for (int i = 0; i < 200; ++i) {
    X25519Public u;
    randombytes_buf(u.data(), u.size());
    u[31] &= 0x7f;
    EXPECT_EQ(IsContributoryX25519(u), !low_order_by_multiplication(u));
  }
  // The windows overlap (2^255 - 18 is p + 1, and 2^255 is 0 once the top
  // bit is cleared); between them they reach all 7 listed encodings.
  EXPECT_EQ(low_order.size(), 7u);
  // The top bit set is refused even on a good key.
  auto good = GenerateX25519();
  ASSERT_TRUE(good.ok());
  X25519Public high = good->public_key;
  high[31] |= 0x80;
  EXPECT_FALSE(IsContributoryX25519(high));
}

TEST(ShamirConsistentTest, NamesTheShareOffThePolynomial) {
  SecretBytes secret = RandomSecret(kShamirSecretBytes);
  std::vector<uint32_t> xs = {1, 2, 3, 4, 5, 6, 7};
  auto shares = ShamirSplit(secret, 4, xs);
  ASSERT_TRUE(shares.ok());
  std::vector<const SecretBytes*> basis = {&(*shares)[0], &(*shares)[1], &(*shares)[2],
                                           &(*shares)[3]};
  ShamirCombiner combiner;
  for (size_t j = 0; j < xs.size(); ++j) {
    auto ok = combiner.Consistent(basis, (*shares)[j]);
    ASSERT_TRUE(ok.ok());
    EXPECT_TRUE(*ok) << "share " << j;
  }
  (*shares)[5].bytes()[20] ^= 1;  // One bit of one limb.
  auto bad = combiner.Consistent(basis, (*shares)[5]);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(*bad);
  // A share of another secret with the same x is off the polynomial too.
  auto other = ShamirSplit(RandomSecret(kShamirSecretBytes), 4, xs);
  EXPECT_FALSE(*combiner.Consistent(basis, (*other)[6]));
}

}  // namespace
}  // namespace cohort::crypto
