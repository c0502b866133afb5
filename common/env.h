// Env: the world as a state machine sees it (LevelDB's Env): a clock for
// measuring how long work took, randomness, threads, and a logger. The daemons pass
// Env::Default(); tests and the simulator pass their own, so the round
// engine and the client session never read the real clock, draw from the
// operating system or write to the global logger themselves. Time that
// drives decisions (deadlines, heartbeats) comes in as `now` arguments
// (common/clock.h); the Env's clock only measures. Secret keys and shares
// do not come from an Env: libsodium draws them, so no fake Env can ever
// weaken them.
#ifndef COHORT_COMMON_ENV_H_
#define COHORT_COMMON_ENV_H_

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "common/status.h"

namespace cohort {

class Env {
 public:
  virtual ~Env() = default;

  // Seconds on a monotonic clock: the durations a record reports.
  virtual double MonotonicSeconds() = 0;
  // Milliseconds since the Unix epoch (the system clock): when a record was
  // made, as the store stamps it. Never drives a decision. By default the
  // real system clock.
  virtual int64_t UnixMillis();
  // Uniform random bits that need not be secret (task ids).
  virtual uint64_t Random64() = 0;
  // Random bytes fit for what goes into a key derivation or a signed
  // context (a round's nonce).
  virtual void RandomBytes(std::span<uint8_t> out) = 0;
  // Where the state machine's lines go.
  virtual spdlog::logger& Log() = 0;
  // Runs fn(i) for i in [0, n) (common/parallel.h's contract: the first
  // error, the rest skipped). The daemons': the process's thread pool.
  virtual Status ParallelFor(size_t n, const std::function<Status(size_t)>& fn) = 0;

  // The daemons': steady_clock and system_clock, libsodium's randombytes, and spdlog's
  // default logger as it is when a line is written (InitLogging replaces
  // it). Lives for the whole process.
  static Env* Default();
};

// An Env that forwards to another but logs to `log` (for instance the same
// sinks at another level): how the simulator keeps its thousands of
// sessions' info lines out of the coordinator's.
class LogRedirectEnv : public Env {
 public:
  LogRedirectEnv(Env* base, std::shared_ptr<spdlog::logger> log)
      : base_(base), log_(std::move(log)) {}
  double MonotonicSeconds() override { return base_->MonotonicSeconds(); }
  int64_t UnixMillis() override { return base_->UnixMillis(); }
  uint64_t Random64() override { return base_->Random64(); }
  void RandomBytes(std::span<uint8_t> out) override { base_->RandomBytes(out); }
  spdlog::logger& Log() override { return *log_; }
  Status ParallelFor(size_t n, const std::function<Status(size_t)>& fn) override {
    return base_->ParallelFor(n, fn);
  }

 private:
  Env* base_;
  std::shared_ptr<spdlog::logger> log_;
};

}  // namespace cohort

#endif  // COHORT_COMMON_ENV_H_
