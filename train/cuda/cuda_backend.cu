// The CUDA backend (see cuda_backend.h). Every op is queued on the
// backend's stream; only Download, Sync and the reductions wait. The
// kernels are the CPU backend's loops, one thread per output element, so
// both give the same results up to the order of float additions.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#if COHORT_HAVE_NCCL
#include <nccl.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "train/cuda/cuda_backend.h"
#include "train/rules.h"

namespace cohort::train {
namespace {

constexpr int kThreads = 256;

int Blocks(size_t n) {
  return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 1u << 30));
}

std::string CudaError(cudaError_t e) { return std::string(cudaGetErrorString(e)); }

// ---- Kernels ---------------------------------------------------------------

// Grid-stride loops: any n, whatever the grid.
#define COHORT_FOR_EACH(i, n)                                             \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); \
       i += size_t(blockDim.x) * gridDim.x)

__global__ void BroadcastRowsKernel(const float* row, size_t rows, int cols, float* out) {
  COHORT_FOR_EACH(i, rows * cols) { out[i] = row[i % cols]; }
}

__global__ void ReluKernel(const float* x, float* y, size_t n) {
  COHORT_FOR_EACH(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

__global__ void ReluBackwardKernel(const float* y, float* dy, size_t n) {
  COHORT_FOR_EACH(i, n) { dy[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// cols[row][tap] with row = (b, oy, ox) and tap = (ky, kx, ch).
__global__ void Im2ColKernel(const float* x, ConvGeom g, int batch, float* cols) {
  const size_t k = size_t(g.kernel) * g.kernel * g.c;
  const size_t n = size_t(batch) * g.out_h * g.out_w * k;
  COHORT_FOR_EACH(i, n) {
    const size_t row = i / k;
    const int tap = int(i % k);
    const int ch = tap % g.c, kx = (tap / g.c) % g.kernel, ky = tap / (g.c * g.kernel);
    const int ox = int(row % g.out_w), oy = int(row / g.out_w % g.out_h);
    const size_t b = row / (size_t(g.out_w) * g.out_h);
    const int iy = oy * g.stride - g.padding + ky, ix = ox * g.stride - g.padding + kx;
    cols[i] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? x[((b * g.h + iy) * g.w + ix) * g.c + ch]
                                                         : 0.0f;
  }
}

// dx[b, iy, ix, ch] = the sum of every cols entry that read it: a gather
// per input, so no atomics.
__global__ void Col2ImKernel(const float* cols, ConvGeom g, int batch, float* dx) {
  const size_t k = size_t(g.kernel) * g.kernel * g.c;
  const size_t n = size_t(batch) * g.h * g.w * g.c;
  COHORT_FOR_EACH(i, n) {
    const int ch = int(i % g.c), ix = int(i / g.c % g.w), iy = int(i / (size_t(g.c) * g.w) % g.h);
    const size_t b = i / (size_t(g.c) * g.w * g.h);
    float sum = 0.0f;
    for (int ky = 0; ky < g.kernel; ++ky) {
      const int ty = iy + g.padding - ky;
      if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.out_h) continue;
      for (int kx = 0; kx < g.kernel; ++kx) {
        const int tx = ix + g.padding - kx;
        if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.out_w) continue;
        const size_t row = (b * g.out_h + ty / g.stride) * g.out_w + tx / g.stride;
        sum += cols[row * k + (size_t(ky) * g.kernel + kx) * g.c + ch];
      }
    }
    dx[i] = sum;
  }
}

__global__ void MaxPoolKernel(const float* x, PoolGeom g, int batch, float* y, int32_t* argmax) {
  const size_t n = size_t(batch) * g.out_h * g.out_w * g.c;
  const size_t in_sample = size_t(g.h) * g.w * g.c;
  COHORT_FOR_EACH(o, n) {
    const int ch = int(o % g.c), ox = int(o / g.c % g.out_w);
    const int oy = int(o / (size_t(g.c) * g.out_w) % g.out_h);
    const size_t b = o / (size_t(g.c) * g.out_w * g.out_h);
    const float* xs = x + b * in_sample;
    int32_t at = (oy * g.stride * g.w + ox * g.stride) * g.c + ch;
    float best = xs[at];
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = 0; kx < g.kernel; ++kx) {
        const int32_t i = ((oy * g.stride + ky) * g.w + ox * g.stride + kx) * g.c + ch;
        if (xs[i] > best) {  // Ties keep the first, as on the CPU.
          best = xs[i];
          at = i;
        }
      }
    }
    y[o] = best;
    argmax[o] = at;
  }
}

// Overlapping windows may route several gradients to one input: atomics.
__global__ void MaxPoolBackwardKernel(const float* dy, const int32_t* argmax, PoolGeom g, int batch,
                                      float* dx) {
  const size_t out_sample = size_t(g.out_h) * g.out_w * g.c;
  const size_t in_sample = size_t(g.h) * g.w * g.c;
  COHORT_FOR_EACH(o, size_t(batch) * out_sample) {
    atomicAdd(dx + o / out_sample * in_sample + argmax[o], dy[o]);
  }
}

// One thread per sample: classes are few.
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int batch,
                                          int classes, float grad_scale, float* dlogits,
                                          double* stats) {
  COHORT_FOR_EACH(i, size_t(batch)) {
    bool hit = false;
    const float loss =
        SoftmaxCrossEntropyRow(logits + i * classes, classes, labels[i], grad_scale,
                               dlogits == nullptr ? nullptr : dlogits + i * classes, hit);
    atomicAdd(stats, static_cast<double>(loss));
    if (hit) atomicAdd(stats + 1, 1.0);
  }
}

