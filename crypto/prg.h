// The mask generator: a ChaCha20 keystream read as little-endian uint32
// words, added to or subtracted from a vector mod 2^32.
#ifndef COHORT_CRYPTO_PRG_H_
#define COHORT_CRYPTO_PRG_H_

#include <cstdint>
#include <span>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

// acc[i] += sign * PRG(key)[i] (mod 2^32), sign = +1 or -1. `key` is 32
// bytes. Streams in blocks, so memory stays constant whatever acc's size.
[[nodiscard]] Status AddMask(const SecretBytes& key, std::span<uint32_t> acc, bool subtract);

struct MaskJob {
  const SecretBytes* key;  // 32 bytes.
  bool subtract;
};

// Applies every job to `acc`, splitting the vector (not the jobs) over
// `threads` threads (0: one per core) in block-aligned slices, so each
// thread streams every key over its own slice. Same result as calling
// AddMask for each job in turn.
[[nodiscard]] Status AddMasks(std::span<const MaskJob> jobs, std::span<uint32_t> acc,
                              unsigned threads = 0);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_PRG_H_
