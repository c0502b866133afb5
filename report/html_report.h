// `cohort report`: one self-contained HTML page of one or more runs. Inline
// SVG and CSS only: no script, no font, image or style fetched (its
// Content-Security-Policy forbids any fetch), readable without JavaScript.
// Every string from a store is escaped.
//
// Curves of several runs are overlaid (a colour per run); the figures that
// belong to one run (dropouts by stage, time by stage, clients, ranks) get a
// section per run. A chart with no figure says so in words.
#ifndef COHORT_REPORT_HTML_REPORT_H_
#define COHORT_REPORT_HTML_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "store/run_store.h"

namespace cohort::report {

// What a report shows of one run directory, as its store holds it.
struct RunData {
  std::string dir;  // As the user named it.
  store::RunInfo info;
  std::vector<store::RoundRecord> rounds;                             // Ascending.
  std::map<uint32_t, std::vector<store::ClientRoundRecord>> clients;  // By round.
};

// The page for `runs` (at least one), in the order given.
std::string RenderHtmlReport(const std::vector<RunData>& runs);

// Whether `run` is data-parallel: its records are all-reduce epochs, or
// (before its first) its config says mode: DATA_PARALLEL.
bool IsDataParallel(const RunData& run);

// A text-format config (as protobuf's printer writes it: a field or a
// "name {" or "}" per line) as (path, value) pairs in order:
// ("train.batch_size", "16"). A field that repeats gets "[i]" from its
// second occurrence on ("data.files[1]").
std::vector<std::pair<std::string, std::string>> FlattenConfig(const std::string& text);

// The label under which the dropouts chart counts a client's round:
// "completed" (stayed to the end), "left at STAGE" (it left at that stage
// of secure aggregation), or its status ("dropped", "rejected") where no
// stage is known; and the series id the chart gives it ("completed",
// "stage:STAGE", "status:STATUS").
std::pair<std::string, std::string> ParticipationCategory(const store::ClientRoundRecord& c);

}  // namespace cohort::report

#endif  // COHORT_REPORT_HTML_REPORT_H_
