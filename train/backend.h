// Compute backend for training. The CPU backend (OpenBLAS) is the reference;
// a GPU backend must match it on golden vectors.
#ifndef COHORT_TRAIN_BACKEND_H_
#define COHORT_TRAIN_BACKEND_H_

#include <memory>
#include <string>

#include "common/status.h"

namespace cohort::train {

// Not thread-safe: one backend per training thread.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string Name() const = 0;
  // Row-major C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is
  // m x k (A^T if trans_a) and op(B) is k x n (B^T if trans_b); lda, ldb, ldc
  // are the row strides of A, B, C as stored. With beta = 0, C is written
  // without being read (BLAS semantics): it may hold garbage, even NaN, as
  // Model::Backward's gradient buffer may.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;

 protected:
  Backend() = default;
};

// `threads`: BLAS threads (>= 1). Sets OpenBLAS's process-wide thread count.
StatusOr<std::unique_ptr<Backend>> NewCpuBackend(int threads = 1);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_BACKEND_H_
