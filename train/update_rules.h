// The optimizers' per-element update rules, shared by the CPU loops and the
// CUDA kernels so both backends apply the same arithmetic.
#ifndef COHORT_TRAIN_UPDATE_RULES_H_
#define COHORT_TRAIN_UPDATE_RULES_H_

#include <math.h>

#include "train/backend.h"

#ifdef __CUDACC__
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif

namespace cohort::train {

// torch.optim.SGD: g += wd p; b = g on the first step, else
// b = m b + (1 - dampening) g; g = g + m b (Nesterov) or b; p -= lr g.
// `b` is unused (may be null) when momentum is 0.
COHORT_HOST_DEVICE inline void SgdElement(float& p, float g, float* b, const SgdArgs& a) {
  const float gi = g + a.weight_decay * p;
  if (a.momentum == 0.0f) {
    p -= a.lr * gi;
    return;
  }
  *b = a.first_step ? gi : a.momentum * *b + (1.0f - a.dampening) * gi;
  p -= a.lr * (a.nesterov ? gi + a.momentum * *b : *b);
}

// torch.optim.Adam / AdamW (amsgrad off, maximize off):
// Adam:  g += wd p.   AdamW: p *= 1 - lr wd.
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
COHORT_HOST_DEVICE inline void AdamElement(float& p, float g, float& m, float& v,
                                           const AdamArgs& a) {
  if (a.decoupled) {
    p *= 1.0f - a.lr * a.weight_decay;
  } else {
    g += a.weight_decay * p;
  }
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  p -= a.step_size * m / (sqrtf(v) / a.root_correction + a.eps);
}

}  // namespace cohort::train

#endif  // COHORT_TRAIN_UPDATE_RULES_H_
