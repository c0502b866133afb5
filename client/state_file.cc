#include "client/state_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace cohort::client {
namespace {

Status WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return UnavailableError(std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

Status ReplaceFileDurably(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return UnavailableError(tmp + ": cannot create: " + std::strerror(errno));
  Status written = WriteAll(fd, data);
  if (written.ok() && ::fsync(fd) != 0) written = UnavailableError(std::strerror(errno));
  ::close(fd);
  if (!written.ok()) {
    return UnavailableError(tmp + ": write failed: " + std::string(written.message()));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return UnavailableError(path + ": rename failed: " + std::strerror(errno));
  }
  // The rename itself is durable only once the directory is.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    const std::string why = std::strerror(errno);
    if (dir_fd >= 0) ::close(dir_fd);
    return UnavailableError(dir + ": cannot sync the directory after writing " + path + ": " + why);
  }
  ::close(dir_fd);
  return OkStatus();
}

}  // namespace cohort::client
