// Distributed DP's ledger of noised contributions (privacy.mechanism:
// DISTRIBUTED_SKELLAM, docs/privacy.md "Repeated rounds"): the (run, round)
// pairs this client has noised an update for. A coordinator that re-sends
// one round to the same clients gets the same rounded update under fresh
// noise each time, and averaging k unmasked sums divides the noise by
// sqrt(k); so a client noises at most one update per round of a run.
//
// The count is taken when the noised input is made, before it is masked
// and sent (SecAgg+'s other clients can reveal its self-mask seed, so the
// coordinator can unmask an input without asking this client again), and a
// contribution whose round is then lost still counts.
//
// The file, <state-dir>/dp_ledger.bin: the 8-byte magic "CHTDPLG1", the
// entry count n (uint64 LE), the CRC-32 of the entries (uint32 LE), then n
// entries of a 32-byte run id (DpRunIdOf) and the round (uint32 LE).
// Written to a temporary file beside it, fsynced, renamed over it and the
// directory fsynced, under an exclusive flock of <state-dir>/dp_ledger.bin.lock,
// so a crash leaves the old ledger or the new one, and two processes on one
// state directory cannot both add one round.
#ifndef COHORT_CLIENT_DP_LEDGER_H_
#define COHORT_CLIENT_DP_LEDGER_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace cohort::client {

using DpRunId = std::array<uint8_t, 32>;

// A run as the ledger keys it: BLAKE2b-256 of the coordinator's pinned
// public key (empty when the client pins none: --insecure, the simulator)
// the run's name (Welcome.run_name) and, where the coordinator sends one,
// the run's nonce (Welcome.run_nonce), each length-prefixed. The nonce
// tells an honest coordinator's new run from an old one of the same name;
// without it (older coordinators) the id is what it was before the nonce,
// so ledgers written then still count.
DpRunId DpRunIdOf(std::string_view coordinator_key, std::string_view run_name,
                  std::string_view run_nonce = {});

// The ledger file's path in `state_dir`.
std::string DpLedgerPath(const std::string& state_dir);

// Not thread-safe; several processes may share one file.
class DpLedger {
 public:
  // `path` empty: the ledger lives in this object only.
  explicit DpLedger(std::string path = "") : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // Whether round `round` of `run` is in the ledger (the file is read
  // again on every call). A missing file is an empty ledger. kDataLoss
  // naming the file when it is not a ledger, is cut short or too long, or
  // fails its CRC; kUnavailable naming it when it cannot be read.
  StatusOr<bool> Contains(const DpRunId& run, uint32_t round) const;

  // How many rounds the ledger holds, of every run together (Contains's
  // errors).
  StatusOr<size_t> Total() const;

  // Adds round `round` of `run` and has it on disk before returning;
  // returns how many rounds of `run` the ledger then holds.
  // kAlreadyExists when the round is there already (read again under the
  // lock); `max_total` > 0: kResourceExhausted, nothing added, when the
  // ledger holds that many rounds of all runs together already; Contains's
  // errors; kUnavailable naming the file when it cannot be locked or
  // written. A file that cannot be read is never overwritten.
  StatusOr<size_t> Record(const DpRunId& run, uint32_t round, size_t max_total = 0);

 private:
  struct Entry {
    DpRunId run;
    uint32_t round;
  };
  StatusOr<std::vector<Entry>> Load() const;
  Status Save(const std::vector<Entry>& entries) const;

  std::string path_;
  std::vector<Entry> memory_;  // When path_ is empty.
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_DP_LEDGER_H_
