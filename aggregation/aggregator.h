// The aggregation layer: every way Cohort sums one flat vector per
// participant.
//
//   implementation                  who holds the sum    used by
//   NewStreamingFedAvg (fedavg.cc)  the hub              federated rounds, PLAIN
//   NewSecureAggregator (secagg.h)  the hub, masked      federated rounds, SECAGG(_PLUS)
//   NewRobustAggregator (robust.h)  the hub, each update federated rounds, PLAIN with
//                                                        server.robust (median, Krum, ...)
//   collective::Communicator        every rank           data-parallel steps
//     (collective/collective.h, a library of its own below net/)
//
// A hub sum is an `Aggregator`: the round engine hands it each selected
// client's update frame with the client's registered sample count, and
// asks it for the weighted mean when the round closes. Which one a round
// uses is the config's choice (secagg.aggregation): the round engine makes
// NewStreamingFedAvg for PLAIN and NewSecureAggregator otherwise, and then
// drives either through this interface only. (A PLAIN config with
// server.robust gets NewRobustAggregator instead of the streaming sum.)
// The peer collectives sum in place on every rank instead
// (collective/collective.h).
#ifndef COHORT_AGGREGATION_AGGREGATOR_H_
#define COHORT_AGGREGATION_AGGREGATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aggregation/fixed_point.h"
#include "common/status.h"

namespace cohort::aggregation {

class SecAggServer;

// What a round's sum comes to.
struct RoundMean {
  std::vector<float> delta;  // The weighted mean of the accepted updates.
  // Set when the training metrics are known only in aggregate (secure
  // rounds carry them inside the masked vector): their weighted means.
  std::optional<SecureMetrics> metrics;
  // Federated evaluation in a secure round: the test-sample-weighted means,
  // when any accepted client evaluated (fixed_point.h, SlotsToEval).
  std::optional<SecureEval> eval;
  // FedNova in a secure round: tau_eff = Σ n_k a_k / Σ n_k over the
  // accepted inputs, from the slot after the others (fednova.h).
  std::optional<double> fednova_tau_eff;
  // Adaptive clipping under distributed DP: the survivors' noised count of
  // unclipped updates, in count units (as privacy::DecodeClipCount).
  std::optional<double> dp_clip_count;
  // Observability for tests of secure rounds: the unmasked fixed-point sum.
  std::vector<uint32_t> masked_sum;
};

// One instance per round; not thread-safe. Never aborts on what a client
// sends.
class Aggregator {
 public:
  virtual ~Aggregator() = default;
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // Floats in an update's payload frame (the model size, plus metric slots
  // for a masked update).
  virtual size_t frame_floats() const = 0;
  // Whether updates arrive masked.
  virtual bool masked() const = 0;
  // One client's update frame, untrusted. `weight` is the sample count the
  // client was selected with, in [1, 2^40]. kInvalidArgument names what is
  // wrong; kAlreadyExists for a second update. A rejected update leaves the
  // sum unchanged.
  virtual Status Accept(uint32_t participant, std::span<const float> frame, uint64_t weight) = 0;
  virtual size_t accepted() const = 0;
  // The weighted mean of every accepted update. The result depends only on
  // the set of (update, weight) pairs, never on their order.
  virtual StatusOr<RoundMean> Finalize() = 0;
  // The secure-aggregation protocol's server for the stages around the
  // input (null for a plain sum).
  virtual SecAggServer* secagg() { return nullptr; }

 protected:
  Aggregator() = default;
};

// Weighted FedAvg (weights are sample counts, McMahan et al. 2017),
// streaming: each update is added into one exact fixed-point accumulator
// (2^-40 resolution, 128-bit integers) as it arrives and is not kept, so
// memory is 16 bytes per parameter whatever the number of clients, and the
// sum is exact, hence independent of arrival order (a replayed round gives
// the same mean bit for bit). Values beyond ±kStreamingMaxValue are
// refused. The mean is within 2^-40 of the exact weighted mean of the
// floats, before its final rounding to float. With `max_norm` > 0 an update
// whose L2 norm exceeds it is refused (server.max_update_norm).
inline constexpr double kStreamingMaxValue = 8388608.0;  // 2^23
StatusOr<std::unique_ptr<Aggregator>> NewStreamingFedAvg(size_t num_params, double max_norm = 0);

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
