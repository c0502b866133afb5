#include "crypto/prg.h"

#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/parallel.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define COHORT_HAVE_VAES_KERNEL 1
#endif

namespace cohort::crypto {

namespace {

constexpr size_t kKeyBytes = 32;
constexpr size_t kWordsPerBlock = 4;  // One 16-byte AES block.

// ---- VAES/AVX2 kernel ------------------------------------------------------
#if COHORT_HAVE_VAES_KERNEL

// An AES key schedule (15 round keys for AES-256, the first 11 for
// AES-128), each round key held twice (both 128-bit lanes of a ymm
// register). Wiped by its owner; read with unaligned loads, so it may live
// anywhere (a SecretBytes).
struct RoundKeys {
  uint8_t k[15][32];
};

#define COHORT_AES_TARGET __attribute__((target("aes,sse4.1")))
#define COHORT_VAES_TARGET __attribute__((target("vaes,avx2,aes,sse4.1")))

COHORT_AES_TARGET __m128i ExpandStep1(__m128i a, __m128i assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  a = _mm_xor_si128(a, _mm_slli_si128(a, 4));
  a = _mm_xor_si128(a, _mm_slli_si128(a, 4));
  a = _mm_xor_si128(a, _mm_slli_si128(a, 4));
  return _mm_xor_si128(a, assist);
}

COHORT_AES_TARGET __m128i ExpandStep2(__m128i a, __m128i b) {
  const __m128i assist = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(a, 0), 0xaa);
  b = _mm_xor_si128(b, _mm_slli_si128(b, 4));
  b = _mm_xor_si128(b, _mm_slli_si128(b, 4));
  b = _mm_xor_si128(b, _mm_slli_si128(b, 4));
  return _mm_xor_si128(b, assist);
}

// Both lanes of each round key from rk[0..rounds].
COHORT_AES_TARGET void StoreRoundKeys(__m128i* rk, int rounds, RoundKeys& out) {
  for (int i = 0; i <= rounds; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.k[i]), rk[i]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.k[i] + 16), rk[i]);
  }
  sodium_memzero(rk, sizeof(__m128i) * (rounds + 1));
}

// AES-256: the 32-byte key.
COHORT_AES_TARGET void ExpandKey256(const uint8_t* key, RoundKeys& out) {
  __m128i rk[15];
  __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 16));
  rk[0] = a;
  rk[1] = b;
  // aeskeygenassist takes its round constant as an immediate.
#define COHORT_EXPAND(i, rcon)                            \
  a = ExpandStep1(a, _mm_aeskeygenassist_si128(b, rcon)); \
  rk[i] = a;                                              \
  if (i < 14) {                                           \
    b = ExpandStep2(a, b);                                \
    rk[i + 1] = b;                                        \
  }
  COHORT_EXPAND(2, 0x01)
  COHORT_EXPAND(4, 0x02)
  COHORT_EXPAND(6, 0x04)
  COHORT_EXPAND(8, 0x08)
  COHORT_EXPAND(10, 0x10)
  COHORT_EXPAND(12, 0x20)
  COHORT_EXPAND(14, 0x40)
#undef COHORT_EXPAND
  StoreRoundKeys(rk, 14, out);
}

// AES-128: the first 16 bytes of the 32-byte key.
COHORT_AES_TARGET void ExpandKey128(const uint8_t* key, RoundKeys& out) {
  __m128i rk[11];
  rk[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
#define COHORT_EXPAND(i, rcon) \
  rk[i] = ExpandStep1(rk[i - 1], _mm_aeskeygenassist_si128(rk[i - 1], rcon));
  COHORT_EXPAND(1, 0x01)
  COHORT_EXPAND(2, 0x02)
  COHORT_EXPAND(3, 0x04)
  COHORT_EXPAND(4, 0x08)
  COHORT_EXPAND(5, 0x10)
  COHORT_EXPAND(6, 0x20)
  COHORT_EXPAND(7, 0x40)
  COHORT_EXPAND(8, 0x80)
  COHORT_EXPAND(9, 0x1b)
  COHORT_EXPAND(10, 0x36)
#undef COHORT_EXPAND
  StoreRoundKeys(rk, 10, out);
}

COHORT_AES_TARGET __m128i RoundKey128(const RoundKeys& rk, int r) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rk.k[r]));
}

