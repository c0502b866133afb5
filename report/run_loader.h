// Reading a run directory for `cohort report`: read-only (the store is
// opened with SQLITE_OPEN_READONLY and nothing else in the directory is
// touched), so it works beside a running coordinator and leaves every file
// as it was.
#ifndef COHORT_REPORT_RUN_LOADER_H_
#define COHORT_REPORT_RUN_LOADER_H_

#include <string>

#include "common/status.h"
#include "report/html_report.h"

namespace cohort::report {

// The run in RUN_DIR/run.db: its info, every round and every round's
// clients. Errors start with `run_dir` and say what is wrong:
//   kNotFound: RUN_DIR is no directory, or holds no run.db (what it holds
//     instead is named where it is telling: shard files, key files, run
//     directories below it);
//   kInvalidArgument: run.db is not a Cohort run store;
//   kDataLoss: run.db is damaged (truncated, overwritten), with SQLite's
//     words;
//   kFailedPrecondition: the store holds no run.
StatusOr<RunData> LoadRunData(const std::string& run_dir);

}  // namespace cohort::report

#endif  // COHORT_REPORT_RUN_LOADER_H_
