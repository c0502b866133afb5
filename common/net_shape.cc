#include "common/net_shape.h"

#include <algorithm>

namespace cohort {

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kLinear:
      return "linear";
    case LayerKind::kConv2d:
      return "conv2d";
    case LayerKind::kMaxPool2d:
      return "max_pool2d";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kFlatten:
      return "flatten";
  }
  return "unknown";
}

namespace {

std::string ShapeText(const Shape& s) {
  return std::to_string(s.c) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w);
}

// Output side of a window sweep, or 0 when the window does not fit.
uint32_t Sweep(uint32_t in, uint32_t kernel, uint32_t stride, uint32_t padding) {
  const uint64_t padded = uint64_t{in} + 2 * uint64_t{padding};
  if (kernel == 0 || stride == 0 || kernel > padded) return 0;
  return static_cast<uint32_t>((padded - kernel) / stride + 1);
}

Status CheckWindow(const LayerSpec& l, const Shape& in) {
  if (l.kernel == 0 || l.kernel > 64) return InvalidArgumentError("kernel must be in [1, 64]");
  if (l.stride == 0 || l.stride > 64) return InvalidArgumentError("stride must be in [1, 64]");
  if (l.padding >= l.kernel) {
    return InvalidArgumentError("padding " + std::to_string(l.padding) +
                                " must be smaller than the kernel " + std::to_string(l.kernel));
  }
  if (Sweep(in.h, l.kernel, l.stride, l.padding) == 0 ||
      Sweep(in.w, l.kernel, l.stride, l.padding) == 0) {
    return InvalidArgumentError("kernel " + std::to_string(l.kernel) + " does not fit the input " +
                                ShapeText(in) + " (padding " + std::to_string(l.padding) + ")");
  }
  return OkStatus();
}

// Fills plan.out, the weight shape and the bias of one layer.
Status PlanLayer(LayerPlan& p) {
  const LayerSpec& l = p.spec;
  const Shape& in = p.in;
  switch (l.kind) {
    case LayerKind::kLinear:
      if (!in.flat()) {
        return InvalidArgumentError("takes a flat input, got " + ShapeText(in) +
                                    "; put a flatten before it");
      }
      if (l.out == 0 || l.out > (1u << 20)) {
        return InvalidArgumentError("out_features must be in [1, 2^20]");
      }
      p.out = Shape{l.out, 1, 1};
      p.weight_rows = l.out;
      p.weight_cols = in.c;
      p.bias = l.out;
      return OkStatus();
    case LayerKind::kConv2d:
      if (l.out == 0 || l.out > 65536) {
        return InvalidArgumentError("out_channels must be in [1, 65536]");
      }
      COHORT_RETURN_IF_ERROR(CheckWindow(l, in));
      p.out = Shape{l.out, Sweep(in.h, l.kernel, l.stride, l.padding),
                    Sweep(in.w, l.kernel, l.stride, l.padding)};
      p.weight_rows = l.out;
      p.weight_cols = uint64_t{l.kernel} * l.kernel * in.c;
      p.bias = l.out;
      return OkStatus();
    case LayerKind::kMaxPool2d:
      if (l.padding != 0) return InvalidArgumentError("padding is not supported");
      COHORT_RETURN_IF_ERROR(CheckWindow(l, in));
      p.out = Shape{in.c, Sweep(in.h, l.kernel, l.stride, 0), Sweep(in.w, l.kernel, l.stride, 0)};
      return OkStatus();
    case LayerKind::kRelu:
      p.out = in;
      return OkStatus();
    case LayerKind::kFlatten:
      if (in.size() > UINT32_MAX) return InvalidArgumentError("input too large");
      p.out = Shape{static_cast<uint32_t>(in.size()), 1, 1};
      return OkStatus();
  }
  return InvalidArgumentError("unknown layer kind");
}

