#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "aggregation/aggregator.h"
#include "common/bytes.h"

namespace cohort::aggregation {
namespace {

__extension__ using Int128 = __int128;

constexpr int kFractionBits = 40;
constexpr double kScale = 1099511627776.0;  // 2^40
constexpr uint64_t kMaxWeight = uint64_t{1} << 40;
// Bounds Σ weight · |value| · 2^40 below 2^125, inside the accumulators.
constexpr uint64_t kMaxTotalWeight = uint64_t{1} << 62;
static_assert(kScale == static_cast<double>(uint64_t{1} << kFractionBits));

class StreamingFedAvg final : public Aggregator {
 public:
  StreamingFedAvg(size_t num_params, double max_norm) : sum_(num_params, 0), max_norm_(max_norm) {}

  size_t frame_floats() const override { return sum_.size(); }
  bool masked() const override { return false; }

  Status Accept(uint32_t participant, std::span<const float> update, uint64_t weight) override {
    if (update.size() != sum_.size()) {
      return InvalidArgumentError("update has " + std::to_string(update.size()) +
                                  " values, expected " + std::to_string(sum_.size()));
    }
    if (weight == 0 || weight > kMaxWeight) {
      return InvalidArgumentError("update weight " + std::to_string(weight) +
                                  " is outside [1, 2^40]");
    }
    if (total_weight_ + weight > kMaxTotalWeight) {
      return InvalidArgumentError("the round's total weight would pass 2^62");
    }
    // One pass for the checks: the range (which also catches NaN and Inf)
    // and the squares for the norm.
    double squares = 0;  // Double: a float update's squares cannot overflow it.
    for (size_t i = 0; i < update.size(); ++i) {
      const float v = update[i];
      if (!(std::fabs(v) < kStreamingMaxValue)) return OutOfRange(update, i);
      squares += static_cast<double>(v) * v;
    }
    COHORT_RETURN_IF_ERROR(CheckNorm(std::sqrt(squares)));
    if (!seen_.insert(participant).second) {
      return AlreadyExistsError("client already sent an update this round");
    }
    // Exact: v · 2^40 is exact in double and below 2^63, its truncation to
    // an integer is a function of v alone, and the 128-bit sums cannot
    // overflow.
    const auto w = static_cast<Int128>(weight);
    Int128* sum = sum_.data();
    for (size_t i = 0; i < update.size(); ++i) {
      sum[i] += w * static_cast<int64_t>(static_cast<double>(update[i]) * kScale);
    }
    total_weight_ += weight;
    return OkStatus();
  }

  size_t accepted() const override { return seen_.size(); }

  StatusOr<RoundMean> Finalize() override {
    if (seen_.empty()) return FailedPreconditionError("no update was accepted");
    RoundMean mean;
    mean.delta.resize(sum_.size());
    const double denominator = kScale * static_cast<double>(total_weight_);
    for (size_t i = 0; i < sum_.size(); ++i) {
      mean.delta[i] = static_cast<float>(static_cast<double>(sum_[i]) / denominator);
    }
    return mean;
  }

 private:
  // Why a value failed the range check, in the order the checks are
  // documented: not finite, then the norm bound, then the range.
  Status OutOfRange(std::span<const float> update, size_t first) const {
    if (!AllFinite(update)) return InvalidArgumentError("update contains NaN or Inf values");
    double squares = 0;
    for (float v : update) squares += static_cast<double>(v) * v;
    COHORT_RETURN_IF_ERROR(CheckNorm(std::sqrt(squares)));
    return InvalidArgumentError("update value " + fmt::format("{}", update[first]) + " at index " +
                                std::to_string(first) +
                                " is outside (-2^23, 2^23), the range the exact sum holds");
  }

  Status CheckNorm(double norm) const {
    if (max_norm_ <= 0 || norm <= max_norm_) return OkStatus();
    char text[128];
    std::snprintf(text, sizeof(text), "update has L2 norm %.4g, above server.max_update_norm %.4g",
                  norm, max_norm_);
    return InvalidArgumentError(text);
  }

  std::vector<Int128> sum_;
  double max_norm_;
  uint64_t total_weight_ = 0;
  std::set<uint32_t> seen_;
};

}  // namespace

StatusOr<std::unique_ptr<Aggregator>> NewStreamingFedAvg(size_t num_params, double max_norm) {
  if (num_params == 0) return InvalidArgumentError("fedavg: zero parameters");
  return std::unique_ptr<Aggregator>(new StreamingFedAvg(num_params, max_norm));
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
