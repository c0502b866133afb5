#include "python/cohort/fit_bridge.h"

namespace cohort::python {

StatusOr<train::TrainResult> FitBridge::Train(const client::TrainTask& task,
                                              std::span<float> params,
                                              const std::atomic<bool>* cancel) {
  Call call{.task = &task, .params = params, .result = std::nullopt};
  std::unique_lock<std::mutex> lock(mu_);
  if (refusing_ || closed_) return CancelledError("the client is stopping");
  pending_ = &call;
  cv_.notify_all();
  while (!call.result) {
    // The cancel flag has no notification of its own: look at it often.
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    const bool cancelled = cancel != nullptr && cancel->load();
    if (!taken_ && !call.result && (cancelled || refusing_)) {
      pending_ = nullptr;
      return CancelledError(cancelled ? "cancelled before fit" : "the client is stopping");
    }
  }
  return *std::move(call.result);
}

FitBridge::Call* FitBridge::Next(std::chrono::milliseconds timeout, bool* closed) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return (pending_ != nullptr && !taken_) || closed_; });
  *closed = closed_;
  if (pending_ == nullptr || taken_) return nullptr;
  taken_ = true;
  return pending_;
}

void FitBridge::Complete(Call* call, StatusOr<train::TrainResult> result) {
  std::lock_guard<std::mutex> lock(mu_);
  call->result = std::move(result);
  pending_ = nullptr;
  taken_ = false;
  cv_.notify_all();
}

void FitBridge::Refuse() {
  std::lock_guard<std::mutex> lock(mu_);
  refusing_ = true;
  cv_.notify_all();
}

void FitBridge::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace cohort::python
