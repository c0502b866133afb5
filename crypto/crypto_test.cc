#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "crypto/aead.h"
#include "crypto/digest.h"
#include "crypto/key_files.h"
#include "crypto/keys.h"
#include "crypto/prg.h"
#include "crypto/shamir.h"

namespace cohort::crypto {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(KeysTest, BothSidesAgreeOnTheSharedKey) {
  auto a = GenerateX25519();
  auto b = GenerateX25519();
  ASSERT_TRUE(a.ok() && b.ok());
  auto ab = AgreeX25519(a->secret_key, a->public_key, b->public_key);
  auto ba = AgreeX25519(b->secret_key, b->public_key, a->public_key);
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(std::memcmp(ab->bytes().data(), ba->bytes().data(), 32), 0);
  // The seed is the key pair.
  auto again = X25519FromSeed(a->secret_key);
  EXPECT_EQ(again->public_key, a->public_key);
  X25519Public zero{};
  EXPECT_FALSE(AgreeX25519(a->secret_key, a->public_key, zero).ok());
}

TEST(KeysTest, SignaturesBindTheMessage) {
  auto key = GenerateEd25519();
  ASSERT_TRUE(key.ok());
  auto sig = Sign(*key, Bytes("round 3 survivors: 1 2 5"));
  ASSERT_TRUE(sig.ok());
  EXPECT_TRUE(Verify(key->public_key, Bytes("round 3 survivors: 1 2 5"), *sig));
  EXPECT_FALSE(Verify(key->public_key, Bytes("round 3 survivors: 1 2 6"), *sig));
}

TEST(AeadTest, TamperingKeyOrContextChangeIsDetected) {
  SecretBytes key = RandomSecret(32);
  auto sealed = Seal(key, Bytes("share bytes"), Bytes("session|2|u1|u7"));
  ASSERT_TRUE(sealed.ok());
  auto opened = Open(key, Bytes(*sealed), Bytes("session|2|u1|u7"));
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(opened->bytes().data()), opened->size()),
            "share bytes");
  EXPECT_FALSE(Open(key, Bytes(*sealed), Bytes("session|2|u1|u8")).ok());
  std::string flipped = *sealed;
  flipped[30] ^= 1;
  EXPECT_FALSE(Open(key, Bytes(flipped), Bytes("session|2|u1|u7")).ok());
  EXPECT_FALSE(Open(RandomSecret(32), Bytes(*sealed), Bytes("session|2|u1|u7")).ok());
}

