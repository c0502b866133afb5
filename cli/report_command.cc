// `cohort report`: one self-contained HTML page of one or more runs
// (report/html_report.h), read-only.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/logging.h"
#include "report/html_report.h"
#include "report/run_loader.h"

namespace cohort::cli {
namespace {

namespace fs = std::filesystem;

struct ReportFlags {
  std::vector<std::string> run_dirs;
  std::string out;
};

// -o may not name a run directory's own files, nor a directory.
Status CheckOutput(const ReportFlags& f) {
  std::error_code ec;
  if (fs::is_directory(f.out, ec)) {
    return InvalidArgumentError("-o " + f.out + ": is a directory; name the HTML file to write");
  }
  const fs::path out = fs::weakly_canonical(f.out, ec);
  for (const auto& dir : f.run_dirs) {
    for (const char* name : {"run.db", "run.db-wal", "run.db-shm", "run.db-journal", "LOCK"}) {
      std::error_code e;
      if (!ec && out == fs::weakly_canonical(fs::path(dir) / name, e)) {
        return InvalidArgumentError("-o " + f.out + ": is " + dir + "'s " + name +
                                    "; a report never writes into a run's own files");
      }
    }
  }
  return OkStatus();
}

// Writes `text` to a temporary file beside `path` and renames it there, so
// that `path` is either the whole page or left as it was.
Status WriteWhole(const std::string& path, const std::string& text) {
  std::string temp = path + ".XXXXXX";
  const int fd = mkstemp(temp.data());
  if (fd < 0) return UnavailableError("cannot write " + path + ": " + std::strerror(errno));
  const mode_t mask = umask(0);
  umask(mask);
  bool ok = fchmod(fd, 0666 & ~mask) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  const int error = errno;
  ok = close(fd) == 0 && ok;
  if (ok && std::rename(temp.c_str(), path.c_str()) == 0) return OkStatus();
  const std::string why = std::strerror(ok ? errno : error);
  unlink(temp.c_str());
  return UnavailableError("cannot write " + path + ": " + why);
}

Status RunReport(const ReportFlags& f) {
  COHORT_RETURN_IF_ERROR(CheckOutput(f));
  std::vector<report::RunData> runs;
  for (const auto& dir : f.run_dirs) {
    COHORT_ASSIGN_OR_RETURN(report::RunData run, report::LoadRunData(dir));
    runs.push_back(std::move(run));
  }
  const std::string page = report::RenderHtmlReport(runs);
  COHORT_RETURN_IF_ERROR(WriteWhole(f.out, page));
  size_t records = 0;
  for (const auto& run : runs) records += run.rounds.size();
  std::printf("wrote %s: %zu run%s, %zu rounds or epochs, %.1f KiB\n", f.out.c_str(), runs.size(),
              runs.size() == 1 ? "" : "s", records, page.size() / 1024.0);
  return OkStatus();
}

}  // namespace

Command AddReportCommand(CLI::App& app, const std::string& log_level) {
  auto* rep = app.add_subcommand(
      "report",
      "Write one self-contained HTML page of a run (or several, overlaid): curves, "
      "participation, time and bytes, clients, ranks, lineage; read-only");
  auto f = std::make_shared<ReportFlags>();
  rep->add_option("--run-dir", f->run_dirs,
                  "Run directory; repeat it to overlay several runs (and compare their configs)")
      ->required()
      ->take_all();
  rep->add_option("-o,--out", f->out, "The HTML file to write")->required();
  return {rep, [f, &log_level] {
            InitLogging("report", "", log_level);
            return Report(RunReport(*f), "report");
          }};
}

}  // namespace cohort::cli