COHORT_VAES_TARGET __m256i RoundKey256(const RoundKeys& rk, int r) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rk.k[r]));
}

// One keystream block (counter `block`) into `out`; kRounds is 14 (AES-256)
// or 10 (AES-128).
template <int kRounds>
COHORT_AES_TARGET void EncryptCounter(const RoundKeys& rk, uint64_t block, uint8_t out[16]) {
  const __m128i bswap = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m128i x = _mm_xor_si128(_mm_shuffle_epi8(_mm_set_epi64x(0, static_cast<int64_t>(block)), bswap),
                            RoundKey128(rk, 0));
  for (int r = 1; r < kRounds; ++r) x = _mm_aesenc_si128(x, RoundKey128(rk, r));
  x = _mm_aesenclast_si128(x, RoundKey128(rk, kRounds));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), x);
}

// acc[w..words) +-= the keystream, a block at a time (the kernels' tail);
// the last block may be partial. acc[0] is stream word 4 * first_block.
template <int kRounds, bool kSubtract>
COHORT_AES_TARGET void AddTailBlocks(const RoundKeys& rk, uint64_t first_block, uint32_t* acc,
                                     size_t w, size_t words) {
  uint64_t block = first_block + w / kWordsPerBlock;
  alignas(16) uint32_t stream[kWordsPerBlock];
  for (; w < words; w += kWordsPerBlock, ++block) {
    EncryptCounter<kRounds>(rk, block, reinterpret_cast<uint8_t*>(stream));
    const size_t n = std::min(kWordsPerBlock, words - w);
    for (size_t i = 0; i < n; ++i) {
      acc[w + i] = kSubtract ? acc[w + i] - stream[i] : acc[w + i] + stream[i];
    }
  }
  sodium_memzero(stream, sizeof(stream));
}

// acc[w] +-= keystream word (4 * first_block + w), w < words.
template <int kRounds, bool kSubtract>
COHORT_VAES_TARGET void CtrAddVaes(const RoundKeys& rk, uint64_t first_block, uint32_t* acc,
                                   size_t words) {
  constexpr int kLanes = 8;  // ymm registers in flight: 16 blocks, 64 words.
  const __m256i bswap = _mm256_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15,
                                         14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  // Counters as 64-bit integers in the low half of each 128-bit lane; the
  // byte swap makes them the big-endian 128-bit counter block.
  const auto b0 = static_cast<int64_t>(first_block);
  __m256i counter = _mm256_setr_epi64x(b0, 0, b0 + 1, 0);
  const __m256i two = _mm256_setr_epi64x(2, 0, 2, 0);
  size_t w = 0;
  for (; w + kLanes * 8 <= words; w += kLanes * 8) {
    __m256i x[kLanes];
    const __m256i k0 = RoundKey256(rk, 0);
#pragma GCC unroll 8
    for (int j = 0; j < kLanes; ++j) {
      x[j] = _mm256_xor_si256(_mm256_shuffle_epi8(counter, bswap), k0);
      counter = _mm256_add_epi64(counter, two);
    }
#pragma GCC unroll 13
    for (int r = 1; r < kRounds; ++r) {
      const __m256i kr = RoundKey256(rk, r);
#pragma GCC unroll 8
      for (int j = 0; j < kLanes; ++j) x[j] = _mm256_aesenc_epi128(x[j], kr);
    }
    const __m256i klast = RoundKey256(rk, kRounds);
#pragma GCC unroll 8
    for (int j = 0; j < kLanes; ++j) {
      x[j] = _mm256_aesenclast_epi128(x[j], klast);
      auto* p = reinterpret_cast<__m256i*>(acc + w + 8 * j);
      const __m256i v = _mm256_loadu_si256(p);
      _mm256_storeu_si256(p, kSubtract ? _mm256_sub_epi32(v, x[j]) : _mm256_add_epi32(v, x[j]));
    }
  }
  AddTailBlocks<kRounds, kSubtract>(rk, first_block, acc, w, words);
}

