// What trains a client's model on its private data: the daemon's one seam
// between the protocol (client::Session and its event loop, daemon.h) and
// the model. The native trainer runs Cohort's engine on a shard (and on a
// site's ranks); the Python package's runs the user's own `fit`.
//
// A new kind of trainer is one class implementing LocalTrainer, handed to
// RunClient(options, trainer, stop).
#ifndef COHORT_CLIENT_LOCAL_TRAINER_H_
#define COHORT_CLIENT_LOCAL_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "client/actions.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "train/trainer.h"

namespace cohort::client {

struct ClientOptions;

// Called only from the daemon's threads: BuildModel on its event loop, then
// Train on its worker thread, one call at a time. Not copyable.
class LocalTrainer {
 public:
  LocalTrainer() = default;
  LocalTrainer(const LocalTrainer&) = delete;
  LocalTrainer& operator=(const LocalTrainer&) = delete;
  virtual ~LocalTrainer() = default;

  // The samples this client trains on: its weight, announced in Hello.
  virtual uint64_t num_samples() const = 0;
  // The training samples per class, summing to num_samples(); empty where
  // this trainer cannot say (a site: its other ranks' labels).
  virtual std::vector<uint64_t> label_counts() const { return {}; }
  // Builds the model for the coordinator's `config` (untrusted) and returns
  // its parameter count, or why this client cannot train it (the daemon
  // then stops with that status). Called once, at the first Welcome.
  virtual StatusOr<size_t> BuildModel(const config::ModelConfig& config) = 0;
  // Trains `params` in place: the round's global model on entry (as many
  // values as BuildModel returned), the local model on return. An error
  // leaves the round (the session sends no update); kCancelled once
  // `cancel` becomes true, params then undefined.
  virtual StatusOr<train::TrainResult> Train(const TrainTask& task, std::span<float> params,
                                             const std::atomic<bool>* cancel) = 0;
  // Loss and accuracy of `params` (the task's global model) on this
  // client's own test split, for the coordinator's federated evaluation.
  // Called on the worker thread before Train, when `task.evaluate`. An error
  // (kUnimplemented: no test split) leaves the update without one.
  virtual StatusOr<train::EvalResult> Evaluate(const TrainTask& task,
                                               std::span<const float> params) {
    (void)task;
    (void)params;
    return UnimplementedError("this client has no test split to evaluate on");
  }
  // The run is over (or this client stops): release whatever trains with
  // this client (a site's workers). Called once, after the last Train.
  virtual void Finish() {}
};

// Cohort's engine on `options.data` (the shard, uploaded to the backend of
// `options.device` for the whole run), and with options.site_size > 1 rank
// 0 of a data-parallel site. kInvalidArgument (or the shard's read error)
// when the shard, device or site cannot be set up.
StatusOr<std::unique_ptr<LocalTrainer>> NewNativeTrainer(const ClientOptions& options);

}  // namespace cohort::client

#endif  // COHORT_CLIENT_LOCAL_TRAINER_H_
