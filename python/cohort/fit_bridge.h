// The hand-over between the client daemon's worker thread, which trains
// each task through LocalTrainer::Train, and the Python thread that called
// Client.run(), the only one that calls the user's `fit`. Plain C++ (no
// Python): the Python side waits in Next() with the GIL released.
#ifndef COHORT_PYTHON_COHORT_FIT_BRIDGE_H_
#define COHORT_PYTHON_COHORT_FIT_BRIDGE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <span>

#include "client/actions.h"
#include "common/status.h"
#include "train/trainer.h"

namespace cohort::python {

// Thread-safe. At most one call is in flight (the daemon trains one task at
// a time).
class FitBridge {
 public:
  struct Call {
    // fit(params, task), or the federated evaluation's evaluate(params, task).
    enum class Kind { kFit, kEvaluate };
    Kind kind = Kind::kFit;
    const client::TrainTask* task = nullptr;
    std::span<float> params;  // The daemon's buffer: fit's array views it.
    std::optional<StatusOr<train::TrainResult>> result{};      // kFit.
    std::optional<StatusOr<train::EvalResult>> eval_result{};  // kEvaluate.
    bool done() const { return kind == Kind::kFit ? result.has_value() : eval_result.has_value(); }
  };

  // Worker thread: hands the task to the Python thread and blocks until it
  // completes the call. kCancelled, without calling fit, when the bridge is
  // closed or refusing, or `cancel` becomes true before the Python thread
  // takes the call; once taken, it waits for fit to return (its array views
  // `params`).
  StatusOr<train::TrainResult> Train(const client::TrainTask& task, std::span<float> params,
                                     const std::atomic<bool>* cancel);
  // Worker thread: the same for evaluate, on the task's global model (its
  // array is read-only).
  StatusOr<train::EvalResult> Evaluate(const client::TrainTask& task,
                                       std::span<const float> params);

  // Python thread: takes the pending call, or returns nullptr after
  // `timeout`. `*closed` becomes true once Close() was called.
  Call* Next(std::chrono::milliseconds timeout, bool* closed);
  // Python thread: `call` (from Next) is done.
  void Complete(Call* call, StatusOr<train::TrainResult> result);
  void CompleteEvaluation(Call* call, StatusOr<train::EvalResult> result);
  // Every call not yet taken, and every later one, ends kCancelled.
  void Refuse();
  // The daemon's loop has ended: Next reports it.
  void Close();

 private:
  // Hands `call` over and waits until it is done (OK) or, not yet taken,
  // cancelled or refused (kCancelled).
  Status Submit(Call& call, const std::atomic<bool>* cancel);

  std::mutex mu_;
  std::condition_variable cv_;
  Call* pending_ = nullptr;
  bool taken_ = false;
  bool refusing_ = false;
  bool closed_ = false;
};

}  // namespace cohort::python

#endif  // COHORT_PYTHON_COHORT_FIT_BRIDGE_H_
