#include "crypto/enc_keys.h"

#include <gtest/gtest.h>

#include <cstring>

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