TEST(PrgTest, MasksCancelAndDependOnTheKey) {
  SecretBytes k1 = RandomSecret(32), k2 = RandomSecret(32);
  std::vector<uint32_t> v(10000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint32_t>(i * 7);
  const std::vector<uint32_t> original = v;
  ASSERT_TRUE(AddMask(k1, v, false).ok());
  EXPECT_NE(v, original);
  std::vector<uint32_t> w = original;
  ASSERT_TRUE(AddMask(k2, w, false).ok());
  EXPECT_NE(v, w);
  ASSERT_TRUE(AddMask(k1, v, true).ok());
  EXPECT_EQ(v, original);
  // A prefix is a prefix: the stream does not depend on the vector's length.
  std::vector<uint32_t> a(5000, 0), b(10000, 0);
  ASSERT_TRUE(AddMask(k1, a, false).ok());
  ASSERT_TRUE(AddMask(k1, b, false).ok());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
}

TEST(PrgTest, ThreadedMasksEqualSequentialOnes) {
  std::vector<SecretBytes> keys;
  for (int i = 0; i < 5; ++i) keys.push_back(RandomSecret(32));
  std::vector<MaskJob> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back({&keys[i], i % 2 == 1});
  std::vector<uint32_t> a(100003, 3), b(100003, 3);
  for (const auto& j : jobs) ASSERT_TRUE(AddMask(*j.key, a, j.subtract).ok());
  ASSERT_TRUE(AddMasks(jobs, b, 3).ok());
  EXPECT_EQ(a, b);
}

// Every AES-CTR implementation this CPU can run.
std::vector<PrgImpl> AvailableImpls() {
  std::vector<PrgImpl> impls = {PrgImpl::kOpenSsl};
  if (BestPrgImpl() != PrgImpl::kOpenSsl) impls.push_back(PrgImpl::kAesNi);
  if (BestPrgImpl() == PrgImpl::kVaes) impls.push_back(PrgImpl::kVaes);
  return impls;
}

// FIPS-197-style known answers: under the all-zero key, AES-256 encrypts
// the zero block (counter 0) to dc95c078 a2408989 ad48a214 92842087 and
// AES-128 to 66e94bd4 ef8a2c3b 884cfa59 ca342b2e. The AES-128 key is the
// first half of the 32 bytes: ones in the second half change nothing.
TEST(PrgTest, KnownAnswerForEveryImplementation) {
  for (PrgImpl impl : AvailableImpls()) {
    SecretBytes zero_key(32);
    std::vector<uint32_t> acc(4, 0);
    ASSERT_TRUE(AddMask(zero_key, acc, false, impl, MaskPrg::kAes256Ctr).ok()) << PrgImplName(impl);
    EXPECT_EQ(acc, (std::vector<uint32_t>{0x78c095dc, 0x898940a2, 0x14a248ad, 0x87208492}))
        << PrgImplName(impl);
    SecretBytes half_zero(32);
    std::fill(half_zero.bytes().begin() + 16, half_zero.bytes().end(), 0xff);
    std::vector<uint32_t> acc128(4, 0);
    ASSERT_TRUE(AddMask(half_zero, acc128, false, impl, MaskPrg::kAes128Ctr).ok())
        << PrgImplName(impl);
    EXPECT_EQ(acc128, (std::vector<uint32_t>{0xd44be966, 0x3b2c8aef, 0x59fa4c88, 0x2e2b34ca}))
        << PrgImplName(impl);
  }
}

// Our kernels and OpenSSL must give the same stream: a client and the
// coordinator may run different ones.
TEST(PrgTest, KernelsEqualOpenSsl) {
  const std::vector<PrgImpl> impls = AvailableImpls();
  if (impls.size() == 1) GTEST_SKIP() << "this CPU has no AES-NI; OpenSSL only";
  SecretBytes key = RandomSecret(32);
  for (MaskPrg prg : {MaskPrg::kAes128Ctr, MaskPrg::kAes256Ctr}) {
    for (PrgImpl impl : impls) {
      const std::string what = std::string(PrgImplName(impl)) + " " + MaskPrgName(prg);
      for (size_t n : {0, 1, 3, 4, 5, 31, 32, 33, 63, 64, 65, 127, 1000, 100003}) {
        for (bool subtract : {false, true}) {
          std::vector<uint32_t> a(n), b(n);
          for (size_t i = 0; i < n; ++i) a[i] = b[i] = static_cast<uint32_t>(i * 2654435761u);
          ASSERT_TRUE(AddMask(key, a, subtract, PrgImpl::kOpenSsl, prg).ok());
          ASSERT_TRUE(AddMask(key, b, subtract, impl, prg).ok());
          EXPECT_EQ(a, b) << what << " n=" << n << " subtract=" << subtract;
        }
      }
      // Threaded slices start mid-stream: the counter offset must agree too.
      std::vector<SecretBytes> keys;
      for (int i = 0; i < 3; ++i) keys.push_back(RandomSecret(32));
      std::vector<MaskJob> jobs;
      for (int i = 0; i < 3; ++i) jobs.push_back({&keys[i], i == 1});
      std::vector<uint32_t> a(70001, 9), b(70001, 9);
      ASSERT_TRUE(AddMasks(jobs, a, 3, PrgImpl::kOpenSsl, prg).ok());
      ASSERT_TRUE(AddMasks(jobs, b, 3, impl, prg).ok());
      EXPECT_EQ(a, b) << what;
    }
  }
}

// ChaCha20, all-zero key and nonce, block 0: 76b8e0ad a0f13d90 405d6ae5
// 5386bd28 (the well-known first keystream bytes).
TEST(PrgTest, ChaCha20KnownAnswerAndThreadedSlices) {
  SecretBytes zero_key(32);
  std::vector<uint32_t> acc(4, 0);
  ASSERT_TRUE(AddMask(zero_key, acc, false, PrgImpl::kAuto, MaskPrg::kChaCha20).ok());
  EXPECT_EQ(acc, (std::vector<uint32_t>{0xade0b876, 0x903df1a0, 0xe56a5d40, 0x28bd8653}));
  std::vector<SecretBytes> keys;
  for (int i = 0; i < 3; ++i) keys.push_back(RandomSecret(32));
  std::vector<MaskJob> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back({&keys[i], i == 1});
  std::vector<uint32_t> a(70001, 9), b(70001, 9);
  for (const auto& j : jobs) {
    ASSERT_TRUE(AddMask(*j.key, a, j.subtract, PrgImpl::kAuto, MaskPrg::kChaCha20).ok());
  }
  ASSERT_TRUE(AddMasks(jobs, b, 3, PrgImpl::kAuto, MaskPrg::kChaCha20).ok());
  EXPECT_EQ(a, b);
  // A different stream from AES-128-CTR and AES-256-CTR under the same keys.
  std::vector<uint32_t> c(70001, 9), d(70001, 9);
  ASSERT_TRUE(AddMasks(jobs, c, 3, PrgImpl::kAuto, MaskPrg::kAes128Ctr).ok());
  ASSERT_TRUE(AddMasks(jobs, d, 3, PrgImpl::kAuto, MaskPrg::kAes256Ctr).ok());
  EXPECT_NE(b, c);
  EXPECT_NE(b, d);
  EXPECT_NE(c, d);
}

TEST(PrgTest, RejectsAWrongKeySize) {
  SecretBytes short_key = RandomSecret(16);
  std::vector<uint32_t> acc(8, 0);
  EXPECT_FALSE(AddMask(short_key, acc, false).ok());
}

TEST(ShamirTest, AnyThresholdSubsetRebuildsTheSecret) {
  SecretBytes secret = RandomSecret(32);
  std::vector<uint32_t> xs = {3, 9, 4, 12, 7};
  auto shares = ShamirSplit(secret, 3, xs);
  ASSERT_TRUE(shares.ok()) << shares.status();
  ShamirCombiner combiner;
  for (auto subset : std::vector<std::vector<int>>{{0, 1, 2}, {4, 2, 0}, {1, 3, 4}, {3, 4, 0, 1}}) {
    std::vector<const SecretBytes*> picked;
    for (int i : subset) picked.push_back(&(*shares)[i]);
    auto rebuilt = combiner.Combine(picked, 3);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    EXPECT_EQ(std::memcmp(rebuilt->bytes().data(), secret.bytes().data(), 32), 0);
  }
  std::vector<const SecretBytes*> two = {&(*shares)[0], &(*shares)[1]};
  EXPECT_FALSE(combiner.Combine(two, 3).ok());
}

bool SameBytes(const SecretBytes& a, const SecretBytes& b) {
  return a.size() == b.size() && std::memcmp(a.bytes().data(), b.bytes().data(), a.size()) == 0;
}

// Secrecy below the threshold. With a polynomial of degree t-1, any t-1
// shares are uniformly distributed whatever the secret, so interpolating
// them (as if the threshold were t-1) gives a value unrelated to the secret.
// With a polynomial one degree too low, the same t-1 shares rebuild it.
TEST(ShamirTest, FewerThanThresholdSharesRevealNothing) {
  ShamirCombiner combiner;
  for (uint32_t t : {2u, 3u, 5u}) {
    std::vector<uint32_t> xs;
    for (uint32_t i = 0; i < t + 2; ++i) xs.push_back(3 * i + 2);
    for (int trial = 0; trial < 20; ++trial) {
      SecretBytes secret = RandomSecret(kShamirSecretBytes);
      auto shares = ShamirSplit(secret, t, xs);
      ASSERT_TRUE(shares.ok()) << shares.status();
      // Two different sets of t-1 shares: the first ones and the last ones.
      for (size_t start : {size_t{0}, xs.size() - (t - 1)}) {
        std::vector<const SecretBytes*> below;
        for (size_t i = start; i < start + t - 1; ++i) below.push_back(&(*shares)[i]);
        auto guess = combiner.Combine(below, t - 1);
        // Usually an error (the interpolated limbs leave their range); a
        // result, when there is one, must not be the secret.
        EXPECT_FALSE(guess.ok() && SameBytes(*guess, secret))
            << t - 1 << " shares rebuilt a secret shared with threshold " << t;
      }
      std::vector<const SecretBytes*> enough;
      for (size_t i = 0; i < t; ++i) enough.push_back(&(*shares)[xs.size() - 1 - i]);
      auto rebuilt = combiner.Combine(enough, t);
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      EXPECT_TRUE(SameBytes(*rebuilt, secret)) << "threshold " << t;
    }
  }
}

// Each split draws a fresh polynomial: splitting one secret twice gives
// different shares at every x (with reused coefficients, the difference of
// two secrets' shares would equal the difference of the secrets).
TEST(ShamirTest, EachSplitDrawsFreshCoefficients) {
  SecretBytes secret = RandomSecret(kShamirSecretBytes);
  std::vector<uint32_t> xs = {1, 2, 3, 4};
  auto a = ShamirSplit(secret, 3, xs);
  auto b = ShamirSplit(secret, 3, xs);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(ShamirShareX((*a)[i]), xs[i]);
    EXPECT_FALSE(SameBytes((*a)[i], (*b)[i])) << "x = " << xs[i];
  }
}

