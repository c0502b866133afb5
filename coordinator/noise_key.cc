#include "coordinator/noise_key.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "crypto/keys.h"

namespace cohort::coordinator {
namespace {

constexpr char kTag[] = "cohort-dp-noise-key ";
constexpr size_t kTagBytes = sizeof(kTag) - 1;
constexpr size_t kKeyBytes = 32;
constexpr size_t kLineBytes = kTagBytes + 2 * kKeyBytes + 1;  // Tag, hex, '\n'.

// Closes on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status WriteNewKey(const std::string& path) {
  const SecretBytes key = crypto::RandomSecret(kKeyBytes);
  // The line is assembled in SecretBytes and written with write(2), so no
  // stream buffer is freed with the key in it.
  SecretBytes line(kLineBytes + 1);
  char* text = reinterpret_cast<char*>(line.bytes().data());
  std::memcpy(text, kTag, kTagBytes);
  sodium_bin2hex(text + kTagBytes, 2 * kKeyBytes + 1, key.bytes().data(), kKeyBytes);
  text[kLineBytes - 1] = '\n';
  Fd out{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
  if (out.fd < 0) {
    const std::string why = std::strerror(errno);
    return UnavailableError(path + ": cannot create the privacy noise key: " + why);
  }
  if (::write(out.fd, text, kLineBytes) != static_cast<ssize_t>(kLineBytes) ||
      ::fsync(out.fd) != 0) {
    const std::string why = std::strerror(errno);
    return UnavailableError(path + ": cannot write the privacy noise key: " + why);
  }
  return OkStatus();
}

}  // namespace

StatusOr<SecretBytes> LoadOrCreateNoiseKey(const std::string& path, bool create) {
  COHORT_RETURN_IF_ERROR(crypto::InitSodium());
  struct stat st = {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    if (!create) {
      return NotFoundError(path +
                           ": missing; the run's rounds were noised with this key, and resuming "
                           "without it cannot replay them bit for bit: restore the file");
    }
    COHORT_RETURN_IF_ERROR(WriteNewKey(path));
  }
  // O_NOFOLLOW: a link planted in the run directory (to another run's key,
  // or to a file the attacker can read) is refused, not followed.
  Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (in.fd < 0 && errno == ELOOP) {
    return FailedPreconditionError(path +
                                   ": is a symbolic link; the privacy noise key must be a "
                                   "regular file in the run directory");
  }
  if (in.fd < 0 || ::fstat(in.fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    return NotFoundError(path + ": cannot open the privacy noise key: " + why);
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + ": not a regular file");
  if (st.st_uid != ::geteuid()) {
    return FailedPreconditionError(path + ": the privacy noise key is owned by uid " +
                                   std::to_string(st.st_uid) + ", not by this user (uid " +
                                   std::to_string(::geteuid()) +
                                   "), who could then read or replace it");
  }
  if ((st.st_mode & 077) != 0) {
    return FailedPreconditionError(path +
                                   ": the privacy noise key is readable by group or others; "
                                   "chmod 600 it");
  }
  SecretBytes line(kLineBytes + 1);
  const ssize_t n = ::read(in.fd, line.bytes().data(), line.size());
  const char* text = reinterpret_cast<const char*>(line.bytes().data());
  SecretBytes key(kKeyBytes);
  size_t decoded = 0;
  if (n != static_cast<ssize_t>(kLineBytes) || std::memcmp(text, kTag, kTagBytes) != 0 ||
      text[kLineBytes - 1] != '\n' ||
      sodium_hex2bin(key.bytes().data(), kKeyBytes, text + kTagBytes, 2 * kKeyBytes, nullptr,
                     &decoded, nullptr) != 0 ||
      decoded != kKeyBytes) {
    return InvalidArgumentError(path + ": not a privacy noise key (\"" + std::string(kTag) +
                                "<64 hex characters>\")");
  }
  return key;
}

}  // namespace cohort::coordinator
