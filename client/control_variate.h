// SCAFFOLD's client control variate c_i (train.scaffold, aggregation/
// scaffold.h) in the client's state directory (`cohort client
// --state-dir`), so a restarted client goes on with the variate it had.
//
// c_i moves when the client sends a round's update, but that update counts
// only if the round commits; a round run again (its updates lost, or the
// coordinator restarted before the commit) must train from the c_i of
// before. So the state is the round of the last update and c_i before and
// after it: a task of that same round starts from `before`, any other from
// `after`.
//
// c_i is one run's: a client that joins another run (another coordinator,
// run name or run nonce) starts that run's c_i at zero, since the new
// run's c starts at zero too. So the state names its run.
//
// The file, <state-dir>/scaffold_variate.bin: the 8-byte magic "CHTSCAF2",
// the value count n (uint64 LE), the round (uint32 LE), the run's 32-byte
// id, the CRC-32 of the run id and the values (uint32 LE), then 2 n float32
// LE values, `before` then `after`. Written to a temporary file beside it,
// fsynced and renamed over it, so a crash leaves the old state or the new,
// never half. A file of the format before the run id ("CHTSCAF1") loads
// with an all-zero run id: no run's.
#ifndef COHORT_CLIENT_CONTROL_VARIATE_H_
#define COHORT_CLIENT_CONTROL_VARIATE_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace cohort::client {

struct ClientVariate {
  uint32_t round = 0;             // Of the last update sent; 0: none yet.
  std::vector<float> before;      // c_i that round trained from.
  std::vector<float> after;       // c_i+ it sent the change to.
  std::array<uint8_t, 32> run{};  // The run it belongs to (DpRunIdOf); zeros: none.
  // The c_i a task of `task_round` starts from.
  const std::vector<float>& For(uint32_t task_round) const {
    return task_round == round ? before : after;
  }
};

// The variate file's path in `state_dir`.
std::string ControlVariatePath(const std::string& state_dir);

// The state in `path`, for a model of `num_params`. A missing file: round
// 0, zeros and no run (a client's first SCAFFOLD round). kDataLoss naming the file
// when it is not a variate file, is cut short or too long, holds another
// number of values than `num_params`, fails its CRC or holds NaN or Inf;
// kUnavailable when it cannot be read.
StatusOr<ClientVariate> LoadControlVariate(const std::string& path, size_t num_params);

// Replaces the state in `path` atomically (temporary file, fsync, rename).
// `before` and `after` have one size. kUnavailable naming the file when it
// cannot be written.
Status SaveControlVariate(const std::string& path, const ClientVariate& variate);

}  // namespace cohort::client

#endif  // COHORT_CLIENT_CONTROL_VARIATE_H_
