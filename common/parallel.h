// ParallelFor: runs fn(i) for i in [0, n) on the process's thread pool
// (common/thread_pool.h: threads started once, not per call), or on the
// caller alone when `threads` is 1, or when n / min_per_thread < 2 (too
// little work to share). Returns the first error any call returned; once
// one has failed, the calls not yet started are skipped. fn must be
// thread-safe for distinct i.
#ifndef COHORT_COMMON_PARALLEL_H_
#define COHORT_COMMON_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>

#include "common/status.h"
#include "common/thread_pool.h"

namespace cohort {

template <typename Fn>
Status ParallelFor(size_t n, Fn&& fn, unsigned threads = 0, size_t min_per_thread = 16) {
  ThreadPool& pool = ThreadPool::Default();
  if (threads == 0) threads = pool.size();
  threads =
      static_cast<unsigned>(std::min<size_t>(threads, n / std::max<size_t>(min_per_thread, 1)));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) COHORT_RETURN_IF_ERROR(fn(i));
    return OkStatus();
  }
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first = OkStatus();
  pool.Run(n, [&](size_t i) {
    if (failed.load(std::memory_order_relaxed)) return;
    Status s = fn(i);
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (!failed.exchange(true)) first = std::move(s);
  });
  return first;
}

}  // namespace cohort

#endif  // COHORT_COMMON_PARALLEL_H_
