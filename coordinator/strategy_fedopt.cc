// FedAdam, FedYogi and FedAdagrad (Reddi et al. 2021, "Adaptive Federated
// Optimization", Algorithm 2): FedAvg whose server treats the round's
// aggregate delta Δ as a pseudo-gradient for an adaptive optimizer,
//   m = beta_1 m + (1 - beta_1) Δ
//   v = v + Δ²                                (FedAdagrad)
//   v = v - (1 - beta_2) Δ² sign(v - Δ²)      (FedYogi)
//   v = beta_2 v + (1 - beta_2) Δ²            (FedAdam)
//   model += learning_rate m / (sqrt(v) + tau)
// elementwise, from m = 0 and v = tau² (the paper's v_{-1} >= tau²). No
// bias correction: Algorithm 2 has none (Flower's FedAdam adds one).
//
// m and v (the model's size each) are the state: saved in the checkpoint as
// one `velocity` of twice the model's size, m first, with the steps taken
// in optimizer_steps.
#include <cmath>

#include "common/bytes.h"
#include "coordinator/strategy_fedavg.h"

namespace cohort::coordinator {
namespace {

enum class SecondMoment { kAdagrad, kYogi, kAdam };

const char* NameOf(SecondMoment kind) {
  switch (kind) {
    case SecondMoment::kAdagrad:
      return "FedAdagrad";
    case SecondMoment::kYogi:
      return "FedYogi";
    case SecondMoment::kAdam:
      return "FedAdam";
  }
  return "";
}

class FedOpt : public FedAvg {
 public:
  FedOpt(const config::RunConfig& config, Evaluator evaluator, SecondMoment kind)
      : FedAvg(config, std::move(evaluator)), kind_(kind) {}

  Status Aggregate(std::span<const float> mean_delta, std::span<float> model) override {
    const size_t n = model.size();
    const float tau = config().server().tau();
    staged_m_ = m_.empty() ? std::vector<float>(n, 0.0f) : m_;
    staged_v_ = v_.empty() ? std::vector<float>(n, tau * tau) : v_;
    Step(mean_delta, model);
    if (!AllFinite(staged_m_) || !AllFinite(staged_v_)) {
      return FailedPreconditionError(std::string("the ") + NameOf(kind_) +
                                     " server state (m, v) is not finite");
    }
    return OkStatus();
  }
  void CommitAggregate() override {
    m_ = std::move(staged_m_);
    v_ = std::move(staged_v_);
    ++steps_;
  }

  Status LoadState(const store::Checkpoint& checkpoint) override {
    const size_t n = checkpoint.model.size();
    const std::vector<float>& state = checkpoint.velocity;
    if (!state.empty() && state.size() != 2 * n) {
      return DataLossError("checkpoint of round " + std::to_string(checkpoint.round) +
                           ": a server optimizer state of " + std::to_string(state.size()) +
                           " values for " + std::to_string(n) + " parameters; " + NameOf(kind_) +
                           " keeps twice as many (m and v)");
    }
    m_.assign(state.begin(), state.begin() + static_cast<std::ptrdiff_t>(state.size() / 2));
    v_.assign(state.begin() + static_cast<std::ptrdiff_t>(state.size() / 2), state.end());
    steps_ = checkpoint.optimizer_steps;
    return OkStatus();
  }
  void SaveState(store::Checkpoint& checkpoint) const override {
    checkpoint.velocity = m_;
    checkpoint.velocity.insert(checkpoint.velocity.end(), v_.begin(), v_.end());
    checkpoint.optimizer_steps = steps_;
  }

 private:
  // One step on staged_m_, staged_v_ and `model`, each element in double
  // and rounded once to float, so the result depends only on the stored
  // floats: a resumed run takes the same step.
  void Step(std::span<const float> delta, std::span<float> model) {
    const config::ServerConfig& s = config().server();
    const double b1 = s.beta_1(), b2 = s.beta_2(), lr = s.learning_rate(), tau = s.tau();
    for (size_t i = 0; i < model.size(); ++i) {
      const double d = delta[i], d2 = d * d;
      const double m = b1 * staged_m_[i] + (1 - b1) * d;
      double v = staged_v_[i];
      switch (kind_) {
        case SecondMoment::kAdagrad:
          v += d2;
          break;
        case SecondMoment::kYogi:
          v -= (1 - b2) * d2 * static_cast<double>((v > d2) - (v < d2));
          break;
        case SecondMoment::kAdam:
          v = b2 * v + (1 - b2) * d2;
          break;
      }
      staged_m_[i] = static_cast<float>(m);
      staged_v_[i] = static_cast<float>(v);
      model[i] = static_cast<float>(model[i] + lr * m / (std::sqrt(v) + tau));
    }
  }

  SecondMoment kind_;
  std::vector<float> m_, v_;  // Empty until the first committed step.
  uint64_t steps_ = 0;
  std::vector<float> staged_m_, staged_v_;  // Aggregate's, until committed.
};

}  // namespace

StatusOr<std::unique_ptr<Strategy>> NewFedAdam(const config::RunConfig& config,
                                               Evaluator evaluator) {
  return std::unique_ptr<Strategy>(new FedOpt(config, std::move(evaluator), SecondMoment::kAdam));
}

StatusOr<std::unique_ptr<Strategy>> NewFedYogi(const config::RunConfig& config,
                                               Evaluator evaluator) {
  return std::unique_ptr<Strategy>(new FedOpt(config, std::move(evaluator), SecondMoment::kYogi));
}

StatusOr<std::unique_ptr<Strategy>> NewFedAdagrad(const config::RunConfig& config,
                                                  Evaluator evaluator) {
  return std::unique_ptr<Strategy>(
      new FedOpt(config, std::move(evaluator), SecondMoment::kAdagrad));
}

}  // namespace cohort::coordinator
