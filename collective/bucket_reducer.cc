#include "collective/bucket_reducer.h"

#include <utility>

namespace cohort::collective {

BucketReducer::BucketReducer(Communicator* comm, const CollectiveOptions& options)
    : comm_(comm), options_(options), thread_([this] { Loop(); }) {}

BucketReducer::~BucketReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BucketReducer::Submit(std::span<float> bucket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(bucket);
    ++in_flight_;
  }
  cv_.notify_all();
}

Status BucketReducer::Wait(uint64_t* saturated) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return in_flight_ == 0; });
  if (saturated != nullptr) *saturated = saturated_;
  saturated_ = 0;
  return std::exchange(status_, OkStatus());
}

void BucketReducer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // Stopped, nothing left.
    const std::span<float> bucket = queue_.front();
    queue_.pop_front();
    const bool failed = !status_.ok();
    lock.unlock();
    // After a failure the ranks are no longer in step: reduce nothing more.
    Status done = failed ? OkStatus() : comm_->AllReduce(bucket, options_);
    const uint64_t saturated = failed ? 0 : comm_->saturated();
    lock.lock();
    if (status_.ok() && !done.ok()) status_ = std::move(done);
    saturated_ += saturated;
    --in_flight_;
    cv_.notify_all();
  }
}

}  // namespace cohort::collective
