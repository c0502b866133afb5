// The reference backend: OpenBLAS for GEMMs, plain loops for the rest.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "train/backend.h"
#include "train/rules.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace cohort::train {

namespace {

constexpr size_t kAlign = 64;

class CpuBackend final : public Backend {
 public:
  ~CpuBackend() override {
    pool_.Drain([](void* p, size_t) { std::free(p); });
  }
  std::string Name() const override { return "cpu (OpenBLAS)"; }
  bool HostMemory() const override { return true; }  // Every op runs as it is called.

  StatusOr<void*> Allocate(size_t bytes) override {
    if (void* p = pool_.Take(bytes)) return p;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      return ResourceExhaustedError("cpu backend: out of memory allocating " +
                                    std::to_string(bytes) + " bytes");
    }
    return p;
  }
  void Free(void* p, size_t bytes) override { pool_.Put(p, bytes); }
  void ReleaseCached() override {
    pool_.Drain([](void* p, size_t) { std::free(p); });
  }
  void Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void Download(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void Zero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }
  Status Sync() override { return OkStatus(); }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void BroadcastRows(const float* row, int rows, int cols, float* out) override {
    for (int r = 0; r < rows; ++r) std::memcpy(out + size_t(r) * cols, row, cols * sizeof(float));
  }
  void ColumnSums(const float* x, int rows, int cols, float alpha, float beta,
                  float* out) override {
    if (beta == 0.0f) std::fill(out, out + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* row = x + size_t(r) * cols;
      for (int j = 0; j < cols; ++j) out[j] += alpha * row[j];
    }
  }

