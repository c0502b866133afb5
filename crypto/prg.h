// The mask generator: a keystream under a 32-byte key, read as
// little-endian uint32 words and added to or subtracted from a vector
// mod 2^32. Three algorithms (both parties of a session must use the same
// one; it is part of the session context):
//
// - AES-128-CTR (the default), zero IV, under the key's first 16 bytes:
//   keystream block i is AES_key(i as a 128-bit big-endian integer). The
//   mask keys come from X25519, so the masks are at the same ~128-bit level
//   as the key exchange, the signatures (Ed25519) and the share encryption
//   (ristretto255); TLS 1.3's mandatory suite pairs X25519 with AES-128 the
//   same way. 10 rounds against AES-256's 14: mask expansion is most of a
//   secure round's cost (docs/architecture.md).
// - AES-256-CTR, the same under the whole key: the PRG of Google's
//   production secure aggregation (fcp/secagg AesCtrPrng), for deployments
//   that want its exact choice.
//
//   Both AES variants have three implementations that give the same stream:
//   our VAES/AVX2 kernel (16 blocks in flight, the keystream added straight
//   from registers), our 128-bit AES-NI kernel (8 blocks) for CPUs without
//   VAES, and OpenSSL's EVP AES-CTR (its constant-time vector-permute AES on
//   CPUs without AES instructions). 4-8x faster than ChaCha20 on CPUs with
//   AES instructions.
// - ChaCha20 (libsodium crypto_stream_chacha20, zero nonce): the faster one
//   on CPUs without AES instructions.
#ifndef COHORT_CRYPTO_PRG_H_
#define COHORT_CRYPTO_PRG_H_

#include <cstdint>
#include <span>

#include "common/env.h"
#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

enum class MaskPrg : uint8_t { kAes256Ctr = 0, kChaCha20 = 1, kAes128Ctr = 2 };
const char* MaskPrgName(MaskPrg prg);

// The implementation of AES-CTR (ChaCha20 has one: libsodium's).
enum class PrgImpl { kAuto, kVaes, kAesNi, kOpenSsl };

// What kAuto runs on this CPU: kVaes where it has VAES, AVX2 and AES-NI;
// else kAesNi (our 128-bit kernel) where it has AES-NI; else OpenSSL.
PrgImpl BestPrgImpl();
const char* PrgImplName(PrgImpl impl);

// acc[i] += sign * PRG(key)[i] (mod 2^32), sign = +1 or -1. `key` is 32
// bytes. Streams in blocks, so memory stays constant whatever acc's size.
// kVaes on a CPU without it is an error.
[[nodiscard]] Status AddMask(const SecretBytes& key, std::span<uint32_t> acc, bool subtract,
                             PrgImpl impl = PrgImpl::kAuto, MaskPrg prg = MaskPrg::kAes128Ctr);

struct MaskJob {
  const SecretBytes* key;  // 32 bytes.
  bool subtract;
};

// Applies every job to `acc`, splitting the vector (not the jobs) into
// `threads` block-aligned slices (0: one per core) run by `env`'s parallel
// loop (null: the process's thread pool), so each thread streams every key
// over its own slice. Same result as calling AddMask for each job in turn.
[[nodiscard]] Status AddMasks(std::span<const MaskJob> jobs, std::span<uint32_t> acc,
                              unsigned threads = 0, PrgImpl impl = PrgImpl::kAuto,
                              MaskPrg prg = MaskPrg::kAes128Ctr, Env* env = nullptr);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_PRG_H_
