// Reading a run directory's model as a user asks for it (cohort.torch's
// load_run, `cohort export`): read-only, so it works beside a coordinator
// that holds the directory's LOCK, and leaves every file as it was.
#ifndef COHORT_STORE_RUN_READER_H_
#define COHORT_STORE_RUN_READER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "store/run_store.h"

namespace cohort::store {

struct RunCheckpoint {
  RunInfo info;  // The stored config text and the last committed round.
  Checkpoint checkpoint;
};

// The checkpoint of `round` in RUN_DIR/run.db, or with no round that of the
// last committed round. Errors name the run directory and:
//   kNotFound: RUN_DIR is no directory, or holds no run.db;
//   kInvalidArgument: run.db is not a Cohort run store;
//   kFailedPrecondition: the store holds no run, or the run has committed
//     no round yet (round 0, the initial model, may still be asked for);
//   kOutOfRange: `round` is past the last committed round (named);
//   kNotFound: the round's checkpoint was pruned (the kept rounds named);
//   kDataLoss: the checkpoint fails its checks.
StatusOr<RunCheckpoint> ReadRunCheckpoint(const std::string& run_dir,
                                          std::optional<uint32_t> round = std::nullopt);

}  // namespace cohort::store

#endif  // COHORT_STORE_RUN_READER_H_
