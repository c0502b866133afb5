// Internal to report/: the parts of the page that html_report.cc puts
// together, and the small HTML helpers they share.
#ifndef COHORT_REPORT_SECTIONS_H_
#define COHORT_REPORT_SECTIONS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "report/html_report.h"

namespace cohort::report::internal {

// A <table> whose cells are text (escaped here).
std::string Table(const std::vector<std::string>& head,
                  const std::vector<std::vector<std::string>>& rows);

// printf-style formatting of one number.
std::string Format(const char* format, double value);

// "run 2" for runs[1].
std::string RunLabel(size_t index);

// The section of one run: dropouts by stage, aborted rounds, time by stage,
// clients (samples, their spread, bytes, lineage) and, for data-parallel
// runs, its ranks.
std::string RunSection(const RunData& run, size_t index);

// A data-parallel run's ranks: samples/s per rank and epoch, compute
// against communication (ranks.cc).
std::string RanksPart(const RunData& run, size_t index);

}  // namespace cohort::report::internal

#endif  // COHORT_REPORT_SECTIONS_H_
