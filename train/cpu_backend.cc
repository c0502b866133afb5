#include <cblas.h>

#include "train/backend.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace cohort::train {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string Name() const override { return "cpu (OpenBLAS)"; }
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> NewCpuBackend(int threads) {
  if (threads < 1 || threads > 1024) {
    return InvalidArgumentError("cpu backend: threads must be in [1, 1024], got " +
                                std::to_string(threads));
  }
  // Small GEMMs (batch 32) run fastest on one thread: OpenBLAS's pool costs
  // more in wake-ups than it saves.
  openblas_set_num_threads(threads);
  return std::unique_ptr<Backend>(new CpuBackend());
}

}  // namespace cohort::train
