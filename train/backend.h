// The compute backend: device memory and every op a training step runs.
// Parameters, gradients, optimizer state, activations and a client's shard
// live in backend memory; the host sees parameters only at the round
// boundary and metrics once per epoch. The CPU backend (OpenBLAS and plain
// loops) is the reference; the CUDA backend (train/cuda/) must match it on
// golden vectors.
//
// Every pointer an op takes is backend memory (on the CPU backend that is
// host memory). Ops are queued in order on one stream: Download and Sync
// wait for the ops before them; nothing else blocks. Activations are
// channel-last: sample, row, column, channel.
#ifndef COHORT_TRAIN_BACKEND_H_
#define COHORT_TRAIN_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace cohort::train {

// A convolution over [h, w, c] per sample (channel-last), out_channels
// filters of kernel x kernel x c taps in (kh, kw, c) order, output
// [out_h, out_w, out_channels]; taps in the padding read as 0.
struct ConvGeom {
  int c = 0, h = 0, w = 0;
  int kernel = 0, stride = 1, padding = 0;
  int out_h = 0, out_w = 0, out_channels = 0;
  int cols() const { return kernel * kernel * c; }  // Taps per filter.
  // Floats of workspace per sample: one im2col row per output pixel.
  size_t workspace() const { return size_t(out_h) * out_w * cols(); }
};

// Max pooling without padding over [h, w, c] per sample.
struct PoolGeom {
  int c = 0, h = 0, w = 0;
  int kernel = 0, stride = 0;
  int out_h = 0, out_w = 0;
};

// The update rules of torch.optim; see train/optimizer.h.
// FedProx's proximal term (rules.h ProximalGradient): with `anchor` (backend
// memory, n floats), the gradient gets + mu (p - anchor) first. Null: none.
struct ProximalArgs {
  const float* anchor = nullptr;
  float mu = 0;
};
struct SgdArgs {
  float lr = 0, weight_decay = 0, momentum = 0, dampening = 0;
  bool nesterov = false;
  bool first_step = true;  // The momentum buffer starts as the gradient.
  ProximalArgs proximal;
};
struct AdamArgs {
  float lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool decoupled = false;     // AdamW.
  float step_size = 0;        // lr / (1 - beta1^t)
  float root_correction = 0;  // sqrt(1 - beta2^t)
  ProximalArgs proximal;
};

