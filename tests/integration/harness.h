// Helpers for multi-process integration tests: start `cohort` processes,
// read their stdout line by line with a bounded wait, signal and reap them.
// Synchronisation is always on an event (a line printed, a process exit),
// never on a sleep.
#ifndef COHORT_TESTS_INTEGRATION_HARNESS_H_
#define COHORT_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status.h"

namespace cohort::testing {

// The cohort binary under test (environment variable COHORT_BIN).
std::string CohortBin();

// A fresh directory under $TMPDIR, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class Process {
 public:
  // Starts `argv` with stdout on a pipe and stderr appended to `stderr_path`.
  Process(const std::vector<std::string>& argv, const std::string& stderr_path);
  ~Process();  // SIGKILLs and reaps a process still running.
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // Reads stdout until a line containing `needle` (returned), EOF or timeout.
  std::optional<std::string> WaitForLine(const std::string& needle,
                                         std::chrono::seconds timeout = std::chrono::seconds(60));
  // Every stdout line read so far.
  const std::vector<std::string>& lines() const { return lines_; }
  void Signal(int sig);
  // Waits for exit (bounded); returns the exit code, 128+signal, or -1 on timeout.
  int Wait(std::chrono::seconds timeout = std::chrono::seconds(60));
  // The process's peak resident memory over its whole life (the kernel's
  // high-water mark, like VmHWM), in bytes; known once Wait() has seen it exit.
  std::optional<size_t> peak_rss_bytes() const { return peak_rss_bytes_; }

 private:
  bool ReadMore(int timeout_ms);
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::vector<std::string> lines_;
  size_t consumed_ = 0;
  std::optional<int> exit_code_;
  std::optional<size_t> peak_rss_bytes_;
};

// Runs a cohort subcommand to completion; returns exit code, fills stdout.
int RunCohort(const std::vector<std::string>& args, std::string* out, const std::string& err_path);

// ZMTP 3.0 (rfc.zeromq.org/spec/23), for tests that speak to ZeroMQ at the
// byte level. The 64-byte greeting: signature 0xFF, 8 bytes padding, 0x7F;
// version 3.0; the mechanism name padded to 20 bytes; as-server; filler.
std::string ZmtpGreeting(const std::string& mechanism, bool as_server);
// A command frame header declaring `size` body bytes: flags 0x04 (command) |
// 0x02 (long size), then the size as 8 bytes big-endian.
std::string ZmtpCommandHeader(uint64_t size);

// Waits (bounded) until `done()` holds, checking it again each time a file
// in `path`'s directory is created, written or moved in (inotify): how a
// test waits for a file to appear or for a line in a process's log.
bool WaitForFile(const std::string& path, const std::function<bool()>& done,
                 std::chrono::seconds timeout);
// Waits (bounded) until the file at `path` contains `needle`.
bool WaitForText(const std::string& path, const std::string& needle,
                 std::chrono::seconds timeout = std::chrono::seconds(60));

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);

// The value, or a test failure (an exception gtest reports) naming `what`.
template <typename T>
T OrThrow(StatusOr<T> s, const std::string& what) {
  if (!s.ok()) throw std::runtime_error(what + ": " + s.status().ToString());
  return *std::move(s);
}

}  // namespace cohort::testing

#endif  // COHORT_TESTS_INTEGRATION_HARNESS_H_
