#include "train/torch_layout.h"

#include "proto/config_io.h"

namespace cohort::train {
namespace {

// Appends the native indices of a [rows x cols] weight whose PyTorch column
// j reads native column col(j), then its identity-ordered bias.
template <typename Col>
void AppendWeightAndBias(uint64_t native_offset, uint64_t rows, uint64_t cols, Col col,
                         std::vector<uint64_t>& index) {
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t j = 0; j < cols; ++j) index.push_back(native_offset + r * cols + col(j));
  }
  const uint64_t bias = native_offset + rows * cols;
  for (uint64_t r = 0; r < rows; ++r) index.push_back(bias + r);
}

// The weight and bias entries of parameter layer `i` (the state_dict's
// names), at the end of what `layout` holds so far.
void AddTensors(size_t i, std::vector<uint64_t> weight_shape, uint64_t bias, TorchLayout& layout) {
  const uint64_t offset = layout.native_index.size();
  TorchTensor weight{std::to_string(i) + ".weight", std::move(weight_shape), offset};
  TorchTensor b{std::to_string(i) + ".bias", {bias}, offset + weight.size()};
  layout.tensors.push_back(std::move(weight));
  layout.tensors.push_back(std::move(b));
}

// A conv2d's filters: PyTorch's [out][in][kh][kw] from Cohort's
// [out][kh][kw][in].
void AddConv(size_t i, const LayerPlan& p, uint64_t native_offset, TorchLayout& layout) {
  const uint64_t c = p.in.c, k = p.spec.kernel;
  AddTensors(i, {p.out.c, c, k, k}, p.bias, layout);
  AppendWeightAndBias(
      native_offset, p.weight_rows, p.weight_cols,
      [c, k](uint64_t j) {
        const uint64_t ch = j / (k * k), ky = j / k % k, kx = j % k;
        return (ky * k + kx) * c + ch;
      },
      layout.native_index);
}

// A linear layer; `flattened` is the image a flatten before it read, whose
// channel-last order Cohort's columns follow and PyTorch's (C, H, W) does
// not (c == 0: none; the columns keep their order).
void AddLinear(size_t i, const LayerPlan& p, const Shape& flattened, uint64_t native_offset,
               TorchLayout& layout) {
  AddTensors(i, {p.weight_rows, p.weight_cols}, p.bias, layout);
  const Shape image = flattened.c != 0 ? flattened : Shape{p.in.c, 1, 1};
  const uint64_t c = image.c, plane = uint64_t{image.h} * image.w;
  AppendWeightAndBias(
      native_offset, p.weight_rows, p.weight_cols,
      [c, plane](uint64_t j) { return j % plane * c + j / plane; }, layout.native_index);
}

TorchModule ModuleOf(const LayerPlan& p) {
  TorchModule m{p.spec.kind};
  if (p.spec.kind == LayerKind::kLinear || p.spec.kind == LayerKind::kConv2d) {
    m.in = p.in.c;
    m.out = p.out.c;
  }
  if (p.spec.kind == LayerKind::kConv2d || p.spec.kind == LayerKind::kMaxPool2d) {
    m.kernel_size = p.spec.kernel;
    m.stride = p.spec.stride;
    m.padding = p.spec.padding;
  }
  return m;
}

// Whether PyTorch takes the input as an image: it is one, or a conv2d or
// max_pool2d reads it before anything makes it flat.
bool TakesImage(const NetSpec& spec) {
  if (!spec.input.flat()) return true;
  for (const LayerSpec& l : spec.layers) {
    if (l.kind == LayerKind::kConv2d || l.kind == LayerKind::kMaxPool2d) return true;
    if (l.kind == LayerKind::kLinear || l.kind == LayerKind::kFlatten) return false;
  }
  return false;
}

}  // namespace

const char* TorchClassName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kLinear:
      return "Linear";
    case LayerKind::kConv2d:
      return "Conv2d";
    case LayerKind::kMaxPool2d:
      return "MaxPool2d";
    case LayerKind::kRelu:
      return "ReLU";
    case LayerKind::kFlatten:
      return "Flatten";
  }
  return "Unknown";
}

