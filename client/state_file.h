// A client's files in its --state-dir (SCAFFOLD's control variate,
// distributed DP's ledger): one way to replace one durably.
#ifndef COHORT_CLIENT_STATE_FILE_H_
#define COHORT_CLIENT_STATE_FILE_H_

#include <string>

#include "common/status.h"

namespace cohort::client {

// Writes `data` to `path` + ".tmp" (mode 0600), fsyncs it, renames it over
// `path` and fsyncs the directory, so a crash leaves the old file or the
// new one, never a part. kUnavailable naming the file and the step on any
// failure (the old file is then unchanged).
Status ReplaceFileDurably(const std::string& path, const std::string& data);

}  // namespace cohort::client

#endif  // COHORT_CLIENT_STATE_FILE_H_
