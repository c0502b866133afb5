#include "crypto/prg.h"

#include <sodium.h>

#include <cstring>

namespace cohort::crypto {

Status AddMask(const SecretBytes& key, std::span<uint32_t> acc, bool subtract) {
  if (key.size() != crypto_stream_chacha20_KEYBYTES) {
    return InvalidArgumentError("mask key must have 32 bytes");
  }
  // Fresh keys every round, so a fixed zero nonce never repeats under a key.
  static const uint8_t kNonce[crypto_stream_chacha20_NONCEBYTES] = {};
  constexpr size_t kWords = 4096;  // 16 KiB: a multiple of the 64-byte block.
  alignas(64) uint32_t block[kWords];
  for (size_t begin = 0; begin < acc.size(); begin += kWords) {
    const size_t n = std::min(kWords, acc.size() - begin);
    const uint64_t counter = begin * sizeof(uint32_t) / 64;
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

}  // namespace cohort::crypto