  void Relu(const float* x, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
  void ReluBackward(const float* y, float* dy, size_t n) override {
    for (size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
  void ConvForward(const float* x, const float* w, const float* bias, const ConvGeom& g, int batch,
                   float* saved, float* y) override;
  void ConvBackward(const float* saved, const float* w, const float* dy, const ConvGeom& g,
                    int batch, float* scratch, float* dx, float* gw, float* gb, float alpha,
                    float beta) override;
  void MaxPool(const float* x, const PoolGeom& g, int batch, float* y, int32_t* argmax) override;
  void MaxPoolBackward(const float* dy, const int32_t* argmax, const PoolGeom& g, int batch,
                       float* dx) override;
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int batch, int classes,
                           float grad_scale, float* dlogits, double* stats) override;
  void Gather(const float* features, const int32_t* labels, const uint32_t* index, int count, int c,
              int h, int w, float* x, int32_t* y) override;
  void SgdUpdate(float* p, const float* g, float* velocity, size_t n, const SgdArgs& a) override;
  void AdamUpdate(float* p, const float* g, float* m, float* v, size_t n,
                  const AdamArgs& a) override;

  void Axpy(float alpha, const float* x, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
  // A group of one rank: its sum is its own vector.
  bool HasDeviceCollectives(int world) const override { return world == 1; }
  // Groups of one: every rank its own key (its process).
  uint64_t DeviceKey() const override { return uint64_t(getpid()); }
  StatusOr<std::vector<uint8_t>> NewGroupId() override { return std::vector<uint8_t>{1}; }
  Status JoinGroup(std::span<const uint8_t> id, int rank, int world, int64_t) override {
    if (id.size() != 1 || rank != 0 || world != 1) {
      return UnimplementedError("the CPU backend's device groups hold one rank");
    }
    return OkStatus();
  }
  Status AllReduceSum(float*, size_t, int64_t) override { return OkStatus(); }
  double Dot(const float* a, const float* b, size_t n) override {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += double{a[i]} * b[i];
    return s;
  }
  double Sum(const float* x, size_t n) override {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += x[i];
    return s;
  }

 private:
  BlockPool pool_;
};

// Visits every im2col row and kernel row: for output pixel `row` and kernel
// row ky, the taps kx in [kx0, kx1) read one contiguous run of input (the
// image is channel-last), so f(cols offset, input offset, floats) gets one
// call per run. Taps in the padding are skipped.
template <typename F>
void ForEachRun(const ConvGeom& g, int batch, F f) {
  const size_t cols = g.cols(), in_sample = size_t(g.h) * g.w * g.c;
  size_t row = 0;
  for (int b = 0; b < batch; ++b) {
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox, ++row) {
        const int x0 = ox * g.stride - g.padding;
        const int kx0 = std::max(0, -x0), kx1 = std::min(g.kernel, g.w - x0);
        if (kx0 >= kx1) continue;
        const size_t run = size_t(kx1 - kx0) * g.c;
        for (int ky = 0; ky < g.kernel; ++ky) {
          const int iy = oy * g.stride - g.padding + ky;
          if (iy < 0 || iy >= g.h) continue;
          f(row * cols + (size_t(ky) * g.kernel + kx0) * g.c,
            b * in_sample + (size_t(iy) * g.w + x0 + kx0) * g.c, run);
        }
      }
    }
  }
}

void Im2Col(const float* x, const ConvGeom& g, int batch, float* cols) {
  if (g.padding > 0) std::memset(cols, 0, sizeof(float) * batch * g.out_h * g.out_w * g.cols());
  ForEachRun(g, batch, [&](size_t to, size_t from, size_t n) {
    // Runs are short (kernel x channels floats): a plain loop beats memcpy.
    float* __restrict d = cols + to;
    const float* __restrict s = x + from;
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  });
}

void Col2Im(const float* cols, const ConvGeom& g, int batch, float* dx) {
  std::memset(dx, 0, sizeof(float) * batch * g.h * g.w * g.c);
  ForEachRun(g, batch, [&](size_t from, size_t to, size_t n) {
    float* __restrict d = dx + to;
    const float* __restrict s = cols + from;
    for (size_t i = 0; i < n; ++i) d[i] += s[i];
  });
}

// Single-channel input: im2col transposed, one row per tap over every
// output pixel (taps x pixels). Each row is a few long runs of the image,
// where the pixel-major layout would be runs of `kernel` floats. (The input
// gradient does not read it: it goes through a fresh pixel-major matrix.)
void Im2ColByTap(const float* x, const ConvGeom& g, int batch, float* cols) {
  const size_t pixels = size_t(batch) * g.out_h * g.out_w;
  for (int ky = 0; ky < g.kernel; ++ky) {
    for (int kx = 0; kx < g.kernel; ++kx) {
      float* __restrict row = cols + (size_t(ky) * g.kernel + kx) * pixels;
      for (int b = 0; b < batch; ++b) {
        const float* xs = x + size_t(b) * g.h * g.w;
        for (int oy = 0; oy < g.out_h; ++oy, row += g.out_w) {
          const int iy = oy * g.stride - g.padding + ky;
          if (iy < 0 || iy >= g.h) {
            std::fill(row, row + g.out_w, 0.0f);
            continue;
          }
          // Output columns whose tap lands inside the row: [ox0, ox1).
          const int shift = kx - g.padding;  // ix = ox * stride + shift
          const int ox0 = std::min(g.out_w, shift >= 0 ? 0 : (-shift + g.stride - 1) / g.stride);
          const int ox1 = std::max(ox0, std::min(g.out_w, (g.w - shift + g.stride - 1) / g.stride));
          std::fill(row, row + ox0, 0.0f);
          std::fill(row + ox1, row + g.out_w, 0.0f);
          const float* __restrict src = xs + size_t(iy) * g.w;
          if (g.stride == 1) {
            for (int ox = ox0; ox < ox1; ++ox) row[ox] = src[ox + shift];
          } else {
            for (int ox = ox0; ox < ox1; ++ox) row[ox] = src[ox * g.stride + shift];
          }
        }
      }
    }
  }
}

bool ByTap(const ConvGeom& g) { return g.c == 1; }

void CpuBackend::ConvForward(const float* x, const float* w, const float* bias, const ConvGeom& g,
                             int batch, float* saved, float* y) {
  // im2col, then the linear layer's GEMM over one row per output pixel:
  // y[pixels x out] = cols * w^T, on top of the bias (beta = 1).
  const int pixels = batch * g.out_h * g.out_w, k = g.cols(), n = g.out_channels;
  BroadcastRows(bias, pixels, n, y);
  if (ByTap(g)) {
    Im2ColByTap(x, g, batch, saved);
    Gemm(true, true, pixels, n, k, 1.0f, saved, pixels, w, k, 1.0f, y, n);
  } else {
    Im2Col(x, g, batch, saved);
    Gemm(false, true, pixels, n, k, 1.0f, saved, k, w, k, 1.0f, y, n);
  }
}

void CpuBackend::ConvBackward(const float* saved, const float* w, const float* dy,
                              const ConvGeom& g, int batch, float* scratch, float* dx, float* gw,
                              float* gb, float alpha, float beta) {
  const int pixels = batch * g.out_h * g.out_w, k = g.cols(), n = g.out_channels;
  // The input's gradient first: with gw = w it needs w before the update.
  if (dx != nullptr) {
    Gemm(false, false, pixels, k, n, 1.0f, dy, n, w, k, 0.0f, scratch, k);
    Col2Im(scratch, g, batch, dx);
  }
  if (ByTap(g)) {
    Gemm(true, true, n, k, pixels, alpha, dy, n, saved, pixels, beta, gw, k);
  } else {
    Gemm(true, false, n, k, pixels, alpha, dy, n, saved, k, beta, gw, k);
  }
  ColumnSums(dy, pixels, n, alpha, beta, gb);
}

void CpuBackend::MaxPool(const float* x, const PoolGeom& g, int batch, float* y, int32_t* argmax) {
  const size_t in_sample = size_t(g.h) * g.w * g.c;
  const int c = g.c;
  size_t o = 0;
  for (int b = 0; b < batch; ++b) {
    const float* xs = x + b * in_sample;
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox) {
        const int32_t first = (oy * g.stride * g.w + ox * g.stride) * c;
        // The running maximum stays in registers; ties keep the first.
        for (int ch = 0; ch < c; ++ch, ++o) {
          float best = xs[first + ch];
          int32_t at = first + ch;
          for (int ky = 0; ky < g.kernel; ++ky) {
            const int32_t row = ((oy * g.stride + ky) * g.w + ox * g.stride) * c + ch;
            for (int kx = 0; kx < g.kernel; ++kx) {
              // Branch-free: which input wins is data, not a pattern.
              const int32_t i = row + kx * c;
              const bool more = xs[i] > best;
              best = more ? xs[i] : best;
              at = more ? i : at;
            }
          }
          y[o] = best;
          argmax[o] = at;
        }
      }
    }
  }
}

