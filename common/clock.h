// Time as a value. Protocol state machines never read the clock themselves:
// daemons pass SteadyNowMs() in, tests pass whatever they like; the
// durations they record come from their Env (common/env.h).
#ifndef COHORT_COMMON_CLOCK_H_
#define COHORT_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace cohort {

using TimeMs = int64_t;  // Milliseconds on a monotonic clock.

// Now on the steady (monotonic) clock: the `now` the daemons' I/O loops and
// the transports pass to what they drive.
inline TimeMs SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds on the same steady clock, not wall-clock (calendar) time despite
// the name: for benchmarks timing a stretch of work. What a protocol, a
// metric or a stored figure measures comes from Env::MonotonicSeconds.
inline double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace cohort

#endif  // COHORT_COMMON_CLOCK_H_
