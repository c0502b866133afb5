// ParallelFor: runs fn(i) for i in [0, n) on up to `threads` threads (0: one
// per core), striding so neighbouring indices go to different threads.
// Returns the first error any call returned (all calls still run to the
// end of their thread's stride unless one fails). fn must be thread-safe
// for distinct i.
#ifndef COHORT_COMMON_PARALLEL_H_
#define COHORT_COMMON_PARALLEL_H_

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

#include "common/status.h"

namespace cohort {

template <typename Fn>
Status ParallelFor(size_t n, Fn&& fn, unsigned threads = 0, size_t min_per_thread = 16) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads =
      static_cast<unsigned>(std::min<size_t>(threads, n / std::max<size_t>(min_per_thread, 1)));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) COHORT_RETURN_IF_ERROR(fn(i));
    return OkStatus();
  }
  std::vector<Status> results(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t; i < n; i += threads) {
        Status s = fn(i);
        if (!s.ok()) {
          results[t] = s;
          return;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const Status& s : results) COHORT_RETURN_IF_ERROR(s);
  return OkStatus();
}

}  // namespace cohort

#endif  // COHORT_COMMON_PARALLEL_H_