__global__ void GatherKernel(const float* features, const int32_t* labels, const uint32_t* index,
                             int count, int c, int h, int w, float* x, int32_t* y) {
  const size_t row = size_t(c) * h * w, plane = size_t(h) * w;
  COHORT_FOR_EACH(i, size_t(count) * row) {
    const size_t s = i / row, j = i % row;  // j: channel-last position.
    const size_t ch = j % c, p = j / c;
    x[i] = features[size_t(index[s]) * row + ch * plane + p];
    if (j == 0) y[s] = labels[index[s]];
  }
}

// The gradient with FedProx's proximal term where there is one (rules.h).
__device__ inline float WithProximal(const float* g, const float* p, size_t i,
                                     const ProximalArgs& prox) {
  return prox.anchor == nullptr ? g[i] : ProximalGradient(g[i], p[i], prox.anchor[i], prox.mu);
}

__global__ void SgdKernel(float* p, const float* g, float* b, size_t n, SgdArgs a) {
  COHORT_FOR_EACH(i, n) {
    SgdElement(p[i], WithProximal(g, p, i, a.proximal), b == nullptr ? nullptr : b + i, a);
  }
}

__global__ void AdamKernel(float* p, const float* g, float* m, float* v, size_t n, AdamArgs a) {
  COHORT_FOR_EACH(i, n) { AdamElement(p[i], WithProximal(g, p, i, a.proximal), m[i], v[i], a); }
}

__global__ void FillKernel(float* x, size_t n, float v) {
  COHORT_FOR_EACH(i, n) { x[i] = v; }
}

// ---- The backend
// -------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream, cublasHandle_t blas)
      : device_(device), stream_(stream), blas_(blas) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
#if COHORT_HAVE_NCCL
    AbortGroup();
