// A scratch file for harnesses whose code under test reads a path: the
// input is written to it before each run. One per harness process, removed
// when the process exits normally (libFuzzer ends with _Exit, which skips
// that: bench/fuzz_run.sh gives each run a $TMPDIR of its own and drops it).
#ifndef COHORT_TESTS_FUZZ_TEMP_FILE_H_
#define COHORT_TESTS_FUZZ_TEMP_FILE_H_

#include <cstdint>
#include <span>
#include <string>

namespace cohort::fuzz {

class TempFile {
 public:
  // Creates an empty file in $TMPDIR (else /dev/shm, else /tmp) whose name
  // ends with `suffix`.
  // Aborts when it cannot: without it the harness cannot run.
  explicit TempFile(const std::string& suffix);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return path_; }
  // Replaces the file's contents with `bytes`; aborts on a write error.
  void Write(std::span<const uint8_t> bytes);
  void Write(const std::string& bytes) {
    Write({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace cohort::fuzz

#endif  // COHORT_TESTS_FUZZ_TEMP_FILE_H_
