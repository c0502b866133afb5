#include "report/run_loader.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>
#include <vector>

#include "store/run_store.h"

namespace cohort::report {
namespace {

namespace fs = std::filesystem;

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// What a directory without run.db holds, when that tells the user which
// directory they meant: "; it holds 5 shard files (a `cohort partition`
// output)". Empty when nothing is telling.
std::string WhatItHolds(const std::string& dir) {
  size_t shards = 0, keys = 0, entries = 0;
  std::vector<std::string> runs_below;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++entries;
    const std::string name = it->path().filename().string();
    if (EndsWith(name, ".shard")) ++shards;
    if (EndsWith(name, ".key") || EndsWith(name, ".pub")) ++keys;
    std::error_code sub;
    if (it->is_directory(sub) && fs::exists(it->path() / "run.db", sub)) {
      runs_below.push_back(it->path().string());
    }
  }
  if (!runs_below.empty()) {
    std::string s = "; run directories below it: " + runs_below[0];
    for (size_t i = 1; i < runs_below.size() && i < 5; ++i) s += ", " + runs_below[i];
    return s + (runs_below.size() > 5 ? ", ..." : "");
  }
  if (shards > 0) {
    return "; it holds " + std::to_string(shards) +
           " shard files: a `cohort partition` output, not a run directory";
  }
  if (keys > 0) {
    return "; it holds " + std::to_string(keys) +
           " key files: a keys or allowlist directory, not a run directory";
  }
  return entries == 0 ? "; the directory is empty" : "";
}

// SQLite's word for a file whose pages do not hold together.
bool Malformed(const Status& status) {
  return status.message().find("malformed") != std::string::npos;
}

// A read that fails once the store is open: the file is damaged. Says
// SQLite's own words once, without the path and the store's wording.
Status Damaged(const std::string& path, const Status& status) {
  if (status.code() != StatusCode::kUnavailable && status.code() != StatusCode::kDataLoss &&
      !Malformed(status)) {
    return status.WithContext(path);
  }
  std::string why = status.message();
  for (const std::string& prefix : {path + ": ", std::string("not a Cohort run store (")}) {
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
  }
  if (status.message().find("not a Cohort run store (") != std::string::npos && !why.empty() &&
      why.back() == ')') {
    why.pop_back();
  }
  return DataLossError(path + ": the run store is damaged or truncated (" + why + ")");
}

StatusOr<RunData> Read(store::RunStore& store, const std::string& run_dir,
                       const std::string& path) {
  RunData run;
  run.dir = run_dir;
  StatusOr<std::optional<store::RunInfo>> info = store.LoadRun();
  if (!info.ok()) return Damaged(path, info.status());
  if (!*info) {
    return FailedPreconditionError(run_dir +
                                   ": the run store (run.db) holds no run yet: no coordinator "
                                   "or worker has created one here");
  }
  run.info = std::move(**info);
  StatusOr<std::vector<store::RoundRecord>> rounds = store.Rounds();
  if (!rounds.ok()) return Damaged(path, rounds.status());
  run.rounds = std::move(*rounds);
  for (const auto& r : run.rounds) {
    StatusOr<std::vector<store::ClientRoundRecord>> clients = store.ClientRounds(r.round);
    if (!clients.ok()) return Damaged(path, clients.status());
    if (!clients->empty()) run.clients[r.round] = std::move(*clients);
  }
  return run;
}

}  // namespace

StatusOr<RunData> LoadRunData(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    return NotFoundError(run_dir + (fs::exists(run_dir, ec)
                                        ? ": not a directory (--run-dir takes the run's directory)"
                                        : ": no such run directory"));
  }
  const std::string path = run_dir + "/run.db";
  if (!fs::exists(path, ec)) {
    return NotFoundError(run_dir + ": no run database (run.db) in this directory" +
                         WhatItHolds(run_dir));
  }
  // Read-only: the file stays exactly as it was, whatever it holds.
  StatusOr<std::unique_ptr<store::RunStore>> store = store::OpenSqliteRunStoreReadOnly(path);
  if (!store.ok()) {
    if (store.status().code() == StatusCode::kInvalidArgument && !Malformed(store.status())) {
      return store.status();
    }
    return Damaged(path, store.status());
  }
  return Read(**store, run_dir, path);
}

}  // namespace cohort::report