#endif
    ones_ = {};
    pool_.Drain([](void* p, size_t) { cudaFree(p); });
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string Name() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    return "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
  }

  StatusOr<void*> Allocate(size_t bytes) override {
    if (void* p = pool_.Take(bytes)) return p;
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      // Give the pool's cached blocks back and try once more.
      cudaGetLastError();
      cudaStreamSynchronize(stream_);
      pool_.Drain([](void* q, size_t) { cudaFree(q); });
      e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      return ResourceExhaustedError("cuda:" + std::to_string(device_) + ": cannot allocate " +
                                    std::to_string(bytes) + " bytes: " + CudaError(e));
    }
    return p;
  }
  void Free(void* p, size_t bytes) override { pool_.Put(p, bytes); }
  void ReleaseCached() override {
    cudaStreamSynchronize(stream_);
    pool_.Drain([](void* p, size_t) { cudaFree(p); });
  }
  void Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
  }
  void Download(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
    cudaStreamSynchronize(stream_);
  }
  void Zero(void* dst, size_t bytes) override {
    if (bytes > 0) cudaMemsetAsync(dst, 0, bytes, stream_);
  }
  Status Sync() override {
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess)
      return InternalError("cuda:" + std::to_string(device_) + ": " + CudaError(e));
    return OkStatus();
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap
  // the operands, keep the transposes.
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cublasSgemm(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
  }
  void BroadcastRows(const float* row, int rows, int cols, float* out) override {
    const size_t n = size_t(rows) * cols;
    BroadcastRowsKernel<<<Blocks(n), kThreads, 0, stream_>>>(row, rows, cols, out);
  }
  // out = beta * out + alpha * x^T 1: a GEMV with a vector of ones.
  void ColumnSums(const float* x, int rows, int cols, float alpha, float beta,
                  float* out) override {
    const float* ones = Ones(rows);
    if (ones == nullptr) return;
    cublasSgemv(blas_, CUBLAS_OP_N, cols, rows, &alpha, x, cols, ones, 1, &beta, out, 1);
  }

  void Relu(const float* x, float* y, size_t n) override {
    ReluKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, y, n);
  }
  void ReluBackward(const float* y, float* dy, size_t n) override {
    ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(y, dy, n);
  }
  void ConvForward(const float* x, const float* w, const float* bias, const ConvGeom& g, int batch,
                   float* saved, float* y) override {
    const int pixels = batch * g.out_h * g.out_w, k = g.cols(), n = g.out_channels;
    BroadcastRows(bias, pixels, n, y);
    Im2ColKernel<<<Blocks(size_t(pixels) * k), kThreads, 0, stream_>>>(x, g, batch, saved);
    Gemm(false, true, pixels, n, k, 1.0f, saved, k, w, k, 1.0f, y, n);
  }
  void ConvBackward(const float* saved, const float* w, const float* dy, const ConvGeom& g,
                    int batch, float* scratch, float* dx, float* gw, float* gb, float alpha,
                    float beta) override {
    const int pixels = batch * g.out_h * g.out_w, k = g.cols(), n = g.out_channels;
    if (dx != nullptr) {
      Gemm(false, false, pixels, k, n, 1.0f, dy, n, w, k, 0.0f, scratch, k);
      const size_t in = size_t(batch) * g.h * g.w * g.c;
      Col2ImKernel<<<Blocks(in), kThreads, 0, stream_>>>(scratch, g, batch, dx);
    }
    Gemm(true, false, n, k, pixels, alpha, dy, n, saved, k, beta, gw, k);
    ColumnSums(dy, pixels, n, alpha, beta, gb);
  }
  void MaxPool(const float* x, const PoolGeom& g, int batch, float* y, int32_t* argmax) override {
    const size_t n = size_t(batch) * g.out_h * g.out_w * g.c;
    MaxPoolKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, g, batch, y, argmax);
  }
  void MaxPoolBackward(const float* dy, const int32_t* argmax, const PoolGeom& g, int batch,
                       float* dx) override {
    Zero(dx, sizeof(float) * batch * g.h * g.w * g.c);
    const size_t n = size_t(batch) * g.out_h * g.out_w * g.c;
    MaxPoolBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(dy, argmax, g, batch, dx);
  }
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int batch, int classes,
                           float grad_scale, float* dlogits, double* stats) override {
    SoftmaxCrossEntropyKernel<<<Blocks(batch), kThreads, 0, stream_>>>(
        logits, labels, batch, classes, grad_scale, dlogits, stats);
  }
  void Gather(const float* features, const int32_t* labels, const uint32_t* index, int count, int c,
              int h, int w, float* x, int32_t* y) override {
    const size_t n = size_t(count) * c * h * w;
    GatherKernel<<<Blocks(n), kThreads, 0, stream_>>>(features, labels, index, count, c, h, w, x,
                                                      y);
  }
  void SgdUpdate(float* p, const float* g, float* velocity, size_t n, const SgdArgs& a) override {
    SgdKernel<<<Blocks(n), kThreads, 0, stream_>>>(p, g, velocity, n, a);
  }
  void AdamUpdate(float* p, const float* g, float* m, float* v, size_t n,
                  const AdamArgs& a) override {
    AdamKernel<<<Blocks(n), kThreads, 0, stream_>>>(p, g, m, v, n, a);
  }

  void Axpy(float alpha, const float* x, float* y, size_t n) override {
    cublasSaxpy(blas_, static_cast<int>(n), &alpha, x, 1, y, 1);
  }

