// The arithmetic both backends share, so the CPU loops and the CUDA kernels
// cannot drift apart: the optimizers' per-element updates and softmax
// cross-entropy per row.
#ifndef COHORT_TRAIN_RULES_H_
#define COHORT_TRAIN_RULES_H_

#include <math.h>

#include "train/backend.h"

#ifdef __CUDACC__
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif

namespace cohort::train {

// FedProx (Li et al. 2020): the gradient of (mu / 2) ||p - anchor||^2 added
// to the loss's gradient, before the optimizer's own rule (weight decay,
// momentum) as PyTorch's autograd would hand it to torch.optim.
COHORT_HOST_DEVICE inline float ProximalGradient(float g, float p, float anchor, float mu) {
  return g + mu * (p - anchor);
}

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

// Softmax cross-entropy of one row of logits: returns the loss and whether
// the argmax (first on ties) is `label`; with `d` (which may be `row`),
// writes grad_scale * (softmax - onehot) there.
COHORT_HOST_DEVICE inline float SoftmaxCrossEntropyRow(const float* row, int classes, int label,
                                                       float grad_scale, float* d, bool& correct) {
  int argmax = 0;
  float max = row[0];
  for (int j = 1; j < classes; ++j) {
    if (row[j] > max) {
      max = row[j];
      argmax = j;
    }
  }
  float sum = 0.0f;
  for (int j = 0; j < classes; ++j) sum += expf(row[j] - max);
  const float log_sum = logf(sum);
  const float loss = log_sum - (row[label] - max);
  correct = argmax == label;
  if (d != nullptr) {
    for (int j = 0; j < classes; ++j) d[j] = expf(row[j] - max - log_sum) * grad_scale;
    d[label] -= grad_scale;
  }
  return loss;
}

}  // namespace cohort::train

#endif  // COHORT_TRAIN_RULES_H_
