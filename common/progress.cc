#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "common/clock.h"

namespace cohort {
namespace {

constexpr int kBarWidth = 30;

std::string FormatDuration(double seconds) {
  const auto s = static_cast<uint64_t>(std::max(0.0, std::round(seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lu:%02lu:%02lu", static_cast<unsigned long>(s / 3600),
                  static_cast<unsigned long>(s / 60 % 60), static_cast<unsigned long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lu:%02lu", static_cast<unsigned long>(s / 60),
                  static_cast<unsigned long>(s % 60));
  }
  return buf;
}

std::string FormatAmount(double value, bool fractional) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), fractional ? "%.1f" : "%.0f", value);
  return buf;
}

}  // namespace

Progress::Mode Progress::AutoMode(FILE* out) {
  return out != nullptr && ::isatty(::fileno(out)) ? Mode::kBar : Mode::kLines;
}

Progress::Progress(std::string label, uint64_t total, FILE* out, Options options)
    : label_(std::move(label)), total_(total), out_(out), options_(std::move(options)) {
  mode_ = options_.mode == Mode::kAuto ? AutoMode(out_) : options_.mode;
  if (out_ == nullptr) mode_ = Mode::kOff;
  options_.line_percent_step = std::clamp(options_.line_percent_step, 1, 100);
  if (options_.scale <= 0) options_.scale = 1;
  start_s_ = Now();
  ScheduleNext(0);
}

Progress::~Progress() {
  // A bar left without Finish() (an error return) must not leave the
  // terminal's cursor in the middle of its line.
  if (!finished_ && mode_ == Mode::kBar && last_width_ > 0) std::fputc('\n', out_);
}

double Progress::Now() const { return options_.clock ? options_.clock() : WallSeconds(); }

// The count at which Update() next looks at anything: kLines, the next
// percent step; kBar, the next 1/1000 of the total (or 1 % more than now
// when the total is unknown), so that the clock is read rarely.
void Progress::ScheduleNext(uint64_t done) {
  if (mode_ == Mode::kOff) {
    next_check_ = UINT64_MAX;
  } else if (mode_ == Mode::kLines) {
    if (total_ == 0) {
      next_check_ = UINT64_MAX;
      return;
    }
    const unsigned __int128 step = static_cast<unsigned>(options_.line_percent_step);
    const unsigned __int128 k = static_cast<unsigned __int128>(done) * 100 / total_ / step + 1;
    const unsigned __int128 at = (k * step * total_ + 99) / 100;
    next_check_ = k * step >= 100 ? UINT64_MAX : static_cast<uint64_t>(at);
  } else {
    const uint64_t stride = total_ > 0 ? total_ / 1000 : done / 100;
    next_check_ = done + std::max<uint64_t>(1, stride);
  }
}

bool Progress::Due(uint64_t done) {
  if (done < next_check_ || finished_) return false;
  if (mode_ == Mode::kBar && last_draw_s_ >= 0 && Now() - last_draw_s_ < options_.min_interval_s) {
    ScheduleNext(done);
    return false;
  }
  return true;
}

void Progress::Update(uint64_t done, std::string_view extra) {
  last_done_ = done;
  if (!Due(done)) return;
  Draw(done, extra, false);
  ScheduleNext(done);
}

void Progress::Finish(std::string_view extra) {
  if (finished_) return;
  if (mode_ != Mode::kOff) Draw(total_ > 0 ? total_ : last_done_, extra, true);
  finished_ = true;
}

// "22.5/50.0 MiB<sep>11.2 MiB/s<sep>ETA 0:02", or at the end "50.0 MiB in
// 4.5s (11.1 MiB/s)".
std::string Progress::Counts(uint64_t done, double elapsed, const char* sep) const {
  const bool fractional = options_.scale != 1.0;
  const double scaled = static_cast<double>(done) / options_.scale;
  std::string s = FormatAmount(scaled, fractional);
  if (total_ > 0 && !finished_) {
    s += "/" + FormatAmount(static_cast<double>(total_) / options_.scale, fractional);
  }
  if (!options_.unit.empty()) s += " " + options_.unit;
  if (!options_.show_rate || elapsed <= 0) return s;
  const std::string unit = options_.unit.empty() ? "" : " " + options_.unit;
  const std::string rate = FormatAmount(scaled / elapsed, fractional || scaled / elapsed < 10);
  if (finished_) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1fs", elapsed);
    return s + " in " + buf + " (" + rate + unit + "/s)";
  }
  s += sep + rate + unit + "/s";
  if (total_ > 0 && done > 0 && done < total_) {
    s += sep + std::string("ETA ") +
         FormatDuration(elapsed / static_cast<double>(done) * static_cast<double>(total_ - done));
  }
  return s;
}

void Progress::Draw(uint64_t done, std::string_view extra, bool final) {
  const double now = Now();
  last_draw_s_ = now;
  last_done_ = done;
  finished_ = final;
  const int percent = total_ > 0 ? static_cast<int>(std::min<unsigned __int128>(
                                       100, static_cast<unsigned __int128>(done) * 100 / total_))
                                 : 0;
  std::string line;
  if (mode_ == Mode::kLines) {
    line = label_ + ": ";
    if (final) {
      line += "done, " + Counts(done, now - start_s_, ", ");
    } else {
      line += (total_ > 0 ? std::to_string(percent) + "% (" : "(") +
              Counts(done, now - start_s_, ", ") + ")";
    }
    if (!extra.empty()) line += " " + std::string(extra);
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
    return;
  }
  line = label_;
  if (total_ > 0) {
    const int filled = percent * kBarWidth / 100;
    line += " [" + std::string(filled, '=') + (filled < kBarWidth ? ">" : "") +
            std::string(std::max(0, kBarWidth - filled - 1), ' ') + "] ";
    char pct[8];
    std::snprintf(pct, sizeof(pct), "%3d%%", percent);
    line += pct;
  }
  line += "  " + Counts(done, now - start_s_, "  ");
  if (!extra.empty()) line += "  " + std::string(extra);
  const size_t width = line.size();
  if (width < last_width_) line += std::string(last_width_ - width, ' ');
  last_width_ = width;
  std::fprintf(out_, "\r%s%s", line.c_str(), final ? "\n" : "");
  std::fflush(out_);
}

}  // namespace cohort
