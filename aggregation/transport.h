// Bytes between the ranks of a group, for the peer collectives
// (aggregation/collective.h). Gloo's shape: one small interface here, with
// same-named backends in net/: in-process (N ranks as threads: tests, the
// simulator) and ZeroMQ (processes, hosts).
#ifndef COHORT_AGGREGATION_TRANSPORT_H_
#define COHORT_AGGREGATION_TRANSPORT_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace cohort::aggregation {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Queues a copy of `bytes` for `peer` and returns; messages from one rank
  // to another arrive in the order sent.
  virtual Status Send(int peer, std::span<const uint8_t> bytes) = 0;
  // The next message from `peer`, waiting until `deadline` (a SteadyNowMs()
  // time): kDeadlineExceeded when none came in time, kUnavailable when the
  // peer is known to be gone.
  virtual StatusOr<std::vector<uint8_t>> Receive(int peer, TimeMs deadline) = 0;
};

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_TRANSPORT_H_
