#include "aggregation/clipped_sum.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

namespace cohort::aggregation {
namespace {

// Keeps a clipped update's norm strictly inside the clip after rounding
// each scaled value to float (relative error 2^-24 per value).
constexpr double kClipMargin = 1.0 - 1.0 / (1 << 20);

class ClippedSum final : public Aggregator {
 public:
  ClippedSum(std::unique_ptr<Aggregator> sum, double clip_norm, uint32_t denominator)
      : sum_(std::move(sum)), clip_norm_(clip_norm), denominator_(denominator) {}

  size_t frame_floats() const override { return sum_->frame_floats(); }
  bool masked() const override { return false; }
  size_t accepted() const override { return sum_->accepted(); }

  Status Accept(uint32_t participant, std::span<const float> update, uint64_t) override {
    double squares = 0;
    for (float v : update) squares += static_cast<double>(v) * v;
    const double norm = std::sqrt(squares);
    // A wrong length or a NaN: the streaming sum's own error.
    if (update.size() != sum_->frame_floats() || !std::isfinite(norm)) {
      return sum_->Accept(participant, update, 1);
    }
    // Kept as it is only inside the margin the clipped path keeps: every
    // update summed is at most C(1 - 2^-20) long, whichever path it took,
    // so the rounding of the norm's own computation cannot let one past C.
    if (norm <= clip_norm_ * kClipMargin) return sum_->Accept(participant, update, 1);
    const double scale = clip_norm_ / norm * kClipMargin;
    std::vector<float> clipped(update.size());
    for (size_t i = 0; i < update.size(); ++i) {
      clipped[i] = static_cast<float>(static_cast<double>(update[i]) * scale);
    }
    return sum_->Accept(participant, clipped, 1);
  }

  StatusOr<RoundMean> Finalize() override {
    const size_t k = sum_->accepted();
    COHORT_ASSIGN_OR_RETURN(RoundMean mean, sum_->Finalize());
    // The streaming sum divides by the k accepted; the estimator divides by
    // the cohort, so a dropout counts as a zero update.
    const double rescale = static_cast<double>(k) / denominator_;
    for (float& v : mean.delta) v = static_cast<float>(static_cast<double>(v) * rescale);
    return mean;
  }

 private:
  std::unique_ptr<Aggregator> sum_;
  double clip_norm_;
  uint32_t denominator_;
};

}  // namespace

StatusOr<std::unique_ptr<Aggregator>> NewClippedSum(size_t num_params, double clip_norm,
                                                    uint32_t denominator) {
  if (!(clip_norm > 0) || std::isinf(clip_norm)) {
    return InvalidArgumentError("clipped sum: clip norm " + fmt::format("{}", clip_norm) +
                                " is not finite and > 0");
  }
  if (denominator == 0) return InvalidArgumentError("clipped sum: a denominator of 0");
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> sum, NewStreamingFedAvg(num_params));
  return std::unique_ptr<Aggregator>(new ClippedSum(std::move(sum), clip_norm, denominator));
}

}  // namespace cohort::aggregation
