// The in-process transport: N ranks as threads of one process (tests, the
// simulator). Each rank's end is used by one thread, all of them at once.
#ifndef COHORT_NET_INPROCESS_TRANSPORT_H_
#define COHORT_NET_INPROCESS_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "collective/transport.h"

namespace cohort::net {

class InProcessHub {
 public:
  explicit InProcessHub(int size);
  // Rank `rank`'s end; the hub must outlive it.
  std::unique_ptr<collective::Transport> Connect(int rank);
  // Rank `rank` dies: what it sent stays readable, then its peers' receives
  // from it fail at once with kUnavailable.
  void Kill(int rank);

 private:
  friend class InProcessTransport;
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::deque<std::vector<uint8_t>>> from;  // One queue per sender.
  };
  int size_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;  // One per receiver.
  std::unique_ptr<std::atomic<bool>[]> dead_;
};

}  // namespace cohort::net

#endif  // COHORT_NET_INPROCESS_TRANSPORT_H_