// The same with 128-bit AES-NI: 8 blocks (32 words) in flight.
template <int kRounds, bool kSubtract>
COHORT_AES_TARGET void CtrAddAesNi(const RoundKeys& rk, uint64_t first_block, uint32_t* acc,
                                   size_t words) {
  constexpr int kLanes = 8;
  const __m128i bswap = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m128i counter = _mm_set_epi64x(0, static_cast<int64_t>(first_block));
  const __m128i one = _mm_set_epi64x(0, 1);
  size_t w = 0;
  for (; w + kLanes * 4 <= words; w += kLanes * 4) {
    __m128i x[kLanes];
    const __m128i k0 = RoundKey128(rk, 0);
#pragma GCC unroll 8
    for (int j = 0; j < kLanes; ++j) {
      x[j] = _mm_xor_si128(_mm_shuffle_epi8(counter, bswap), k0);
      counter = _mm_add_epi64(counter, one);
    }
#pragma GCC unroll 13
    for (int r = 1; r < kRounds; ++r) {
      const __m128i kr = RoundKey128(rk, r);
#pragma GCC unroll 8
      for (int j = 0; j < kLanes; ++j) x[j] = _mm_aesenc_si128(x[j], kr);
    }
    const __m128i klast = RoundKey128(rk, kRounds);
#pragma GCC unroll 8
    for (int j = 0; j < kLanes; ++j) {
      x[j] = _mm_aesenclast_si128(x[j], klast);
      auto* p = reinterpret_cast<__m128i*>(acc + w + 4 * j);
      const __m128i v = _mm_loadu_si128(p);
      _mm_storeu_si128(p, kSubtract ? _mm_sub_epi32(v, x[j]) : _mm_add_epi32(v, x[j]));
    }
  }
  AddTailBlocks<kRounds, kSubtract>(rk, first_block, acc, w, words);
}

// The kernel for one job: 256-bit (VAES) or 128-bit (AES-NI), adding or
// subtracting.
using CtrAddFn = void (*)(const RoundKeys&, uint64_t, uint32_t*, size_t);
template <int kRounds>
CtrAddFn PickKernel(bool vaes, bool subtract) {
  if (vaes) return subtract ? &CtrAddVaes<kRounds, true> : &CtrAddVaes<kRounds, false>;
  return subtract ? &CtrAddAesNi<kRounds, true> : &CtrAddAesNi<kRounds, false>;
}

// Every job over `acc` (stream words from 4 * first_block on), tile by tile:
// each 8 KiB tile of acc stays in L1 while all the keys stream over it.
// `vaes`: the 256-bit kernel, else the 128-bit AES-NI one; `aes128`: 10
// rounds under the key's first 16 bytes, else AES-256.
Status AddMasksAesKernel(std::span<const MaskJob> jobs, std::span<uint32_t> acc,
                         uint64_t first_block, bool vaes, bool aes128) {
  SecretBytes schedule(jobs.size() * sizeof(RoundKeys));
  auto* rk = reinterpret_cast<RoundKeys*>(schedule.bytes().data());
  std::vector<CtrAddFn> kernels(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const uint8_t* key = jobs[j].key->bytes().data();
    aes128 ? ExpandKey128(key, rk[j]) : ExpandKey256(key, rk[j]);
    kernels[j] =
        aes128 ? PickKernel<10>(vaes, jobs[j].subtract) : PickKernel<14>(vaes, jobs[j].subtract);
  }
  constexpr size_t kTile = 2048;  // Words; a multiple of the kernels' 64.
  for (size_t w = 0; w < acc.size(); w += kTile) {
    const size_t n = std::min(kTile, acc.size() - w);
    const uint64_t block = first_block + w / kWordsPerBlock;
    for (size_t j = 0; j < jobs.size(); ++j) kernels[j](rk[j], block, acc.data() + w, n);
  }
  return OkStatus();  // `schedule` wipes the round keys.
}

#endif  // COHORT_HAVE_VAES_KERNEL

