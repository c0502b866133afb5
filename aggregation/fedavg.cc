#include <cmath>
#include <map>
#include <vector>

#include "aggregation/aggregator.h"
#include "common/bytes.h"

namespace cohort::aggregation {
namespace {

class FedAvgAggregator final : public Aggregator {
 public:
  FedAvgAggregator(size_t num_params, size_t min_updates)
      : num_params_(num_params), min_updates_(min_updates) {}

  Status Accept(ClientId client, std::span<const float> update, double weight) override {
    if (update.size() != num_params_) {
      return InvalidArgumentError("update has " + std::to_string(update.size()) +
                                  " values, expected " + std::to_string(num_params_));
    }
    if (!std::isfinite(weight) || weight <= 0) {
      return InvalidArgumentError("update weight " + std::to_string(weight) +
                                  " is not finite and > 0");
    }
    if (!AllFinite(update)) return InvalidArgumentError("update contains NaN or Inf values");
    if (updates_.count(client) != 0) {
      return AlreadyExistsError("client already sent an update this round");
    }
    updates_.emplace(client, Entry{std::vector<float>(update.begin(), update.end()), weight});
    return OkStatus();
  }

  void Remove(ClientId client) override { updates_.erase(client); }
  size_t accepted() const override { return updates_.size(); }

  Status Finalize(std::span<float> out) override {
    if (updates_.size() < min_updates_ || updates_.empty()) {
      return FailedPreconditionError(std::to_string(updates_.size()) +
                                     " updates accepted, need at least " +
                                     std::to_string(std::max<size_t>(min_updates_, 1)));
    }
    if (out.size() != num_params_) {
      return InvalidArgumentError("output has " + std::to_string(out.size()) +
                                  " values, expected " + std::to_string(num_params_));
    }
    double total = 0;
    for (const auto& [id, e] : updates_) total += e.weight;
    // Double accumulation in client-id order (std::map is sorted).
    std::vector<double> sum(num_params_, 0.0);
    for (const auto& [id, e] : updates_) {
      const double w = e.weight / total;
      const float* u = e.values.data();
      for (size_t i = 0; i < num_params_; ++i) sum[i] += w * u[i];
    }
    for (size_t i = 0; i < num_params_; ++i) out[i] = static_cast<float>(sum[i]);
    return OkStatus();
  }

 private:
  struct Entry {
    std::vector<float> values;
    double weight;
  };
  size_t num_params_;
  size_t min_updates_;
  std::map<ClientId, Entry> updates_;
};

}  // namespace

StatusOr<std::unique_ptr<Aggregator>> NewFedAvgAggregator(size_t num_params, size_t min_updates) {
  if (num_params == 0) return InvalidArgumentError("fedavg: zero parameters");
  return std::unique_ptr<Aggregator>(new FedAvgAggregator(num_params, min_updates));
}

void ApplyServerUpdate(const ServerOptimizerOptions& options, std::span<const float> mean_delta,
                       std::span<float> global, std::vector<float>& velocity) {
  const size_t n = global.size();
  if (options.momentum == 0.0f) {
    for (size_t i = 0; i < n; ++i) global[i] += options.learning_rate * mean_delta[i];
    return;
  }
  if (velocity.size() != n) velocity.assign(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    velocity[i] = options.momentum * velocity[i] + mean_delta[i];
    global[i] += options.learning_rate * velocity[i];
  }
}

}  // namespace cohort::aggregation
