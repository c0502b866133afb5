#include "crypto/prg.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "common/parallel.h"

namespace cohort::crypto {

namespace {

// acc covers stream words [offset, offset + acc.size()); offset is a multiple
// of 16 words (one 64-byte ChaCha20 block).
Status AddMaskAt(const SecretBytes& key, std::span<uint32_t> acc, size_t offset, bool subtract) {
  if (key.size() != crypto_stream_chacha20_KEYBYTES) {
    return InvalidArgumentError("mask key must have 32 bytes");
  }
  // Fresh keys every round, so a fixed zero nonce never repeats under a key.
  static const uint8_t kNonce[crypto_stream_chacha20_NONCEBYTES] = {};
  constexpr size_t kWords = 4096;  // 16 KiB: a multiple of the 64-byte block.
  alignas(64) uint32_t block[kWords];
  for (size_t begin = 0; begin < acc.size(); begin += kWords) {
    const size_t n = std::min(kWords, acc.size() - begin);
    const uint64_t counter = (offset + begin) * sizeof(uint32_t) / 64;
    std::memset(block, 0, n * sizeof(uint32_t));
    if (crypto_stream_chacha20_xor_ic(reinterpret_cast<uint8_t*>(block),
                                      reinterpret_cast<const uint8_t*>(block), n * sizeof(uint32_t),
                                      kNonce, counter, key.bytes().data()) != 0) {
      return InternalError("chacha20 failed");
    }
    uint32_t* a = acc.data() + begin;
    if (subtract) {
      for (size_t i = 0; i < n; ++i) a[i] -= block[i];
    } else {
      for (size_t i = 0; i < n; ++i) a[i] += block[i];
    }
  }
  sodium_memzero(block, sizeof(block));
  return OkStatus();
}

}  // namespace

Status AddMask(const SecretBytes& key, std::span<uint32_t> acc, bool subtract) {
  return AddMaskAt(key, acc, 0, subtract);
}

Status AddMasks(std::span<const MaskJob> jobs, std::span<uint32_t> acc, unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // Small vectors: threads cost more than they save.
  if (acc.size() < 16384 || threads == 1 || jobs.size() < 2) {
    for (const MaskJob& j : jobs) COHORT_RETURN_IF_ERROR(AddMaskAt(*j.key, acc, 0, j.subtract));
    return OkStatus();
  }
  const size_t per = (acc.size() / threads + 15) / 16 * 16;
  // One slice per thread; each streams every key over its own slice.
  return ParallelFor(
      threads,
      [&](size_t t) -> Status {
        const size_t lo = std::min(acc.size(), t * per);
        const size_t hi = std::min(acc.size(), lo + per);
        for (const MaskJob& j : jobs) {
          COHORT_RETURN_IF_ERROR(AddMaskAt(*j.key, acc.subspan(lo, hi - lo), lo, j.subtract));
        }
        return OkStatus();
      },
      threads, /*min_per_thread=*/1);
}

}  // namespace cohort::crypto
