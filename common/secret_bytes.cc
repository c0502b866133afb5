#include "common/secret_bytes.h"

#include <sodium.h>

#include <utility>

#include "common/check.h"

namespace cohort {

SecretBytes::SecretBytes(size_t size) : size_(size) {
  COHORT_CHECK(sodium_init() >= 0);
  if (size == 0) return;
  data_ = size >= kGuardedBytes ? static_cast<uint8_t*>(sodium_malloc(size)) : new uint8_t[size];
  COHORT_CHECK(data_ != nullptr);
  sodium_memzero(data_, size);
}

SecretBytes::~SecretBytes() { Reset(); }

SecretBytes::SecretBytes(SecretBytes&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SecretBytes& SecretBytes::operator=(SecretBytes&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SecretBytes::Reset() {
  if (data_ != nullptr) {
    if (size_ >= kGuardedBytes) {
      sodium_free(data_);  // Wipes the region before unmapping it.
    } else {
      sodium_memzero(data_, size_);
      delete[] data_;
    }
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace cohort
