// The hub's secure sum as an Aggregator: masked inputs go into
// SecAggServer's running sum; Finalize unmasks it and decodes the weighted
// means of the delta and of the training metrics behind it.
#include <algorithm>
#include <cstring>

#include "aggregation/aggregator.h"
#include "aggregation/fednova.h"
#include "aggregation/secagg.h"

namespace cohort::aggregation {
namespace {

class SecureAggregator final : public Aggregator {
 public:
  SecureAggregator(const SecAggParams& params, std::vector<crypto::Ed25519Public> identities,
                   const FixedPoint& fixed_point, double cohort_weight, size_t num_params, Env* env,
                   DistributedDpDecoding ddp)
      : server_(params, std::move(identities), env),
        fixed_point_(fixed_point),
        ddp_(ddp),
        cohort_weight_(cohort_weight),
        num_params_(num_params),
        count_words_(ddp.count_grid > 0 ? 1 : 0),
        length_(params.length) {}

  size_t frame_floats() const override { return length_; }
  bool masked() const override { return true; }

  Status Accept(uint32_t participant, std::span<const float> frame, uint64_t weight) override {
    // The float frame carries the masked uint32 words bit for bit.
    COHORT_RETURN_IF_ERROR(server_.OnMaskedInput(
        participant,
        {reinterpret_cast<const uint8_t*>(frame.data()), frame.size() * sizeof(float)}));
    weight_ += static_cast<double>(weight);
    ++accepted_;
    return OkStatus();
  }

  size_t accepted() const override { return accepted_; }

  StatusOr<RoundMean> Finalize() override {
    COHORT_ASSIGN_OR_RETURN(std::vector<uint32_t> sum, server_.Finalize());
    // Each client weighed its input by n_k / W (W: the cohort's registered
    // samples), so the sum is Σ over U4 of (n_k / W) · scale · x_k: divide
    // by scale · Σ n_k / W for the weighted means.
    std::vector<float> mean(sum.size());
    DecodeFixedPoint(sum, weight_ / cohort_weight_, fixed_point_, mean);
    if (ddp_.dp_grid > 0) {
      // The clients' noised integers: their sum over the grid and the cohort.
      for (size_t i = 0; i < num_params_; ++i) {
        mean[i] = static_cast<float>(static_cast<double>(static_cast<int32_t>(sum[i])) /
                                     ddp_.dp_grid / ddp_.dp_denominator);
      }
    }
    RoundMean out;
    if (count_words_ > 0) {
      // The survivors' bits and noise, signed, over the count's grid (as
      // privacy::DecodeClipCount, below this library).
      out.dp_clip_count =
          static_cast<double>(static_cast<int32_t>(sum[num_params_])) / ddp_.count_grid;
    }
    const std::span<const float> tail =
        std::span<const float>(mean).subspan(num_params_ + count_words_);
    out.metrics = SlotsToMetrics(tail.first(kSecureMetricSlots), fixed_point_.clip);
    // The slot counts 3, 3 + 3, 3 + 1 and 3 + 3 + 1 are distinct, so the
    // length says which follow the metrics (NewSecureAggregator checks it).
    const bool fednova = (tail.size() - kSecureMetricSlots) % kSecureEvalSlots != 0;
    if (tail.size() - (fednova ? kSecureFedNovaSlots : 0) ==
        kSecureMetricSlots + kSecureEvalSlots) {
      out.eval = SlotsToEval(tail.subspan(kSecureMetricSlots, kSecureEvalSlots), fixed_point_.clip,
                             weight_);
    }
    if (fednova) out.fednova_tau_eff = SlotToTauEff(tail.back(), fixed_point_.clip);
    mean.resize(num_params_);
    out.delta = std::move(mean);
    out.masked_sum = std::move(sum);
    return out;
  }

  SecAggServer* secagg() override { return &server_; }

 private:
  SecAggServer server_;
  FixedPoint fixed_point_;
  DistributedDpDecoding ddp_;
  double cohort_weight_;
  size_t num_params_;
  size_t count_words_;  // 1: adaptive clipping's count word after the delta.
  size_t length_;       // num_params_, the count word and the metric (and evaluation) slots.
  double weight_ = 0;   // Σ n_k over the accepted inputs.
  size_t accepted_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Aggregator>> NewSecureAggregator(
    const SecAggParams& params, std::vector<crypto::Ed25519Public> identities,
    const FixedPoint& fixed_point, double cohort_weight, size_t num_params, Env* env,
    DistributedDpDecoding ddp) {
  if (num_params == 0) return InvalidArgumentError("secure aggregation: zero parameters");
  const size_t words = num_params + (ddp.count_grid > 0 ? 1 : 0);
  const size_t slots = params.length - std::min(params.length, words);
  if (slots != kSecureMetricSlots && slots != kSecureMetricSlots + kSecureEvalSlots &&
      slots != kSecureMetricSlots + kSecureFedNovaSlots &&
      slots != kSecureMetricSlots + kSecureEvalSlots + kSecureFedNovaSlots) {
    return InvalidArgumentError("secure aggregation: vector length " +
                                std::to_string(params.length) + " for " +
                                std::to_string(num_params) + " parameters");
  }
  if (!(cohort_weight > 0)) return InvalidArgumentError("secure aggregation: cohort weight 0");
  if (ddp.dp_grid > 0 && !(ddp.dp_denominator >= 1)) {
    return InvalidArgumentError("secure aggregation: distributed DP over an empty cohort");
  }
  if (ddp.count_grid > 0 && !(ddp.dp_grid > 0)) {
    return InvalidArgumentError("secure aggregation: a clipped-count word without distributed DP");
  }
  return std::unique_ptr<Aggregator>(new SecureAggregator(
      params, std::move(identities), fixed_point, cohort_weight, num_params, env, ddp));
}

}  // namespace cohort::aggregation
