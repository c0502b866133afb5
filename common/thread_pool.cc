#include "common/thread_pool.h"

#include <algorithm>
#include <cstdint>

namespace cohort {

ThreadPool::ThreadPool(unsigned threads) {
  for (unsigned t = 1; t < threads; ++t) workers_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = new ThreadPool(std::max(1u, std::thread::hardware_concurrency()));
  return *pool;
}

void ThreadPool::Run(size_t n, const std::function<void(size_t)>& fn) {
  bool idle = false;
  if (n <= 1 || workers_.empty() || !busy_.compare_exchange_strong(idle, true)) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_ = n;
    next_.store(0);
    pending_ = workers_.size();
    ++generation_;
  }
  wake_.notify_all();
  // However the caller's share ends (an exception from fn included), the
  // workers are waited for, since they may still be inside fn, which must
  // outlive them, and the pool is freed for the next loop.
  struct Finish {
    ThreadPool* pool;
    ~Finish() {
      pool->next_.store(SIZE_MAX / 2);  // Nothing more is started.
      std::unique_lock<std::mutex> lock(pool->mu_);
      pool->done_.wait(lock, [this] { return pool->pending_ == 0; });
      pool->job_ = nullptr;
      lock.unlock();
      pool->busy_.store(false);
    }
  } finish{this};
  for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i);
}

void ThreadPool::Work() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    const size_t n = n_;
    lock.unlock();
    for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) (*job)(i);
    lock.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace cohort
