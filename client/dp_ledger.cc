#include "client/dp_ledger.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "client/state_file.h"
#include "common/bytes.h"

namespace cohort::client {
namespace {

constexpr char kMagic[8] = {'C', 'H', 'T', 'D', 'P', 'L', 'G', '1'};
constexpr size_t kHeaderBytes = 8 + 8 + 4;
constexpr size_t kEntryBytes = 32 + 4;
constexpr char kWhat[] = ": distributed DP's ledger of noised rounds: ";

// A ledger this size holds ~1.9 million rounds; a larger file is not one.
constexpr off_t kMaxLedgerBytes = 64 << 20;

// The whole file; kUnavailable naming it when it cannot be read (no
// permission, an I/O error) or is not a regular file of at most
// kMaxLedgerBytes (a directory, a FIFO, a symbolic link, a device), which
// is read no further.
StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return UnavailableError(path + kWhat + "cannot open it: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxLedgerBytes) {
    ::close(fd);
    return UnavailableError(path + kWhat + "not a regular file of at most 64 MiB");
  }
  std::string data;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return UnavailableError(path + kWhat + "cannot read it: " + why);
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

// Holds an exclusive flock on a file beside the ledger (not the ledger
// itself, which rename replaces) for as long as it lives.
class FileLock {
 public:
  static StatusOr<FileLock> Take(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return UnavailableError(path + ": cannot open: " + std::strerror(errno));
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      return UnavailableError(path + ": cannot lock: " + why);
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace

DpRunId DpRunIdOf(std::string_view coordinator_key, std::string_view run_name,
                  std::string_view run_nonce) {
  std::string input = "cohort dp-ledger run v1";
  PutU64(input, coordinator_key.size());
  input.append(coordinator_key);
  PutU64(input, run_name.size());
  input.append(run_name);
  if (!run_nonce.empty()) {
    PutU64(input, run_nonce.size());
    input.append(run_nonce);
  }
  DpRunId id;
  crypto_generichash(id.data(), id.size(), reinterpret_cast<const uint8_t*>(input.data()),
                     input.size(), nullptr, 0);
  return id;
}

std::string DpLedgerPath(const std::string& state_dir) { return state_dir + "/dp_ledger.bin"; }

StatusOr<std::vector<DpLedger::Entry>> DpLedger::Load() const {
  if (path_.empty()) return memory_;
  std::error_code ec;
  // A link's own status: a dangling link is not a missing ledger.
  if (std::filesystem::symlink_status(path_, ec).type() == std::filesystem::file_type::not_found) {
    return std::vector<Entry>();
  }
  COHORT_ASSIGN_OR_RETURN(const std::string data, ReadFile(path_));
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  if (data.size() < kHeaderBytes || std::memcmp(p, kMagic, 8) != 0) {
    return DataLossError(path_ + kWhat + "not a ledger file (bad magic or cut short)");
  }
  const uint64_t count = GetU64(p + 8);
  const uint64_t body = data.size() - kHeaderBytes;
  if (body % kEntryBytes != 0 || body / kEntryBytes != count) {
    return DataLossError(path_ + kWhat + std::to_string(data.size()) + " bytes for " +
                         std::to_string(count) + " entries");
  }
  if (Crc32({p + kHeaderBytes, body}) != GetU32(p + 16)) {
    return DataLossError(path_ + kWhat + "CRC-32 mismatch");
  }
  std::vector<Entry> entries(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = p + kHeaderBytes + i * kEntryBytes;
    std::memcpy(entries[i].run.data(), e, 32);
    entries[i].round = GetU32(e + 32);
  }
  return entries;
}

Status DpLedger::Save(const std::vector<Entry>& entries) const {
  std::string body;
  for (const Entry& e : entries) {
    body.append(reinterpret_cast<const char*>(e.run.data()), e.run.size());
    PutU32(body, e.round);
  }
  std::string data(kMagic, 8);
  PutU64(data, entries.size());
  PutU32(data, Crc32({reinterpret_cast<const uint8_t*>(body.data()), body.size()}));
  data += body;
  return ReplaceFileDurably(path_, data);
}

StatusOr<bool> DpLedger::Contains(const DpRunId& run, uint32_t round) const {
  COHORT_ASSIGN_OR_RETURN(std::vector<Entry> entries, Load());
  return std::any_of(entries.begin(), entries.end(),
                     [&](const Entry& e) { return e.round == round && e.run == run; });
}

StatusOr<size_t> DpLedger::Total() const {
  COHORT_ASSIGN_OR_RETURN(std::vector<Entry> entries, Load());
  return entries.size();
}

StatusOr<size_t> DpLedger::Record(const DpRunId& run, uint32_t round, size_t max_total) {
  std::optional<FileLock> lock;
  if (!path_.empty()) {
    COHORT_ASSIGN_OR_RETURN(FileLock taken, FileLock::Take(path_ + ".lock"));
    lock.emplace(std::move(taken));
  }
  COHORT_ASSIGN_OR_RETURN(std::vector<Entry> entries, Load());
  size_t of_run = 0;
  for (const Entry& e : entries) {
    if (e.run != run) continue;
    if (e.round == round) {
      return AlreadyExistsError("round " + std::to_string(round) + " is in the ledger already");
    }
    ++of_run;
  }
  if (max_total > 0 && entries.size() >= max_total) {
    return ResourceExhaustedError(std::to_string(entries.size()) + " rounds are in the ledger");
  }
  entries.push_back({run, round});
  if (path_.empty()) {
    memory_ = std::move(entries);
  } else {
    COHORT_RETURN_IF_ERROR(Save(entries));
  }
  return of_run + 1;
}

}  // namespace cohort::client
