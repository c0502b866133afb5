// Cohort's layer-list models under PyTorch's names and layouts: the one
// translation that `cohort.torch.load_run` and `cohort export` share.
//
// A native model (mlp, logreg, lenet5, or a sequential layer list) is the
// torch.nn.Sequential of the same layers, in the same order: linear ->
// nn.Linear, conv2d -> nn.Conv2d, max_pool2d -> nn.MaxPool2d, relu ->
// nn.ReLU, flatten -> nn.Flatten. Its state_dict names are "i.weight" and
// "i.bias" for the i-th layer, as in the flat vector. Two layouts differ:
//   - a conv2d filter is [out][kh][kw][in] in Cohort (channel-last im2col),
//     [out][in][kh][kw] in PyTorch;
//   - flatten reads an image channel-last in Cohort, (C, H, W) in PyTorch,
//     so the columns of the linear layer after it are permuted.
// A sample enters both as its features in (C, H, W) order (what a shard
// holds); PyTorch takes it shaped `input_shape`.
#ifndef COHORT_TRAIN_TORCH_LAYOUT_H_
#define COHORT_TRAIN_TORCH_LAYOUT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/net_shape.h"
#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::train {

// One torch.nn module with its constructor's arguments.
struct TorchModule {
  LayerKind kind = LayerKind::kRelu;
  // nn.Linear: in_features, out_features. nn.Conv2d: in_channels,
  // out_channels. Zero for the other kinds.
  uint32_t in = 0, out = 0;
  // nn.Conv2d, nn.MaxPool2d: square kernel side and stride; nn.Conv2d:
  // zero padding on every side.
  uint32_t kernel_size = 0, stride = 0, padding = 0;
};

// "Linear", "Conv2d", "MaxPool2d", "ReLU" or "Flatten": the torch.nn class.
const char* TorchClassName(LayerKind kind);
// The Python expression that builds the module, e.g.
// "nn.Conv2d(1, 6, kernel_size=5, stride=1, padding=0)".
std::string TorchModuleRepr(const TorchModule& module);

// One state_dict entry: a C-contiguous float32 tensor at `offset` in the
// PyTorch-ordered flat vector (the state_dict's tensors back to back).
struct TorchTensor {
  std::string name;             // "0.weight"
  std::vector<uint64_t> shape;  // [out, in] or [out, in, kh, kw]; [out] for a bias.
  uint64_t offset = 0;
  uint64_t size() const;
};

struct TorchLayout {
  // One sample as the first module takes it: [C, H, W] where the net works
  // on images, [features] where it is linear layers only.
  std::vector<uint64_t> input_shape;
  uint32_t num_classes = 0;
  std::vector<TorchModule> modules;  // nn.Sequential order.
  std::vector<TorchTensor> tensors;  // state_dict order.
  // torch[i] = native[native_index[i]]: a permutation of the flat vector.
  std::vector<uint64_t> native_index;
  uint64_t num_params() const { return native_index.size(); }
};

// The layout of a planned net. kInvalidArgument, naming the layer, for the
// nets PlanNet refuses and for the few it accepts that have no plain
// nn.Sequential equivalent (a conv2d or max_pool2d after the tensor was made
// flat; a linear layer on a 1x1 image that was never flattened).
StatusOr<TorchLayout> TorchLayoutFor(const NetSpec& spec);
// The same for a run's model section. kInvalidArgument naming
// model.external for a model the clients bring (Cohort holds no layer list
// for it), or the field NetFromConfig blames.
StatusOr<TorchLayout> TorchLayoutFor(const config::ModelConfig& model);

// Cohort's flat vector in PyTorch's order (the state_dict's tensors back to
// back), and back. kInvalidArgument naming both sizes on a length mismatch.
StatusOr<std::vector<float>> ToTorchOrder(const TorchLayout& layout, std::span<const float> native);
StatusOr<std::vector<float>> FromTorchOrder(const TorchLayout& layout,
                                            std::span<const float> torch);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_TORCH_LAYOUT_H_
