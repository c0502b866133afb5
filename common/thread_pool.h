// ThreadPool: threads started once and reused, for the parallel loops of
// the protocol and crypto code (ParallelFor, Env::ParallelFor), which used
// to start and join new threads on every call.
//
// A process that forks must exec before it runs a loop: the child has the
// pool's bookkeeping but not its threads (cohort launch forks and execs at
// once).
#ifndef COHORT_COMMON_THREAD_POOL_H_
#define COHORT_COMMON_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cohort {

class ThreadPool {
 public:
  // `threads` counts the caller of Run: threads - 1 workers are started.
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(i) for every i in [0, n) on the caller and the workers, each i
  // once, in no fixed order; returns when all have returned. fn must be
  // thread-safe for distinct i. While another loop runs (another caller,
  // or fn itself calling Run), the loop runs on its caller alone: nested
  // and concurrent loops never deadlock. An exception from fn on the
  // caller's thread stops the loop and propagates once the workers are
  // out; one on a worker terminates, as on any thread.
  void Run(size_t n, const std::function<void(size_t)>& fn);
  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // One per process, a thread per core, started on first use and never
  // destroyed (it serves until exit).
  static ThreadPool& Default();

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* job_ = nullptr;  // Guarded by mu_.
  size_t n_ = 0;                                      // Guarded by mu_.
  uint64_t generation_ = 0;                           // Guarded by mu_.
  size_t pending_ = 0;                                // Workers still in the loop.
  bool stop_ = false;
  std::atomic<size_t> next_{0};
  std::atomic<bool> busy_{false};
  std::vector<std::thread> workers_;
};

}  // namespace cohort

#endif  // COHORT_COMMON_THREAD_POOL_H_