// acc[i] +-= stream[i] for i < n.
void AddStream(const uint32_t* stream, uint32_t* acc, size_t n, bool subtract) {
  if (subtract) {
    for (size_t i = 0; i < n; ++i) acc[i] -= stream[i];
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += stream[i];
  }
}

// ---- OpenSSL ---------------------------------------------------------------

// AES-128-CTR (`aes128`, under the key's first 16 bytes) or AES-256-CTR.
Status AddMaskOpenSsl(const SecretBytes& key, std::span<uint32_t> acc, uint64_t first_block,
                      bool subtract, bool aes128) {
  std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(),
                                                                      &EVP_CIPHER_CTX_free);
  if (!ctx) return InternalError("mask PRG: EVP_CIPHER_CTX_new failed");
  uint8_t iv[16] = {};
  for (int i = 0; i < 8; ++i) iv[15 - i] = static_cast<uint8_t>(first_block >> (8 * i));
  const EVP_CIPHER* cipher = aes128 ? EVP_aes_128_ctr() : EVP_aes_256_ctr();
  if (EVP_EncryptInit_ex(ctx.get(), cipher, nullptr, key.bytes().data(), iv) != 1) {
    return InternalError("mask PRG: AES-CTR init failed");
  }
  constexpr size_t kWords = 4096;  // 16 KiB.
  static const uint8_t kZeros[kWords * sizeof(uint32_t)] = {};
  alignas(64) uint32_t stream[kWords];
  Status status = OkStatus();
  for (size_t begin = 0; begin < acc.size(); begin += kWords) {
    const size_t n = std::min(kWords, acc.size() - begin);
    const int bytes = static_cast<int>(n * sizeof(uint32_t));
    int written = 0;
    if (EVP_EncryptUpdate(ctx.get(), reinterpret_cast<uint8_t*>(stream), &written, kZeros, bytes) !=
            1 ||
        written != bytes) {
      status = InternalError("mask PRG: AES-CTR failed");
      break;
    }
    AddStream(stream, acc.data() + begin, n, subtract);
  }
  sodium_memzero(stream, sizeof(stream));
  return status;  // EVP_CIPHER_CTX_free cleanses the key schedule.
}

// ---- ChaCha20 (libsodium) ---------------------------------------------------

// acc covers stream words [16 * first_chacha_block, ...).
Status AddMaskChaCha20(const SecretBytes& key, std::span<uint32_t> acc, uint64_t first_chacha_block,
                       bool subtract) {
  static const uint8_t kNonce[crypto_stream_chacha20_NONCEBYTES] = {};
  constexpr size_t kWords = 4096;  // 16 KiB: a multiple of the 64-byte block.
  alignas(64) uint32_t stream[kWords];
  Status status = OkStatus();
  for (size_t begin = 0; begin < acc.size(); begin += kWords) {
    const size_t n = std::min(kWords, acc.size() - begin);
    std::memset(stream, 0, n * sizeof(uint32_t));
    if (crypto_stream_chacha20_xor_ic(reinterpret_cast<uint8_t*>(stream),
                                      reinterpret_cast<const uint8_t*>(stream),
                                      n * sizeof(uint32_t), kNonce, first_chacha_block + begin / 16,
                                      key.bytes().data()) != 0) {
      status = InternalError("mask PRG: chacha20 failed");
      break;
    }
    AddStream(stream, acc.data() + begin, n, subtract);
  }
  sodium_memzero(stream, sizeof(stream));
  return status;
}