// The step-float count of a finished plan (see NetPlan).
uint64_t StepFloats(const NetSpec& spec, const std::vector<LayerPlan>& layers) {
  uint64_t total = spec.input.size(), widest = 0;
  for (const LayerPlan& p : layers) {
    widest = std::max(widest, p.out.size());
    if (!p.in_place()) total += p.out.size();
    if (p.spec.kind == LayerKind::kConv2d) total += p.out.h * uint64_t{p.out.w} * p.weight_cols;
    if (p.spec.kind == LayerKind::kMaxPool2d) total += p.out.size();
  }
  return total + 2 * widest;
}

}  // namespace

std::vector<LayerSpec> PresetLayers(const std::string& arch, uint32_t num_classes,
                                    const std::vector<uint32_t>& hidden) {
  const LayerSpec relu{LayerKind::kRelu};
  auto linear = [](uint32_t out) { return LayerSpec{LayerKind::kLinear, out}; };
  if (arch == "lenet5") {
    const LayerSpec pool{LayerKind::kMaxPool2d, 0, 2, 2};
    return {LayerSpec{LayerKind::kConv2d, 6, 5},
            relu,
            pool,
            LayerSpec{LayerKind::kConv2d, 16, 5},
            relu,
            pool,
            LayerSpec{LayerKind::kFlatten},
            linear(120),
            relu,
            linear(84),
            relu,
            linear(num_classes)};
  }
  if (arch != "mlp" && arch != "logreg") return {};
  std::vector<LayerSpec> layers;
  for (uint32_t h : hidden) {
    layers.push_back(linear(h));
    layers.push_back(relu);
  }
  layers.push_back(linear(num_classes));
  return layers;
}

StatusOr<NetPlan> PlanNet(const NetSpec& spec) {
  if (spec.input.c == 0 || spec.input.h == 0 || spec.input.w == 0 ||
      spec.input.size() > kMaxActivation) {
    return InvalidArgumentError("input_shape " + ShapeText(spec.input) +
                                ": every side must be >= 1 and the product <= 2^26");
  }
  if (spec.num_classes < 2) return InvalidArgumentError("num_classes must be >= 2");
  if (spec.layers.empty() || spec.layers.size() > kMaxLayers) {
    return InvalidArgumentError("layers: must hold 1 to " + std::to_string(kMaxLayers) +
                                " layers, got " + std::to_string(spec.layers.size()));
  }
  NetPlan plan;
  Shape shape = spec.input;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    LayerPlan p{spec.layers[i], shape, {}};
    const std::string where =
        "layers[" + std::to_string(i) + "] (" + LayerKindName(p.spec.kind) + ")";
    COHORT_RETURN_IF_ERROR(PlanLayer(p).WithContext(where));
    // Also bounds a conv's im2col columns per output pixel.
    if (p.out.size() > kMaxActivation || p.weight_cols > kMaxActivation) {
      return InvalidArgumentError(where + ": output " + ShapeText(p.out) +
                                  " has more than 2^26 values per sample");
    }
    plan.params += p.params();  // Each below 2^46, at most 64 of them.
    shape = p.out;
    plan.layers.push_back(p);
  }
  if (!shape.flat() || shape.c != spec.num_classes) {
    return InvalidArgumentError("layers: the last layer gives " + ShapeText(shape) +
                                " outputs, but num_classes is " + std::to_string(spec.num_classes) +
                                " (end with linear(" + std::to_string(spec.num_classes) + "))");
  }
  plan.step_floats_per_sample = StepFloats(spec, plan.layers);
  return plan;
}

std::string DescribeNet(const NetSpec& spec) {
  std::string s = ShapeText(spec.input);
  for (const LayerSpec& l : spec.layers) {
    s += std::string(" -> ") + LayerKindName(l.kind);
    if (l.kind == LayerKind::kLinear) s += "(" + std::to_string(l.out) + ")";
    if (l.kind == LayerKind::kConv2d) {
      s += "(" + std::to_string(l.out) + ", k" + std::to_string(l.kernel) + ")";
    }
    if (l.kind == LayerKind::kMaxPool2d) s += "(" + std::to_string(l.kernel) + ")";
  }
  return s;
}

}  // namespace cohort
