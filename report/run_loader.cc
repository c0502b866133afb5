#include "report/run_loader.h"

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

// A read that fails once the store is open (the store checks the file's
// pages at open, so this is rare): named damaged, with SQLite's words.
Status Damaged(const std::string& path, const Status& status) {
  if (status.code() == StatusCode::kUnavailable &&
      status.message().find("malformed") != std::string::npos) {
    return DataLossError(path + ": the run store is damaged (" + status.message() + ")");
  }
  return status.WithContext(path);
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
  // Its errors name the file: not a run store, damaged, or not readable.
  if (!store.ok()) return store.status();
  return Read(**store, run_dir, path);
}

}  // namespace cohort::report