#if COHORT_HAVE_NCCL
  bool HasDeviceCollectives(int) const override { return true; }
  // The host's name and the GPU's PCI bus id, hashed (FNV-1a).
  uint64_t DeviceKey() const override {
    char bus[64] = {0}, host[256] = {0};
    cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device_);
    gethostname(host, sizeof(host) - 1);
    uint64_t h = 1469598103934665603ull;
    for (const char* p : {static_cast<const char*>(host), "|", static_cast<const char*>(bus)}) {
      for (; *p != 0; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
    }
    return h;
  }
  StatusOr<std::vector<uint8_t>> NewGroupId() override {
    ncclUniqueId id;
    const ncclResult_t e = ncclGetUniqueId(&id);
    if (e != ncclSuccess) return UnavailableError(Where() + "ncclGetUniqueId: " + NcclError(e));
    return std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal));
  }
  // A non-blocking communicator: every call returns at once and WaitGroup
  // polls it with a deadline, so a rank that never comes is a timeout, not
  // a hang.
  Status JoinGroup(std::span<const uint8_t> id, int rank, int world, int64_t timeout_ms) override {
    ncclUniqueId unique;
    if (id.size() != sizeof(unique.internal) || nccl_ != nullptr) {
      return InvalidArgumentError(Where() + "NCCL group id of " + std::to_string(id.size()) +
                                  " bytes, or a second group");
    }
    std::copy(id.begin(), id.end(), unique.internal);
    cudaSetDevice(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t e = ncclCommInitRankConfig(&nccl_, world, unique, rank, &config);
    const std::string what =
        "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(world) + ")";
    if (e != ncclSuccess && e != ncclInProgress) {
      AbortGroup();
      return UnavailableError(Where() + what + ": " + NcclError(e));
    }
    return WaitGroup(what, timeout_ms, false);
  }
  Status AllReduceSum(float* x, size_t n, int64_t timeout_ms) override {
    if (nccl_ == nullptr) {
      return FailedPreconditionError(Where() + "no NCCL group (never joined, or torn down)");
    }
    const ncclResult_t e = ncclAllReduce(x, x, n, ncclFloat32, ncclSum, nccl_, stream_);
    if (e != ncclSuccess && e != ncclInProgress) {
      const std::string text = NcclError(e);
      AbortGroup();
      return UnavailableError(Where() + "ncclAllReduce: " + text);
    }
    return WaitGroup("ncclAllReduce", timeout_ms, true);
  }
