#include "tests/fuzz/temp_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cohort::fuzz {

namespace {

// $TMPDIR, else /dev/shm, else /tmp. A file rewritten by truncation costs a
// data flush on ext4 (auto_da_alloc) at every close: on a disk-backed /tmp
// that held the dataset harnesses to a few hundred runs a second.
std::string ScratchDir() {
  const char* dir = std::getenv("TMPDIR");
  if (dir != nullptr && *dir != '\0') return dir;
  if (access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return "/tmp";
}

}  // namespace

TempFile::TempFile(const std::string& suffix) {
  const std::string pattern = ScratchDir() + "/cohort-fuzz-XXXXXX" + suffix;
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = mkstemps(name.data(), static_cast<int>(suffix.size()));
  if (fd_ < 0) {
    std::fprintf(stderr, "cannot create %s: %s\n", pattern.c_str(), std::strerror(errno));
    std::abort();
  }
  path_ = name.data();
}

TempFile::~TempFile() {
  if (fd_ >= 0) close(fd_);
  unlink(path_.c_str());
}

void TempFile::Write(std::span<const uint8_t> bytes) {
  // Truncate and rewrite in place: the readers open the path afresh.
  bool ok = ftruncate(fd_, 0) == 0;
  size_t done = 0;
  while (ok && done < bytes.size()) {
    const ssize_t n =
        pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  if (!ok) {
    std::fprintf(stderr, "cannot write %s: %s\n", path_.c_str(), std::strerror(errno));
    std::abort();
  }
}

}  // namespace cohort::fuzz
