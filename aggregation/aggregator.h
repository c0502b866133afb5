// Combines the updates of one round into their weighted mean.
#ifndef COHORT_AGGREGATION_AGGREGATOR_H_
#define COHORT_AGGREGATION_AGGREGATOR_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"

namespace cohort::aggregation {

using ClientId = uint64_t;

// One instance per round; not thread-safe.
class Aggregator {
 public:
  virtual ~Aggregator() = default;
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // `update` is untrusted: kInvalidArgument on a length mismatch, non-finite
  // values or a weight that is not finite and > 0; kAlreadyExists on a
  // repeated client. A rejected update leaves the aggregator unchanged.
  // Never aborts.
  virtual Status Accept(ClientId client, std::span<const float> update, double weight) = 0;
  // Forgets `client`'s update (e.g. it turned out to be dropped). No-op if absent.
  virtual void Remove(ClientId client) = 0;
  virtual size_t accepted() const = 0;
  // Writes the weighted mean of the accepted updates into `out`. The result
  // does not depend on the order of Accept calls (bit for bit).
  // kFailedPrecondition when fewer than `min_updates` were accepted.
  virtual Status Finalize(std::span<float> out) = 0;

 protected:
  Aggregator() = default;
};

// Weighted FedAvg (weights are sample counts, McMahan et al. 2017). Holds
// every accepted update until Finalize and sums them in client-id order, so a
// replayed round gives the identical mean whatever order updates arrived in.
StatusOr<std::unique_ptr<Aggregator>> NewFedAvgAggregator(size_t num_params, size_t min_updates);

// Server optimizer applied to the aggregated delta (FedAvgM; Hsu et al. 2019):
//   velocity = momentum * velocity + mean_delta;  global += lr * velocity.
// With momentum 0 and lr 1 this is plain FedAvg. `velocity` is the server
// state checkpointed with the model; it is resized (zeroed) when empty.
struct ServerOptimizerOptions {
  float learning_rate = 1.0f;
  float momentum = 0.0f;
};
void ApplyServerUpdate(const ServerOptimizerOptions& options, std::span<const float> mean_delta,
                       std::span<float> global, std::vector<float>& velocity);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_AGGREGATOR_H_
