#include "store/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace cohort::store {
namespace {

// What the holder wrote: "pid N (ROLE)", or "" when it cannot be read.
std::string ReadHolder(int fd) {
  char buffer[256] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  if (n <= 0) return "";
  std::string text(buffer, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace

StatusOr<std::unique_ptr<RunDirLock>> RunDirLock::Acquire(const std::string& run_dir,
                                                          const std::string& role) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return UnavailableError(run_dir + ": cannot create run directory: " + ec.message());
  const std::string path = run_dir + "/LOCK";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    return UnavailableError(path + ": cannot open the run directory's lock: " + why);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = ReadHolder(fd);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      return UnavailableError(path + ": cannot lock the run directory: " + std::strerror(err));
    }
    return FailedPreconditionError(
        run_dir + " is in use by " + (holder.empty() ? "another process" : holder) +
        ": one process at a time may hold a run directory; stop that one, or use another "
        "--run-dir");
  }
  const std::string text = "pid " + std::to_string(::getpid()) + " (" + role + ")\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return UnavailableError(path + ": cannot write the lock's holder: " + why);
  }
  return std::unique_ptr<RunDirLock>(new RunDirLock(fd));
}

RunDirLock::~RunDirLock() { ::close(fd_); }

}  // namespace cohort::store
