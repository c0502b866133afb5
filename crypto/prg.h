// The mask generator: AES-256 in counter mode under a 32-byte key with a
// zero IV, so keystream block i is AES_key(i as a 128-bit big-endian
// integer); the keystream is read as little-endian uint32 words and added to
// or subtracted from a vector mod 2^32. This is the PRG of Google's
// production secure aggregation (fcp/secagg AesCtrPrng); it replaced ChaCha20
// here because it is 4-6x faster on CPUs with AES instructions, and mask
// expansion is most of a secure round's cost (docs/architecture.md).
//
// Two implementations give the same stream: a VAES/AVX2 kernel of our own
// (16 blocks in flight, the keystream added straight from registers) and
// OpenSSL's EVP AES-256-CTR (AES-NI, or its constant-time vector-permute AES
// on CPUs without AES instructions).
#ifndef COHORT_CRYPTO_PRG_H_
#define COHORT_CRYPTO_PRG_H_

#include <cstdint>
#include <span>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

enum class PrgImpl { kAuto, kVaes, kOpenSsl };

// What kAuto runs on this CPU: kVaes where it has VAES, AVX2 and AES-NI.
PrgImpl BestPrgImpl();
const char* PrgImplName(PrgImpl impl);

// acc[i] += sign * PRG(key)[i] (mod 2^32), sign = +1 or -1. `key` is 32
// bytes. Streams in blocks, so memory stays constant whatever acc's size.
// kVaes on a CPU without it is an error.
[[nodiscard]] Status AddMask(const SecretBytes& key, std::span<uint32_t> acc, bool subtract,
                             PrgImpl impl = PrgImpl::kAuto);

struct MaskJob {
  const SecretBytes* key;  // 32 bytes.
  bool subtract;
};

// Applies every job to `acc`, splitting the vector (not the jobs) over
// `threads` threads (0: one per core) in block-aligned slices, so each
// thread streams every key over its own slice. Same result as calling
// AddMask for each job in turn.
[[nodiscard]] Status AddMasks(std::span<const MaskJob> jobs, std::span<uint32_t> acc,
                              unsigned threads = 0, PrgImpl impl = PrgImpl::kAuto);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_PRG_H_
