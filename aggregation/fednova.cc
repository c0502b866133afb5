#include "aggregation/fednova.h"

#include <algorithm>
#include <cmath>

namespace cohort::aggregation {

double FedNovaNorm(uint64_t steps, double momentum) {
  const double tau = static_cast<double>(steps);
  if (momentum == 0) return tau;
  // Σ_{t=1..tau} (1 - ρ^t) / (1 - ρ), in closed form.
  const double rho = momentum;
  return (tau - rho * (1 - std::pow(rho, tau)) / (1 - rho)) / (1 - rho);
}

bool NormaliseDelta(std::span<const float> after, std::span<const float> before, double norm,
                    std::span<float> out) {
  bool finite = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const float delta = after[i] - before[i];
    out[i] = static_cast<float>(static_cast<double>(delta) / norm);
    finite = finite && std::isfinite(out[i]);
  }
  return finite;
}

float FedNovaToSlot(double norm, float clip) {
  const double a = std::isfinite(norm) ? std::clamp(norm, 0.0, kMaxFedNovaNorm) : 0.0;
  return static_cast<float>(a / kMaxFedNovaNorm * clip);
}

double SlotToTauEff(float slot, float clip) {
  return static_cast<double>(slot) / clip * kMaxFedNovaNorm;
}

}  // namespace cohort::aggregation