TEST(ShamirTest, MixedOrMalformedSharesAreRejected) {
  SecretBytes a = RandomSecret(32), b = RandomSecret(32);
  std::vector<uint32_t> xs = {1, 2, 3};
  auto sa = ShamirSplit(a, 3, xs);
  auto sb = ShamirSplit(b, 3, xs);
  ShamirCombiner combiner;
  std::vector<const SecretBytes*> mixed = {&(*sa)[0], &(*sa)[1], &(*sb)[2]};
  // A wrong share gives a wrong limb; with overwhelming probability a limb
  // leaves its 56-bit range, which is detected.
  EXPECT_FALSE(combiner.Combine(mixed, 3).ok());
  std::vector<const SecretBytes*> repeated = {&(*sa)[0], &(*sa)[0], &(*sa)[1]};
  EXPECT_FALSE(combiner.Combine(repeated, 3).ok());
  EXPECT_FALSE(ShamirSplit(a, 4, xs).ok());
  std::vector<uint32_t> bad = {0, 1, 2};
  EXPECT_FALSE(ShamirSplit(a, 2, bad).ok());
}

TEST(KeyFilesTest, IdentitiesRoundTripAndLooseSecretsAreRefused) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("cohort_keys_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WriteIdentity(dir, "alice").ok());
  EXPECT_EQ(WriteIdentity(dir, "alice").code(), StatusCode::kAlreadyExists);
  auto identity = LoadIdentity(dir + "/alice.key");
  ASSERT_TRUE(identity.ok()) << identity.status();
  auto pub = LoadPublicKey(dir + "/alice.pub");
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(identity->public_key, *pub);
  // The CURVE key a server derives from the .pub is the one the client uses.
  auto curve = CurveKeysFor(*identity);
  ASSERT_TRUE(curve.ok());
  EXPECT_EQ(Z85(*CurvePublicFor(*pub)), curve->public_z85);
  std::filesystem::create_directories(dir + "/allow");
  std::filesystem::copy_file(dir + "/alice.pub", dir + "/allow/alice.pub");
  auto allow = LoadAllowlist(dir + "/allow");
  ASSERT_EQ(allow->size(), 1u);
  EXPECT_EQ((*allow)[0].name, "alice");
  chmod((dir + "/alice.key").c_str(), 0644);
  auto loose = LoadIdentity(dir + "/alice.key");
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.status().message().find("chmod 600"), std::string::npos);
  // A .pub given as an identity: the message points at the .key beside it.
  auto pub_as_identity = LoadIdentity(dir + "/alice.pub");
  ASSERT_FALSE(pub_as_identity.ok());
  EXPECT_NE(pub_as_identity.status().message().find("this is a public key"), std::string::npos);
  EXPECT_NE(pub_as_identity.status().message().find("alice.key"), std::string::npos);
  EXPECT_EQ(pub_as_identity.status().message().find("chmod"), std::string::npos);
  EXPECT_EQ(Hex(std::vector<uint8_t>{0x0a, 0xff}), "0aff");
  std::ofstream(dir + "/allow/bad.pub") << "cohort-ed25519-public 12ab\n";
  auto bad = LoadAllowlist(dir + "/allow");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.pub"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// FIPS 180-2's test vector, from memory and from a file; a missing file
// is named.
TEST(DigestTest, Sha256OfBytesAndOfAFile) {
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_EQ(Sha256Hex("abc"), abc);
  const std::string path =
      std::filesystem::temp_directory_path() / ("cohort_digest_" + std::to_string(::getpid()));
  std::ofstream(path) << "abc";
  auto file = FileSha256Hex(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file, abc);
  std::filesystem::remove(path);
  auto missing = FileSha256Hex(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace cohort::crypto