void CpuBackend::MaxPoolBackward(const float* dy, const int32_t* argmax, const PoolGeom& g,
                                 int batch, float* dx) {
  const size_t in_sample = size_t(g.h) * g.w * g.c;
  const size_t out_sample = size_t(g.out_h) * g.out_w * g.c;
  std::memset(dx, 0, sizeof(float) * batch * in_sample);
  for (int b = 0; b < batch; ++b) {
    for (size_t o = 0; o < out_sample; ++o) {
      dx[b * in_sample + argmax[b * out_sample + o]] += dy[b * out_sample + o];
    }
  }
}

void CpuBackend::SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int batch,
                                     int classes, float grad_scale, float* dlogits, double* stats) {
  double loss = 0;
  uint64_t correct = 0;
  for (int i = 0; i < batch; ++i) {
    bool hit = false;
    loss +=
        SoftmaxCrossEntropyRow(logits + size_t(i) * classes, classes, labels[i], grad_scale,
                               dlogits == nullptr ? nullptr : dlogits + size_t(i) * classes, hit);
    correct += hit ? 1 : 0;
  }
  stats[0] += loss;
  stats[1] += static_cast<double>(correct);
}

void CpuBackend::Gather(const float* features, const int32_t* labels, const uint32_t* index,
                        int count, int c, int h, int w, float* x, int32_t* y) {
  const size_t row = size_t(c) * h * w, plane = size_t(h) * w;
  for (int i = 0; i < count; ++i) {
    const float* src = features + size_t(index[i]) * row;
    float* dst = x + size_t(i) * row;
    if (c == 1 || plane == 1) {
      std::memcpy(dst, src, row * sizeof(float));
    } else {
      for (size_t p = 0; p < plane; ++p) {
        for (int ch = 0; ch < c; ++ch) dst[p * c + ch] = src[ch * plane + p];
      }
    }
    y[i] = labels[index[i]];
  }
}

// The rules are train/rules.h's, shared with the CUDA kernels.
void CpuBackend::SgdUpdate(float* p, const float* g, float* b, size_t n, const SgdArgs& a) {
  // Without a proximal term the loops below are the ones before FedProx,
  // so such a step computes the same bits.
  if (const float* anchor = a.proximal.anchor; anchor != nullptr) {
    const float mu = a.proximal.mu;
    for (size_t i = 0; i < n; ++i) {
      SgdElement(p[i], ProximalGradient(g[i], p[i], anchor[i], mu),
                 a.momentum == 0.0f ? nullptr : b + i, a);
    }
    return;
  }
  if (a.momentum == 0.0f) {
    for (size_t i = 0; i < n; ++i) SgdElement(p[i], g[i], nullptr, a);
    return;
  }
  for (size_t i = 0; i < n; ++i) SgdElement(p[i], g[i], b + i, a);
}

void CpuBackend::AdamUpdate(float* p, const float* g, float* m, float* v, size_t n,
                            const AdamArgs& a) {
  if (const float* anchor = a.proximal.anchor; anchor != nullptr) {
    const float mu = a.proximal.mu;
    for (size_t i = 0; i < n; ++i) {
      AdamElement(p[i], ProximalGradient(g[i], p[i], anchor[i], mu), m[i], v[i], a);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) AdamElement(p[i], g[i], m[i], v[i], a);
}

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
