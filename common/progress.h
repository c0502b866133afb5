// Progress of one long task for a person watching: reading a file, an
// epoch of training, the rounds of a simulation.
//
// On a terminal it is one line redrawn in place with '\r' (a bar):
//   reading train.csv [=========>          ]  45%  22.5/50.0 MiB  11.2 MiB/s  ETA 0:02  <extra>
// Anywhere else (a log file, a pipe) it is a plain line each time another
// `line_percent_step` percent is done, then one at the end:
//   reading train.csv: 40% (20.0/50.0 MiB, 11.2 MiB/s, ETA 0:02) <extra>
//   reading train.csv: done, 50.0 MiB in 4.5s (11.1 MiB/s) <extra>
//
// Usage:
//   Progress progress("epoch 3", num_samples, stderr, {.unit = "samples"});
//   for (...) { ...; progress.Update(done); }
//   progress.Finish("loss 0.41");
//
// Update() is meant to be called as often as work is done: it returns after
// one comparison unless something is due to be drawn (a bar redraws at most
// every `min_interval_s`, and reads the clock at most once per 1/1000 of
// the total). Build costly `extra` text only when Due(done) says it will be
// used. Not thread-safe: one thread updates one Progress. Writes only to
// `out`, which it does not own and which must outlive it. A Progress
// destroyed without Finish() ends a half-drawn bar with a newline.
#ifndef COHORT_COMMON_PROGRESS_H_
#define COHORT_COMMON_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace cohort {

enum class ProgressMode {
  kAuto,   // kBar when the output is a terminal (isatty), else kLines.
  kBar,    // One line redrawn with '\r'.
  kLines,  // A plain line per `line_percent_step` percent, and at the end.
  kOff,    // Nothing at all.
};

struct ProgressOptions {
  std::string unit;    // Printed after counts: "rows", "MiB", "samples".
  double scale = 1.0;  // Counts are divided by this when printed (1 << 20 for "MiB").
  ProgressMode mode = ProgressMode::kAuto;
  bool show_rate = true;          // "<rate> unit/s" and, with a total, "ETA m:ss".
  double min_interval_s = 0.1;    // kBar: the most often it redraws.
  int line_percent_step = 10;     // kLines: one line per this many percent (1..100).
  std::function<double()> clock;  // Monotonic seconds; default the steady clock.
};

class Progress {
 public:
  using Mode = ProgressMode;
  using Options = ProgressOptions;

  // `total` 0 means unknown: no percentage, no bar, no ETA; kLines then
  // prints only at Finish().
  Progress(std::string label, uint64_t total, FILE* out, Options options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` units of `total` are done (not decreasing). `extra` is appended
  // to the line if one is drawn now.
  void Update(uint64_t done, std::string_view extra = {});
  // True when Update(done) would draw something.
  bool Due(uint64_t done);
  // Draws the final state (all of `total` done; with an unknown total, the
  // last Update's count) and ends the line. Later calls do nothing. A task
  // that stops early (an error) just destroys its Progress.
  void Finish(std::string_view extra = {});

  // The mode kAuto picks for `out`.
  static Mode AutoMode(FILE* out);
  Mode mode() const { return mode_; }

 private:
  void Draw(uint64_t done, std::string_view extra, bool final);
  std::string Counts(uint64_t done, double elapsed, const char* sep) const;
  void ScheduleNext(uint64_t done);
  double Now() const;

  std::string label_;
  uint64_t total_;
  FILE* out_;
  Options options_;
  Mode mode_;
  double start_s_;
  double last_draw_s_ = -1;
  uint64_t next_check_ = 0;  // Update() returns at once below this count.
  uint64_t last_done_ = 0;
  size_t last_width_ = 0;  // kBar: characters drawn last time (to blank them).
  bool finished_ = false;
};

}  // namespace cohort

#endif  // COHORT_COMMON_PROGRESS_H_
