// The CUDA backend: cuBLAS for the GEMMs, plain kernels for the rest, one
// stream and one cuBLAS handle per backend. Compiled where nvcc exists
// (meson option `cuda`) into a plugin, libcohort_cuda.so, that links cudart
// and cuBLAS; train/device.cc loads it with dlopen only when a GPU is asked
// for and a driver exists. (Linked into the binary, cuBLAS's relocations
// alone cost every process, the coordinator included, ~140 MiB of RSS.)
#ifndef COHORT_TRAIN_CUDA_CUDA_BACKEND_H_
#define COHORT_TRAIN_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "common/status.h"
#include "train/backend.h"

namespace cohort::train {

// GPUs the driver reports; kUnavailable with the runtime's reason (e.g.
// "CUDA driver version is insufficient") where there is none usable.
StatusOr<int> CudaDeviceCount();

// A backend on GPU `device`. `tf32`: let cuBLAS use TF32 tensor cores for
// the GEMMs (FP32 inputs and accumulation, 10-bit mantissa products).
StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device, bool tf32);

// The plugin's entry point, looked up by dlsym: NewCudaBackend into *out.
using NewCudaBackendFn = void (*)(int device, bool tf32, StatusOr<std::unique_ptr<Backend>>* out);
inline constexpr const char* kCudaPluginEntry = "CohortNewCudaBackend";
// The second entry: CudaDeviceCount into *out.
using CudaDeviceCountFn = void (*)(StatusOr<int>* out);
inline constexpr const char* kCudaCountEntry = "CohortCudaDeviceCount";
inline constexpr const char* kCudaPluginFile = "libcohort_cuda.so";

}  // namespace cohort::train

#endif  // COHORT_TRAIN_CUDA_CUDA_BACKEND_H_