// acc covers stream words [4 * first_block, 4 * first_block + acc.size()).
Status AddMasksAt(std::span<const MaskJob> jobs, std::span<uint32_t> acc, uint64_t first_block,
                  PrgImpl impl, MaskPrg prg) {
  for (const MaskJob& j : jobs) {
    if (j.key == nullptr || j.key->size() != kKeyBytes) {
      return InvalidArgumentError("mask key must have 32 bytes");
    }
  }
  if (prg == MaskPrg::kChaCha20) {
    // Slices start on 64-word boundaries, so first_block is a multiple of 4.
    for (const MaskJob& j : jobs) {
      COHORT_RETURN_IF_ERROR(AddMaskChaCha20(*j.key, acc, first_block / 4, j.subtract));
    }
    return OkStatus();
  }
  if (prg != MaskPrg::kAes256Ctr && prg != MaskPrg::kAes128Ctr) {
    return InvalidArgumentError("unknown mask PRG");
  }
  const bool aes128 = prg == MaskPrg::kAes128Ctr;
  switch (impl == PrgImpl::kAuto ? BestPrgImpl() : impl) {
    case PrgImpl::kVaes:
      if (BestPrgImpl() != PrgImpl::kVaes) {
        return FailedPreconditionError("mask PRG: this CPU has no VAES/AVX2");
      }
#if COHORT_HAVE_VAES_KERNEL
      return AddMasksAesKernel(jobs, acc, first_block, /*vaes=*/true, aes128);
#endif
    case PrgImpl::kAesNi:
      if (BestPrgImpl() == PrgImpl::kOpenSsl) {
        return FailedPreconditionError("mask PRG: this CPU has no AES-NI/SSE4.1");
      }
#if COHORT_HAVE_VAES_KERNEL
      return AddMasksAesKernel(jobs, acc, first_block, /*vaes=*/false, aes128);
#endif
    default:
      for (const MaskJob& j : jobs) {
        COHORT_RETURN_IF_ERROR(AddMaskOpenSsl(*j.key, acc, first_block, j.subtract, aes128));
      }
      return OkStatus();
  }
}

}  // namespace

PrgImpl BestPrgImpl() {
#if !COHORT_HAVE_VAES_KERNEL
  return PrgImpl::kOpenSsl;
#else
  static const PrgImpl best = [] {
    __builtin_cpu_init();
    // VAES is CPUID leaf 7, ECX bit 9. Read it directly: clang 14 does not
    // know the "vaes" feature string of __builtin_cpu_supports.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool has_vaes = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 9));
    const bool vaes = has_vaes && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("aes") &&
                      __builtin_cpu_supports("sse4.1");
    const bool aesni = __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
    return vaes ? PrgImpl::kVaes : aesni ? PrgImpl::kAesNi : PrgImpl::kOpenSsl;
  }();
  return best;
#endif
}

const char* PrgImplName(PrgImpl impl) {
  switch (impl == PrgImpl::kAuto ? BestPrgImpl() : impl) {
    case PrgImpl::kVaes:
      return "aes-ctr (vaes)";
    case PrgImpl::kAesNi:
      return "aes-ctr (aes-ni)";
    default:
      return "aes-ctr (openssl)";
  }
}

const char* MaskPrgName(MaskPrg prg) {
  switch (prg) {
    case MaskPrg::kAes128Ctr:
      return "aes128-ctr";
    case MaskPrg::kChaCha20:
      return "chacha20";
    default:
      return "aes256-ctr";
  }
}

Status AddMask(const SecretBytes& key, std::span<uint32_t> acc, bool subtract, PrgImpl impl,
               MaskPrg prg) {
  const MaskJob job{&key, subtract};
  return AddMasksAt({&job, 1}, acc, 0, impl, prg);
}

Status AddMasks(std::span<const MaskJob> jobs, std::span<uint32_t> acc, unsigned threads,
                PrgImpl impl, MaskPrg prg, Env* env) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // Small vectors: threads cost more than they save.
  if (acc.size() < 16384 || threads == 1 || jobs.size() < 2) {
    return AddMasksAt(jobs, acc, 0, impl, prg);
  }
  // Slices of whole 16-block groups, so the kernel's fast loop covers them.
  constexpr size_t kAlign = 64;
  const size_t per = (acc.size() / threads + kAlign - 1) / kAlign * kAlign;
  // One slice per thread; each streams every key over its own slice.
  auto slice = [&](size_t t) -> Status {
    const size_t lo = std::min(acc.size(), t * per);
    const size_t hi = std::min(acc.size(), lo + per);
    return AddMasksAt(jobs, acc.subspan(lo, hi - lo), lo / kWordsPerBlock, impl, prg);
  };
  if (env != nullptr) return env->ParallelFor(threads, slice);
  return ParallelFor(threads, slice, threads, /*min_per_thread=*/1);
}

}  // namespace cohort::crypto
