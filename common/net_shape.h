// The shapes of a sequential network: which layers it has, what each one
// takes and gives, and how many parameters and activation floats it needs.
// Plain arithmetic shared by the config check (proto/config_io) and the
// training engine (train/model), so both agree on every size.
//
// Activations are channel-last (H, W, C per sample): a convolution is then
// im2col followed by the same GEMM as a linear layer, and flatten is free.
#ifndef COHORT_COMMON_NET_SHAPE_H_
#define COHORT_COMMON_NET_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace cohort {

enum class LayerKind : uint8_t { kLinear, kConv2d, kMaxPool2d, kRelu, kFlatten };

const char* LayerKindName(LayerKind kind);  // "linear", "conv2d", ...

struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  uint32_t out = 0;      // linear: out_features; conv2d: out_channels.
  uint32_t kernel = 0;   // conv2d, max_pool2d: square kernel side.
  uint32_t stride = 1;   // conv2d, max_pool2d (a pool's default is its kernel).
  uint32_t padding = 0;  // conv2d: zeros on every side.
};

struct Shape {
  uint32_t c = 0, h = 1, w = 1;  // Channels, height, width.
  uint64_t size() const { return uint64_t{c} * h * w; }
  bool flat() const { return h == 1 && w == 1; }
};

struct NetSpec {
  Shape input;
  uint32_t num_classes = 10;
  std::vector<LayerSpec> layers;
};

struct LayerPlan {
  LayerSpec spec;
  Shape in, out;
  // linear: [out x in.c]; conv2d: [out_channels x kernel*kernel*in.c] (the
  // filter in (kh, kw, c) order); none for the other kinds.
  uint64_t weight_rows = 0, weight_cols = 0;
  uint64_t bias = 0;
  uint64_t params() const { return weight_rows * weight_cols + bias; }
  bool in_place() const {
    return spec.kind == LayerKind::kRelu || spec.kind == LayerKind::kFlatten;
  }
};

struct NetPlan {
  std::vector<LayerPlan> layers;
  uint64_t params = 0;
  // Floats one sample needs in a training step: the input, each layer's
  // output (in-place layers share their input's), im2col columns, pooling
  // indices, and two gradient buffers as wide as the widest layer output (no
  // gradient flows into the input).
  uint64_t step_floats_per_sample = 0;
};

// The most layers and the largest size anywhere in a plan; the bounds keep
// every product below 2^63.
inline constexpr size_t kMaxLayers = 64;
inline constexpr uint64_t kMaxActivation = uint64_t{1} << 26;  // Floats per sample.

// The layers of a preset: "mlp" (a linear layer per hidden width, ReLU
// after each, then linear(num_classes)), "logreg" (mlp without hidden
// layers), "lenet5" (NIID-Bench's LeNet: conv 6 5x5, ReLU, pool 2, conv 16
// 5x5, ReLU, pool 2, flatten, linear 120, ReLU, linear 84, ReLU,
// linear(num_classes)). Empty for an unknown name.
std::vector<LayerSpec> PresetLayers(const std::string& arch, uint32_t num_classes,
                                    const std::vector<uint32_t>& hidden = {});

// Infers every layer's shape. kInvalidArgument naming the layer
// ("layers[3] (conv2d): ...") and why: zero sizes, a kernel larger than its
// padded input, a linear layer on an unflattened image, an output that is
// not num_classes wide, too many layers or floats.
StatusOr<NetPlan> PlanNet(const NetSpec& spec);

// "1x28x28 -> conv2d(6, k5) -> relu -> ... -> linear(10)"
std::string DescribeNet(const NetSpec& spec);

}  // namespace cohort

#endif  // COHORT_COMMON_NET_SHAPE_H_
