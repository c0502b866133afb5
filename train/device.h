// Picks the backend a process trains on from a --device flag.
#ifndef COHORT_TRAIN_DEVICE_H_
#define COHORT_TRAIN_DEVICE_H_

#include <memory>
#include <string>

#include "common/status.h"
#include "train/backend.h"

namespace cohort::train {

// True when this build has the CUDA backend (meson option `cuda`).
bool CudaBuilt();

struct DeviceOptions {
  std::string device = "auto";  // cpu | cuda | cuda:N | auto
  int threads = 1;              // CPU backend: BLAS threads.
  bool tf32 = false;            // CUDA backend: TF32 tensor-core GEMMs.
  // A data-parallel rank's index on its host (-1: none): "cuda" and "auto"
  // then take GPU local_rank modulo the host's GPUs, not GPU 0.
  int local_rank = -1;
};

// The GPU a local rank takes among `count`.
inline int GpuForLocalRank(int local_rank, int count) {
  return local_rank < 0 || count <= 0 ? 0 : local_rank % count;
}

// "auto" is cuda:0 (or the local rank's GPU) where a GPU is usable, else
// the CPU, and `note` (when not null) then says why the CPU was chosen.
// "cuda" is cuda:0 (or the local rank's GPU). An explicit
// cuda device that is missing or unusable is an error naming it (a daemon
// asked for a GPU it cannot have does not silently train elsewhere).
StatusOr<std::unique_ptr<Backend>> NewBackend(const DeviceOptions& options,
                                              std::string* note = nullptr);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_DEVICE_H_
