#include "aggregation/scaffold.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace cohort::aggregation {

Status ScaffoldClientVariate(std::span<const float> global, std::span<const float> local,
                             std::span<const float> c, std::span<const float> ci, uint64_t steps,
                             double learning_rate, std::span<float> ci_plus,
                             std::span<float> delta_c) {
  if (steps == 0) {
    return InvalidArgumentError(
        "train.scaffold: the trainer reports no local steps, so c_i+ = c_i - c + (x - y) / (K lr) "
        "has no K");
  }
  if (!(learning_rate > 0)) {
    return InvalidArgumentError("train.scaffold: learning rate " +
                                fmt::format("{:g}", learning_rate) + " is not > 0");
  }
  const double scale = 1.0 / (static_cast<double>(steps) * learning_rate);
  bool finite = true;
  for (size_t j = 0; j < global.size(); ++j) {
    const double next =
        static_cast<double>(ci[j]) - c[j] + (static_cast<double>(global[j]) - local[j]) * scale;
    ci_plus[j] = static_cast<float>(next);
    delta_c[j] = static_cast<float>(next - ci[j]);
    finite = finite && std::isfinite(ci_plus[j]) && std::isfinite(delta_c[j]);
  }
  if (!finite)
    return InvalidArgumentError("train.scaffold: the new control variate has NaN or Inf");
  return OkStatus();
}

Status ScaffoldServerVariate(std::span<const float> c, std::span<const double> sum_delta_c,
                             uint64_t population, std::span<float> c_new) {
  if (population == 0) return InvalidArgumentError("SCAFFOLD: no clients to average over (N = 0)");
  bool finite = true;
  for (size_t j = 0; j < c.size(); ++j) {
    c_new[j] = static_cast<float>(c[j] + sum_delta_c[j] / static_cast<double>(population));
    finite = finite && std::isfinite(c_new[j]);
  }
  if (!finite) return InvalidArgumentError("SCAFFOLD: the server's control variate is not finite");
  return OkStatus();
}

namespace {

class ScaffoldFedAvg final : public Aggregator {
 public:
  ScaffoldFedAvg(size_t num_params, std::unique_ptr<Aggregator> model,
                 std::unique_ptr<Aggregator> variate)
      : num_params_(num_params), model_(std::move(model)), variate_(std::move(variate)) {}

  size_t frame_floats() const override { return 2 * num_params_; }
  bool masked() const override { return false; }

  Status Accept(uint32_t participant, std::span<const float> frame, uint64_t weight) override {
    if (frame.size() != 2 * num_params_) {
      return InvalidArgumentError(
          "update has " + std::to_string(frame.size()) + " values, expected " +
          std::to_string(2 * num_params_) +
          " (train.scaffold: the delta, then the control variate's change)");
    }
    const std::span<const float> variate = frame.subspan(num_params_);
    for (size_t j = 0; j < variate.size(); ++j) {
      if (!(std::fabs(variate[j]) < kStreamingMaxValue)) {
        return InvalidArgumentError("train.scaffold: the control variate's change has value " +
                                    fmt::format("{}", variate[j]) + " at index " +
                                    std::to_string(j) + " (NaN, Inf or beyond 2^23)");
      }
    }
    COHORT_RETURN_IF_ERROR(model_->Accept(participant, frame.first(num_params_), weight));
    // Checked above, and the participant is new: this cannot fail.
    return variate_->Accept(participant, variate, 1);
  }

  size_t accepted() const override { return model_->accepted(); }

  StatusOr<RoundMean> Finalize() override {
    COHORT_ASSIGN_OR_RETURN(RoundMean out, model_->Finalize());
    COHORT_ASSIGN_OR_RETURN(RoundMean variate, variate_->Finalize());
    // The unweighted mean (exact to 2^-40 per value, rounded to float) times
    // the count: the sum.
    const double count = static_cast<double>(variate_->accepted());
    out.delta.reserve(2 * num_params_);
    for (float v : variate.delta) out.delta.push_back(static_cast<float>(v * count));
    return out;
  }

 private:
  size_t num_params_;
  std::unique_ptr<Aggregator> model_, variate_;
};

}  // namespace

StatusOr<std::unique_ptr<Aggregator>> NewScaffoldFedAvg(size_t num_params, double max_norm) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> model,
                          NewStreamingFedAvg(num_params, max_norm));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> variate, NewStreamingFedAvg(num_params, 0));
  return std::unique_ptr<Aggregator>(
      new ScaffoldFedAvg(num_params, std::move(model), std::move(variate)));
}

}  // namespace cohort::aggregation