std::string TorchModuleRepr(const TorchModule& m) {
  const std::string head = std::string("nn.") + TorchClassName(m.kind) + "(";
  switch (m.kind) {
    case LayerKind::kLinear:
      return head + std::to_string(m.in) + ", " + std::to_string(m.out) + ")";
    case LayerKind::kConv2d:
      return head + std::to_string(m.in) + ", " + std::to_string(m.out) +
             ", kernel_size=" + std::to_string(m.kernel_size) +
             ", stride=" + std::to_string(m.stride) + ", padding=" + std::to_string(m.padding) +
             ")";
    case LayerKind::kMaxPool2d:
      return head + "kernel_size=" + std::to_string(m.kernel_size) +
             ", stride=" + std::to_string(m.stride) + ")";
    default:
      return head + ")";
  }
}

uint64_t TorchTensor::size() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

StatusOr<TorchLayout> TorchLayoutFor(const NetSpec& spec) {
  COHORT_ASSIGN_OR_RETURN(NetPlan plan, PlanNet(spec));
  TorchLayout layout;
  layout.num_classes = spec.num_classes;
  bool image = TakesImage(spec);
  layout.input_shape = image ? std::vector<uint64_t>{spec.input.c, spec.input.h, spec.input.w}
                             : std::vector<uint64_t>{spec.input.size()};
  layout.native_index.reserve(plan.params);
  Shape flattened{0, 0, 0};  // The image the last flatten read (c == 0: none).
  uint64_t native_offset = 0;
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const LayerPlan& p = plan.layers[i];
    const std::string where =
        "layers[" + std::to_string(i) + "] (" + LayerKindName(p.spec.kind) + "): ";
    switch (p.spec.kind) {
      case LayerKind::kConv2d:
      case LayerKind::kMaxPool2d:
        if (!image) {
          return InvalidArgumentError(where +
                                      "reads a flat tensor, which PyTorch's nn.Sequential "
                                      "cannot feed it without an nn.Unflatten");
        }
        if (p.spec.kind == LayerKind::kConv2d) AddConv(i, p, native_offset, layout);
        break;
      case LayerKind::kLinear:
        if (image) {
          return InvalidArgumentError(where + "reads a " + std::to_string(p.in.c) +
                                      "x1x1 image in PyTorch; put a flatten before it");
        }
        AddLinear(i, p, flattened, native_offset, layout);
        flattened = Shape{0, 0, 0};
        break;
      case LayerKind::kFlatten:
        if (image) flattened = p.in;
        image = false;
        break;
      case LayerKind::kRelu:
        break;
    }
    layout.modules.push_back(ModuleOf(p));
    native_offset += p.params();
  }
  return layout;
}

StatusOr<TorchLayout> TorchLayoutFor(const config::ModelConfig& model) {
  if (model.has_external()) {
    return InvalidArgumentError(
        "model.external: the run's model is the clients' own (external), not a Cohort layer "
        "list; load it with the clients' PyTorch code and the flat vector");
  }
  COHORT_ASSIGN_OR_RETURN(NetSpec spec, config::NetFromConfig(model));
  StatusOr<TorchLayout> layout = TorchLayoutFor(spec);
  if (!layout.ok()) return layout.status().WithContext("model");
  return layout;
}

StatusOr<std::vector<float>> ToTorchOrder(const TorchLayout& layout,
                                          std::span<const float> native) {
  if (native.size() != layout.num_params()) {
    return InvalidArgumentError("model: " + std::to_string(native.size()) +
                                " parameters given, the model has " +
                                std::to_string(layout.num_params()));
  }
  std::vector<float> torch(native.size());
  for (size_t i = 0; i < torch.size(); ++i) torch[i] = native[layout.native_index[i]];
  return torch;
}

StatusOr<std::vector<float>> FromTorchOrder(const TorchLayout& layout,
                                            std::span<const float> torch) {
  if (torch.size() != layout.num_params()) {
    return InvalidArgumentError("model: " + std::to_string(torch.size()) +
                                " parameters given, the model has " +
                                std::to_string(layout.num_params()));
  }
  std::vector<float> native(torch.size());
  for (size_t i = 0; i < torch.size(); ++i) native[layout.native_index[i]] = torch[i];
  return native;
}

}  // namespace cohort::train