// Not thread-safe: one backend per training thread.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string Name() const = 0;
  // Whether backend memory is host memory that the caller may read and write
  // directly between ops, every op being done when its call returns (the
  // CPU backend): then a host copy (Download, Upload) is only a memcpy.
  virtual bool HostMemory() const { return false; }

  // ---- Memory ----------------------------------------------------------
  // `bytes` of device memory, from the backend's pool (freed blocks are
  // reused, so a model rebuilt every round allocates nothing new).
  // kResourceExhausted naming the size when the device is full.
  virtual StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p, size_t bytes) = 0;
  // Gives the pool's cached (freed) blocks back to the system: for callers
  // whose allocations change size from one use to the next (the
  // simulator's per-client data), which the pool would otherwise keep.
  virtual void ReleaseCached() {}
  virtual void Upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void Download(void* dst, const void* src, size_t bytes) = 0;
  virtual void Zero(void* dst, size_t bytes) = 0;
  // Waits for every queued op; reports a device error (a kernel fault, an
  // out-of-memory inside a library) as kInternal.
  virtual Status Sync() = 0;

  // ---- Dense algebra ---------------------------------------------------
  // Row-major C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is
  // m x k (A^T if trans_a) and op(B) is k x n (B^T if trans_b); lda, ldb,
  // ldc are the row strides as stored. With beta = 0, C is written without
  // being read (BLAS semantics).
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;
  // out[r][j] = row[j] for r < rows (a bias before a GEMM with beta = 1).
  virtual void BroadcastRows(const float* row, int rows, int cols, float* out) = 0;
  // out[j] = beta * out[j] + alpha * sum_r x[r][j] (a bias gradient).
  virtual void ColumnSums(const float* x, int rows, int cols, float alpha, float beta,
                          float* out) = 0;

  // ---- Layers ----------------------------------------------------------
  // y = max(x, 0); y may be x.
  virtual void Relu(const float* x, float* y, size_t n) = 0;
  // dy[i] = y[i] > 0 ? dy[i] : 0 (y is the ReLU's output).
  virtual void ReluBackward(const float* y, float* dy, size_t n) = 0;
  // y = conv(x, w) + bias. `saved` (batch * g.workspace() floats) keeps
  // what ConvBackward needs (im2col on the CPU backend).
  virtual void ConvForward(const float* x, const float* w, const float* bias, const ConvGeom& g,
                           int batch, float* saved, float* y) = 0;
  // From dy (the output's gradient) and ConvForward's `saved`: dx (when not
  // null; overwritten, using `scratch` of batch * g.workspace() floats) and
  // gw = beta * gw + alpha * dL/dw, gb likewise. With gw = w (the fused SGD
  // step), dx is computed before w changes.
  virtual void ConvBackward(const float* saved, const float* w, const float* dy, const ConvGeom& g,
                            int batch, float* scratch, float* dx, float* gw, float* gb, float alpha,
                            float beta) = 0;
  // y = the window maxima; argmax = the input index (within the sample) of
  // each, for the backward pass.
  virtual void MaxPool(const float* x, const PoolGeom& g, int batch, float* y, int32_t* argmax) = 0;
  // dx = dy routed to each window's maximum (overwrites dx).
  virtual void MaxPoolBackward(const float* dy, const int32_t* argmax, const PoolGeom& g, int batch,
                               float* dx) = 0;
  // Softmax cross-entropy of `batch` rows of logits. Adds the summed loss
  // and the number of correct argmaxes to stats[0] and stats[1]; with
  // dlogits, writes grad_scale * (softmax - onehot) there (may be logits).
  virtual void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int batch,
                                   int classes, float grad_scale, float* dlogits,
                                   double* stats) = 0;
  // x[i] = features[index[i]] (rows of c*h*w floats in (c, h, w) order,
  // written channel-last), y[i] = labels[index[i]], for i < count.
  virtual void Gather(const float* features, const int32_t* labels, const uint32_t* index,
                      int count, int c, int h, int w, float* x, int32_t* y) = 0;

  // ---- Optimizer steps over n parameters --------------------------------
  // velocity may be null when momentum is 0.
  virtual void SgdUpdate(float* p, const float* g, float* velocity, size_t n, const SgdArgs& a) = 0;
  virtual void AdamUpdate(float* p, const float* g, float* m, float* v, size_t n,
                          const AdamArgs& a) = 0;

  // y[i] += alpha * x[i].
  virtual void Axpy(float alpha, const float* x, float* y, size_t n) = 0;

  // ---- Collectives across processes on device buffers --------------------
  // NCCL on the CUDA backend (where the plugin was built with it); the CPU
  // backend holds groups of one rank (nothing to sum: the data-parallel
  // step's device path, tested without a GPU); otherwise kUnimplemented,
  // and the ranks sum host buffers with collective/collective.h instead.
  // A group: rank 0 makes an id (NewGroupId), hands it to every rank out of
  // band, and each calls JoinGroup at once; then every rank calls
  // AllReduceSum with the same n, in the same order. Both wait at most
  // `timeout_ms`; after a timeout (a rank that never came) the group is
  // torn down and every later call fails.

  // Whether a group of `world` ranks of this backend can be made.
  virtual bool HasDeviceCollectives(int world) const {
    (void)world;
    return false;
  }
  // Which device this backend computes on, as a key equal for two backends
  // on one device (of one host): NCCL needs a device per rank.
  virtual uint64_t DeviceKey() const { return 0; }
  virtual StatusOr<std::vector<uint8_t>> NewGroupId() {
    return UnimplementedError(Name() + " has no device collectives");
  }
  virtual Status JoinGroup(std::span<const uint8_t> id, int rank, int world, int64_t timeout_ms) {
    (void)id, (void)rank, (void)world, (void)timeout_ms;
    return UnimplementedError(Name() + " has no device collectives");
  }
  // x[0, n) summed over the group's ranks, in place; returns when done.
  virtual Status AllReduceSum(float* x, size_t n, int64_t timeout_ms) {
    (void)x, (void)n, (void)timeout_ms;
    return UnimplementedError(Name() + " has no device collectives");
  }

  // ---- Reductions (they wait for the result) ----------------------------
  virtual double Dot(const float* a, const float* b, size_t n) = 0;
  virtual double Sum(const float* x, size_t n) = 0;

 protected:
  Backend() = default;
};

// An owned block of backend memory, returned to the pool when destroyed.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static StatusOr<DeviceArray> Create(Backend* backend, size_t n) {
    if (n == 0) return StatusOr<DeviceArray>(DeviceArray());
    if (n > SIZE_MAX / sizeof(T)) return ResourceExhaustedError("device array too large");
    COHORT_ASSIGN_OR_RETURN(void* p, backend->Allocate(n * sizeof(T)));
    return StatusOr<DeviceArray>(DeviceArray(backend, static_cast<T*>(p), n));
  }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      data_ = o.data_;
      size_ = o.size_;
      o.backend_ = nullptr;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  ~DeviceArray() { Reset(); }

  T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  DeviceArray(Backend* backend, T* data, size_t size)
      : backend_(backend), data_(data), size_(size) {}
  void Reset() {
    if (data_ != nullptr) backend_->Free(data_, bytes());
    data_ = nullptr;
    size_ = 0;
  }
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

// Freed blocks by size, for the backends' pools. Not thread-safe.
class BlockPool {
 public:
  // A cached block of exactly `bytes`, or null.
  void* Take(size_t bytes) {
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    cached_bytes_ -= bytes;
    return p;
  }
  void Put(void* p, size_t bytes) {
    free_.emplace(bytes, p);
    cached_bytes_ += bytes;
  }
  // Hands every cached block to `release`, emptying the pool.
  template <typename F>
  void Drain(F release) {
    for (auto& [bytes, p] : free_) release(p, bytes);
    free_.clear();
    cached_bytes_ = 0;
  }
  size_t cached_bytes() const { return cached_bytes_; }

 private:
  std::multimap<size_t, void*> free_;
  size_t cached_bytes_ = 0;
};

// `threads`: BLAS threads (>= 1). Sets OpenBLAS's process-wide thread count.
StatusOr<std::unique_ptr<Backend>> NewCpuBackend(int threads = 1);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_BACKEND_H_
