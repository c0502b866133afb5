// SecretBytes: the only home of keys, seeds and shares. Move-only; the bytes
// are wiped with sodium_memzero when the object dies or is reset. Secrets of
// kGuardedBytes or more live in sodium_malloc'd memory (guard pages, mlock);
// smaller ones (keys, seeds, Shamir shares) on the ordinary heap, because a
// guarded allocation costs an mmap, an mprotect and an mlock, and secure
// aggregation makes O(n k) shares per round.
#ifndef COHORT_COMMON_SECRET_BYTES_H_
#define COHORT_COMMON_SECRET_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace cohort {

class SecretBytes {
 public:
  static constexpr size_t kGuardedBytes = 4096;

  SecretBytes() = default;
  // Allocates `size` zeroed bytes. Aborts if libsodium cannot allocate.
  explicit SecretBytes(size_t size);
  ~SecretBytes();
  SecretBytes(SecretBytes&& other) noexcept;
  SecretBytes& operator=(SecretBytes&& other) noexcept;
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<uint8_t> bytes() { return {data_, size_}; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // Wipes and frees now.
  void Reset();

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cohort

#endif  // COHORT_COMMON_SECRET_BYTES_H_
