// All-reduces buckets of one vector on a thread of its own, in the order
// they are submitted, while the caller goes on: the data-parallel step
// hands each bucket of gradients over as soon as the backward pass has
// written it, so the exchange of the last layers overlaps the computation
// of the first (PyTorch DDP's gradient buckets). Every rank must submit the
// same buckets in the same order; the communicator is used by this thread
// alone between a first Submit and Wait.
#ifndef COHORT_COLLECTIVE_BUCKET_REDUCER_H_
#define COHORT_COLLECTIVE_BUCKET_REDUCER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <thread>

#include "collective/collective.h"
#include "common/status.h"

namespace cohort::collective {

class BucketReducer {
 public:
  // `comm` (not owned) must outlive the reducer.
  BucketReducer(Communicator* comm, const CollectiveOptions& options);
  ~BucketReducer();  // Finishes what was submitted, then joins the thread.
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  // Starts reducing `bucket` in place; the caller leaves it alone until Wait.
  void Submit(std::span<float> bucket);
  // Waits for every bucket submitted so far: the first error (the buckets
  // after it are not reduced), and in exact mode the values that saturated,
  // summed over the buckets.
  Status Wait(uint64_t* saturated = nullptr);

 private:
  void Loop();

  Communicator* comm_;
  CollectiveOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::span<float>> queue_;
  size_t in_flight_ = 0;  // Submitted and not finished.
  Status status_;
  uint64_t saturated_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::collective

#endif  // COHORT_COLLECTIVE_BUCKET_REDUCER_H_
