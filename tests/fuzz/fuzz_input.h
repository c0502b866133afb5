// Helpers shared by the fuzz harnesses: a reader that turns the fuzzer's
// bytes into choices, and the check that reports a broken invariant.
//
// Every harness defines LLVMFuzzerTestOneInput. Built with clang and
// -fsanitize=fuzzer (meson option `fuzzing`), it is a libFuzzer binary; in
// the ordinary build it is linked with replay_main.cc and replays its
// committed corpus (tests/fuzz/corpus/<name>/) as a test.
#ifndef COHORT_TESTS_FUZZ_FUZZ_INPUT_H_
#define COHORT_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

// Aborts (a crash, to libFuzzer) when an invariant the harness checks does
// not hold. `what` is anything a std::string can be built from.
#define FUZZ_CHECK(cond, what)                                                                   \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                   \
      std::abort();                                                                              \
    }                                                                                            \
  } while (0)

// Defines libFuzzer's entry point as a call of `run(FuzzInput&)` (a function
// in cohort::fuzz) on the whole input.
#define COHORT_FUZZ_ENTRY_POINT(run)                                        \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    cohort::fuzz::FuzzInput in(data, size);                                 \
    cohort::fuzz::run(in);                                                  \
    return 0;                                                               \
  }

namespace cohort::fuzz {

// Consumes the input front to back. Reads past the end give zeros, so every
// input is a valid program of choices.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return size_ - pos_; }

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool Bool() { return (Byte() & 1) != 0; }
  uint16_t U16() { return static_cast<uint16_t>(Byte() | (Byte() << 8)); }
  uint32_t U32() { return uint32_t{U16()} | (uint32_t{U16()} << 16); }
  // A value in [0, n) (n >= 1): one byte when n <= 256, else four.
  uint32_t Below(uint32_t n) { return (n <= 256 ? Byte() : U32()) % n; }

  // Up to `n` bytes (fewer at the end of the input).
  std::string Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  // A 16-bit little-endian length, then that many bytes.
  std::string LengthPrefixed() { return Bytes(U16()); }
  // Everything left.
  std::span<const uint8_t> Rest() {
    std::span<const uint8_t> out(data_ + pos_, remaining());
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace cohort::fuzz

#endif  // COHORT_TESTS_FUZZ_FUZZ_INPUT_H_