#endif

  double Dot(const float* a, const float* b, size_t n) override {
    float r = 0;
    cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_HOST);
    cublasSdot(blas_, static_cast<int>(n), a, 1, b, 1, &r);
    return r;
  }
  double Sum(const float* x, size_t n) override {
    const float* ones = Ones(n);
    return ones == nullptr ? std::nan("") : Dot(x, ones, n);
  }

 private:
  // A vector of at least n ones (grown on demand), or null when the device
  // is full.
  const float* Ones(size_t n) {
    if (ones_.size() < n) {
      StatusOr<DeviceArray<float>> a = DeviceArray<float>::Create(this, std::max<size_t>(n, 1024));
      if (!a.ok()) return nullptr;
      ones_ = std::move(*a);
      FillKernel<<<Blocks(ones_.size()), kThreads, 0, stream_>>>(ones_.data(), ones_.size(), 1.0f);
    }
    return ones_.data();
  }

  std::string Where() const { return "cuda:" + std::to_string(device_) + ": "; }
#if COHORT_HAVE_NCCL
  // Polls the group (and with `stream`, the stream's work) until it is
  // done, fails, or `timeout_ms` passes; a failure or a timeout tears the
  // group down.
  Status WaitGroup(const std::string& what, int64_t timeout_ms, bool stream) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(nccl_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        const std::string text = NcclError(state);
        AbortGroup();
        return UnavailableError(Where() + what + ": " + text);
      }
      if (state == ncclSuccess) {
        const cudaError_t q = stream ? cudaStreamQuery(stream_) : cudaSuccess;
        if (q == cudaSuccess) return OkStatus();
        if (q != cudaErrorNotReady) {
          AbortGroup();
          return InternalError(Where() + what + ": " + CudaError(q));
        }
      }
      if (std::chrono::steady_clock::now() >= end) {
        AbortGroup();
        return DeadlineExceededError(Where() + what + ": not done in " +
                                     std::to_string(timeout_ms) +
                                     " ms (a rank did not arrive); the NCCL group is torn down");
      }
      std::this_thread::yield();
    }
  }
#endif
  void AbortGroup() {
#if COHORT_HAVE_NCCL
    if (nccl_ != nullptr) ncclCommAbort(nccl_);
    nccl_ = nullptr;
#endif
  }
#if COHORT_HAVE_NCCL
  static std::string NcclError(ncclResult_t e) {
    std::string text = ncclGetErrorString(e);
    if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != 0) {
      text += std::string(" (") + last + ")";
    }
    return text;
  }
  ncclComm_t nccl_ = nullptr;
#endif

  int device_;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  BlockPool pool_;
  DeviceArray<float> ones_;
};

}  // namespace

StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError("no usable GPU: " + CudaError(e));
  }
  if (count == 0) return UnavailableError("no usable GPU: the driver reports none");
  return count;
}

StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device, bool tf32) {
  COHORT_ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (device < 0 || device >= count) {
    return NotFoundError("cuda:" + std::to_string(device) + ": this host has " +
                         std::to_string(count) + " GPU" + (count == 1 ? "" : "s") +
                         " (cuda:0 to cuda:" + std::to_string(count - 1) + ")");
  }
  cudaError_t e = cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    return UnavailableError("cuda:" + std::to_string(device) + ": " + CudaError(e));
  }
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return UnavailableError("cuda:" + std::to_string(device) + ": cuBLAS did not initialise");
  }
  cublasSetStream(blas, stream);
  cublasSetMathMode(blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
  return std::unique_ptr<Backend>(new CudaBackend(device, stream, blas));
}

}  // namespace cohort::train

extern "C" __attribute__((visibility("default"))) void CohortNewCudaBackend(
    int device, bool tf32, cohort::StatusOr<std::unique_ptr<cohort::train::Backend>>* out) {
  *out = cohort::train::NewCudaBackend(device, tf32);
}

extern "C" __attribute__((visibility("default"))) void CohortCudaDeviceCount(
    cohort::StatusOr<int>* out) {
  *out = cohort::train::CudaDeviceCount();
}
