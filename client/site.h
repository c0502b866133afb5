// A site: one federated client that is data-parallel inside. Rank 0 of the
// site's group is the client daemon, the only process the coordinator
// knows; ranks 1..W-1 are `cohort site-worker` processes on the site's own
// machines, each with its own shard. For each task rank 0 hands the workers
// the model config, the training options and the global model; every rank
// trains on its own shard, and each step's gradients are all-reduced,
// weighted by the samples each rank contributed, so the site trains like
// one client holding all the site's data, with the task's batch size per
// rank (the convention of data-parallel training: W times the batch, W
// times fewer steps, as many steps as each of W separate clients). Rank
// 0 then sends the delta, through secure aggregation when the round is:
// the coordinator never sees a worker, nor a worker's contribution.
#ifndef COHORT_CLIENT_SITE_H_
#define COHORT_CLIENT_SITE_H_

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "collective/collective.h"
#include "collective/transport.h"
#include "common/env.h"
#include "common/status.h"
#include "net/group.h"
#include "proto/config.pb.h"
#include "train/backend.h"
#include "train/device.h"
#include "train/model.h"
#include "train/trainer.h"

namespace cohort::client {

class Site {
 public:
  // Meets the site's other ranks at `group.master` and learns the site's
  // sample count. `data` is this rank's shard, in `backend` memory; both
  // outlive the Site. kInvalidArgument on every rank, naming the rank and its
  // count, when a rank claims fewer than 0 or more than 2^40 samples, or the
  // site's total is not in [1, 2^40] (what the coordinator accepts). The
  // training seconds a rank reports are measured on `env`'s clock.
  static StatusOr<std::unique_ptr<Site>> Join(zmq::context_t& context,
                                              const net::GroupOptions& group,
                                              train::Backend* backend,
                                              const train::DeviceDataset* data,
                                              Env* env = Env::Default());
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Samples over every rank's shard: the weight the site reports.
  uint64_t total_samples() const { return total_samples_; }

  // Rank 0: trains one task across the site, starting from `params` (the
  // global model) and leaving the result there. `model` is rank 0's model
  // for `config`. kCancelled when `cancel` is set (every rank stops at the
  // same step); an error naming the rank when a worker is gone; kDataLoss
  // naming the ranks whose gradient is not finite, before that step (on
  // every rank: the workers' Serve returns it too).
  StatusOr<train::TrainResult> Train(const config::ModelConfig& config, train::Model& model,
                                     std::span<float> params, const train::TrainOptions& options,
                                     const std::atomic<bool>* cancel);
  // Rank 0: tells the workers the run is over (best effort).
  void Finish();
  // Ranks > 0: trains every task rank 0 hands out, until it says the run is
  // over (OK) or is gone (an error naming it).
  Status Serve();

 private:
  Site() = default;
  StatusOr<train::TrainResult> TrainEpochs(train::Model& model, std::span<float> params,
                                           const train::TrainOptions& options,
                                           const std::atomic<bool>* cancel);
  // After the last step: the trained model into `params`, and the site's
  // mean loss and accuracy from every rank's summed `stats` (backend
  // memory), timed from `start`.
  StatusOr<train::TrainResult> Summarize(train::Model& model, std::span<float> params,
                                         const train::TrainOptions& options, double* stats,
                                         double start);

  int rank_ = 0, size_ = 1;
  uint64_t total_samples_ = 0;
  train::Backend* backend_ = nullptr;
  const train::DeviceDataset* data_ = nullptr;
  Env* env_ = nullptr;
  std::unique_ptr<collective::Transport> transport_;
  std::unique_ptr<collective::Communicator> comm_;
  collective::CollectiveOptions step_;  // Each training step's deadline.
  collective::CollectiveOptions idle_;  // Waiting for the next task.
  // A worker's model, rebuilt when the task's config changes.
  std::string model_config_;
  std::unique_ptr<train::Model> model_;
};

struct SiteWorkerOptions {
  net::GroupOptions group;  // rank >= 1.
  // Over tcp: this worker's key file, the site's allowlist directory and the
  // site client's .pub file (see net::GroupOptions).
  std::string identity, allow, master_key;
  std::string data;  // This worker's shard; it never leaves the site.
  std::string device = "auto";
  int threads = 1;
};

// `cohort site-worker`: joins the site and trains its tasks until the site's
// client says the run is over.
Status RunSiteWorker(const SiteWorkerOptions& options);

}  // namespace cohort::client

#endif  // COHORT_CLIENT_SITE_H_
