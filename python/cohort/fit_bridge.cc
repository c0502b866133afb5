#include "python/cohort/fit_bridge.h"

namespace cohort::python {

Status FitBridge::Submit(Call& call, const std::atomic<bool>* cancel) {
  std::unique_lock<std::mutex> lock(mu_);
  if (refusing_ || closed_) return CancelledError("the client is stopping");
  pending_ = &call;
  cv_.notify_all();
  while (!call.done()) {
    // The cancel flag has no notification of its own: look at it often.
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    const bool cancelled = cancel != nullptr && cancel->load();
    if (!taken_ && !call.done() && (cancelled || refusing_)) {
      pending_ = nullptr;
      return CancelledError(!cancelled                      ? "the client is stopping"
                            : call.kind == Call::Kind::kFit ? "cancelled before fit"
                                                            : "cancelled before evaluate");
    }
  }
  return OkStatus();
}

StatusOr<train::TrainResult> FitBridge::Train(const client::TrainTask& task,
                                              std::span<float> params,
                                              const std::atomic<bool>* cancel) {
  Call call{.kind = Call::Kind::kFit, .task = &task, .params = params};
  COHORT_RETURN_IF_ERROR(Submit(call, cancel));
  return *std::move(call.result);
}

StatusOr<train::EvalResult> FitBridge::Evaluate(const client::TrainTask& task,
                                                std::span<const float> params) {
  // The array the Python side makes of it is read-only.
  Call call{.kind = Call::Kind::kEvaluate,
            .task = &task,
            .params = {const_cast<float*>(params.data()), params.size()}};
  COHORT_RETURN_IF_ERROR(Submit(call, nullptr));
  return *std::move(call.eval_result);
}

FitBridge::Call* FitBridge::Next(std::chrono::milliseconds timeout, bool* closed) {
  std::unique_lock<std::mutex> lock(mu_);
  // Once refusing, a call still pending is the daemon's to cancel (Submit).
  cv_.wait_for(lock, timeout,
               [this] { return (pending_ != nullptr && !taken_ && !refusing_) || closed_; });
  *closed = closed_;
  if (pending_ == nullptr || taken_ || refusing_) return nullptr;
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

void FitBridge::CompleteEvaluation(Call* call, StatusOr<train::EvalResult> result) {
  std::lock_guard<std::mutex> lock(mu_);
  call->eval_result = std::move(result);
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
