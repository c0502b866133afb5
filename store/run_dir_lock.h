// One process at a time in a run directory: an exclusive flock(2) on
// RUN_DIR/LOCK (as LevelDB's LOCK file), held while the RunDirLock lives and
// released by the kernel when the process dies, however it dies. The holder
// writes its pid and role into the file, so a second process can name it.
#ifndef COHORT_STORE_RUN_DIR_LOCK_H_
#define COHORT_STORE_RUN_DIR_LOCK_H_

#include <memory>
#include <string>

#include "common/status.h"

namespace cohort::store {

class RunDirLock {
 public:
  // Creates `run_dir` if it is missing, then takes its lock for `role`
  // (e.g. "cohort coordinator"). kFailedPrecondition when another process
  // holds it: "RUN_DIR is in use by pid N (cohort coordinator) ...".
  static StatusOr<std::unique_ptr<RunDirLock>> Acquire(const std::string& run_dir,
                                                       const std::string& role);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace cohort::store

#endif  // COHORT_STORE_RUN_DIR_LOCK_H_
