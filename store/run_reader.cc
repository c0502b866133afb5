#include "store/run_reader.h"

#include <filesystem>
#include <system_error>

namespace cohort::store {
namespace {

// "3, 4 and 5" (or "none").
std::string RoundList(const std::vector<uint32_t>& rounds) {
  if (rounds.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < rounds.size(); ++i) {
    if (i > 0) s += i + 1 == rounds.size() ? " and " : ", ";
    s += std::to_string(rounds[i]);
  }
  return s;
}

StatusOr<RunCheckpoint> Read(RunStore& store, std::optional<uint32_t> round) {
  COHORT_ASSIGN_OR_RETURN(std::optional<RunInfo> info, store.LoadRun());
  if (!info) return FailedPreconditionError("the run store holds no run yet");
  const uint32_t last = info->last_round;
  if (!round && last == 0) {
    return FailedPreconditionError(
        "the run has committed no round yet (only the initial model, round 0)");
  }
  const uint32_t want = round.value_or(last);
  if (want > last) {
    return OutOfRangeError("round " + std::to_string(want) + " is past the last committed round, " +
                           std::to_string(last));
  }
  StatusOr<Checkpoint> cp = store.CheckpointAt(want);
  if (cp.status().code() == StatusCode::kNotFound) {
    COHORT_ASSIGN_OR_RETURN(std::vector<uint32_t> kept, store.CheckpointRounds());
    return NotFoundError("round " + std::to_string(want) +
                         "'s model was not kept (rounds.keep_checkpoints); the run keeps "
                         "the models of rounds " +
                         RoundList(kept));
  }
  if (!cp.ok()) return cp.status();
  return RunCheckpoint{std::move(*info), std::move(*cp)};
}

}  // namespace

StatusOr<RunCheckpoint> ReadRunCheckpoint(const std::string& run_dir,
                                          std::optional<uint32_t> round) {
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) {
    return NotFoundError(run_dir + ": no such run directory");
  }
  const std::string path = run_dir + "/run.db";
  if (!std::filesystem::exists(path, ec)) {
    return NotFoundError(run_dir + ": no run database (run.db) in this directory");
  }
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<RunStore> store, OpenSqliteRunStoreReadOnly(path));
  StatusOr<RunCheckpoint> read = Read(*store, round);
  if (!read.ok()) return read.status().WithContext(run_dir);
  return read;
}

}  // namespace cohort::store
