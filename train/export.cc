#include "train/export.h"

#include <onnx/onnx_pb.h>
#include <zip.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "train/torch_layout.h"

namespace cohort::train {
namespace {

std::string ShapeTuple(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// A version 1.0 .npy of float32 values: the header padded so the data
// starts at a multiple of 64 bytes, as numpy writes it.
std::string NpyBytes(const NamedTensor& t) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': " + ShapeTuple(t.shape) + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  return out;
}

// A zip written entry by entry (stored, not deflated), closed atomically:
// libzip writes a temporary file and renames it over `path`.
class ZipWriter {
 public:
  static StatusOr<ZipWriter> Create(const std::string& path) {
    int error = 0;
    zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
    if (z == nullptr) {
      zip_error_t e;
      zip_error_init_with_code(&e, error);
      const std::string why = zip_error_strerror(&e);
      zip_error_fini(&e);
      return InvalidArgumentError(path + ": cannot write: " + why);
    }
    return ZipWriter(path, z);
  }
  ZipWriter(ZipWriter&&) = default;

  Status Add(const std::string& name, std::string bytes) {
    // libzip reads the buffers at close: they live until then.
    auto& kept = *buffers_.emplace_back(std::make_unique<std::string>(std::move(bytes)));
    zip_source_t* src = zip_source_buffer(zip_.get(), kept.data(), kept.size(), 0);
    const zip_int64_t index =
        src == nullptr ? -1 : zip_file_add(zip_.get(), name.c_str(), src, ZIP_FL_OVERWRITE);
    if (index < 0) {
      if (src != nullptr) zip_source_free(src);
      return InternalError(path_ + ": " + name + ": " + zip_strerror(zip_.get()));
    }
    zip_set_file_compression(zip_.get(), static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
    return OkStatus();
  }

  Status Close() {
    if (zip_close(zip_.get()) != 0) {
      return InternalError(path_ + ": cannot write: " + zip_strerror(zip_.get()));
    }
    zip_.release();
    return OkStatus();
  }

 private:
  struct Discard {
    void operator()(zip_t* z) const { zip_discard(z); }
  };
  ZipWriter(std::string path, zip_t* z) : path_(std::move(path)), zip_(z) {}

  std::string path_;
  std::unique_ptr<zip_t, Discard> zip_;
  std::vector<std::unique_ptr<std::string>> buffers_;
};

// The opcodes of Python's pickle protocol 2 that a state_dict needs.
class Pickle {
 public:
  Pickle() { out_ = "\x80\x02"; }  // PROTO 2.
  void Global(const std::string& module, const std::string& name) {
    out_ += 'c' + module + '\n' + name + '\n';
  }
  void Mark() { out_ += '('; }
  void Tuple() { out_ += 't'; }  // Since the last Mark.
  void EmptyTuple() { out_ += ')'; }
  void Reduce() { out_ += 'R'; }
  void SetItems() { out_ += 'u'; }
  void PersistentId() { out_ += 'Q'; }
  void False() { out_ += '\x89'; }
  void Stop() { out_ += '.'; }
  void String(const std::string& s) {  // BINUNICODE.
    out_ += 'X';
    Put32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void Int(uint64_t v) {  // BININT: the sizes here stay below 2^31.
    out_ += 'J';
    Put32(static_cast<uint32_t>(v));
  }
  const std::string& bytes() const { return out_; }

 private:
  void Put32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

// collections.OrderedDict().
void EmptyOrderedDict(Pickle& p) {
  p.Global("collections", "OrderedDict");
  p.EmptyTuple();
  p.Reduce();
}

// torch._utils._rebuild_tensor_v2(storage, 0, shape, stride, False,
// OrderedDict()) over the float storage `key` (data/KEY in the archive).
void Tensor(Pickle& p, const NamedTensor& t, const std::string& key) {
  p.Global("torch._utils", "_rebuild_tensor_v2");
  p.Mark();
  p.Mark();  // The storage, as a persistent id: ('storage', type, key, location, numel).
  p.String("storage");
  p.Global("torch", "FloatStorage");
  p.String(key);
  p.String("cpu");
  p.Int(t.values.size());
  p.Tuple();
  p.PersistentId();
  p.Int(0);  // Storage offset.
  p.Mark();
  for (uint64_t d : t.shape) p.Int(d);
  p.Tuple();
  p.Mark();  // Row-major strides.
  std::vector<uint64_t> strides(t.shape.size(), 1);
  for (size_t i = t.shape.size(); i-- > 1;) strides[i - 1] = strides[i] * t.shape[i];
  for (uint64_t s : strides) p.Int(s);
  p.Tuple();
  p.False();            // requires_grad.
  EmptyOrderedDict(p);  // backward_hooks.
  p.Tuple();
  p.Reduce();
}

}  // namespace

StatusOr<std::vector<NamedTensor>> TorchStateDict(const config::ModelConfig& model,
                                                  std::span<const float> flat) {
  std::vector<NamedTensor> out;
  if (model.has_external()) {
    const config::ExternalModel& e = model.external();
    if (flat.size() != e.num_params()) {
      return InvalidArgumentError("the checkpoint holds " + std::to_string(flat.size()) +
                                  " values; model.external.num_params is " +
                                  std::to_string(e.num_params()));
    }
    if (e.layout_size() == 0) {
      out.push_back({"flat", {flat.size()}, {flat.begin(), flat.end()}});
      return out;
    }
    size_t at = 0;
    for (const auto& t : e.layout()) {
      NamedTensor n{t.name(), {t.shape().begin(), t.shape().end()}, {}};
      uint64_t size = 1;
      for (uint64_t d : n.shape) size *= d;
      n.values.assign(flat.begin() + at, flat.begin() + at + size);
      at += size;
      out.push_back(std::move(n));
    }
    return out;
  }
  COHORT_ASSIGN_OR_RETURN(TorchLayout layout, TorchLayoutFor(model));
  COHORT_ASSIGN_OR_RETURN(std::vector<float> torch_order, ToTorchOrder(layout, flat));
  for (const TorchTensor& t : layout.tensors) {
    out.push_back({t.name,
                   t.shape,
                   {torch_order.begin() + t.offset, torch_order.begin() + t.offset + t.size()}});
  }
  return out;
}

Status WriteNpz(const std::string& path, const std::vector<NamedTensor>& tensors) {
  COHORT_ASSIGN_OR_RETURN(ZipWriter zip, ZipWriter::Create(path));
  for (const NamedTensor& t : tensors)
    COHORT_RETURN_IF_ERROR(zip.Add(t.name + ".npy", NpyBytes(t)));
  return zip.Close();
}

Status WriteTorchStateDict(const std::string& path, const std::vector<NamedTensor>& tensors) {
  COHORT_ASSIGN_OR_RETURN(ZipWriter zip, ZipWriter::Create(path));
  Pickle p;
  EmptyOrderedDict(p);
  p.Mark();
  for (size_t i = 0; i < tensors.size(); ++i) {
    p.String(tensors[i].name);
    Tensor(p, tensors[i], std::to_string(i));
  }
  p.SetItems();
  p.Stop();
  // torch.load reads ARCHIVE/data.pkl, ARCHIVE/version and ARCHIVE/data/KEY.
  COHORT_RETURN_IF_ERROR(zip.Add("archive/data.pkl", p.bytes()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& v = tensors[i].values;
    COHORT_RETURN_IF_ERROR(
        zip.Add("archive/data/" + std::to_string(i),
                std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float))));
  }
  COHORT_RETURN_IF_ERROR(zip.Add("archive/version", "3\n"));
  return zip.Close();
}

namespace {

void IntsAttribute(onnx::NodeProto* node, const char* name, std::vector<int64_t> values) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void IntAttribute(onnx::NodeProto* node, const char* name, int64_t value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void Initializer(onnx::GraphProto* graph, const NamedTensor& t) {
  auto* init = graph->add_initializer();
  init->set_name(t.name);
  init->set_data_type(onnx::TensorProto::FLOAT);
  for (uint64_t d : t.shape) init->add_dims(static_cast<int64_t>(d));
  init->set_raw_data(
      std::string(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float)));
}

// A float tensor value [N, dims...], N symbolic.
void ValueInfo(onnx::ValueInfoProto* v, const std::string& name,
               const std::vector<uint64_t>& dims) {
  v->set_name(name);
  auto* type = v->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = type->mutable_shape();
  shape->add_dim()->set_dim_param("N");
  for (uint64_t d : dims) shape->add_dim()->set_dim_value(static_cast<int64_t>(d));
}

// The node of module `i` from `input` to its output (named "i"), its
// weights (named as in `tensors`) added as initializers.
std::string AddNode(onnx::GraphProto* graph, size_t i, const TorchModule& m,
                    const std::string& input, const std::vector<NamedTensor>& tensors) {
  const std::string out = std::to_string(i);
  onnx::NodeProto* node = graph->add_node();
  node->set_name(out);
  node->add_input(input);
  node->add_output(out);
  const auto weights = [&] {
    for (const char* suffix : {".weight", ".bias"}) {
      const std::string name = out + suffix;
      for (const NamedTensor& t : tensors) {
        if (t.name == name) Initializer(graph, t);
      }
      node->add_input(name);
    }
  };
  const auto k = static_cast<int64_t>(m.kernel_size), s = static_cast<int64_t>(m.stride);
  switch (m.kind) {
    case LayerKind::kLinear:
      node->set_op_type("Gemm");  // x W^T + b, W as nn.Linear keeps it: [out, in].
      weights();
      IntAttribute(node, "transB", 1);
      break;
    case LayerKind::kConv2d: {
      node->set_op_type("Conv");
      weights();
      const auto p = static_cast<int64_t>(m.padding);
      IntsAttribute(node, "kernel_shape", {k, k});
      IntsAttribute(node, "strides", {s, s});
      IntsAttribute(node, "pads", {p, p, p, p});
      break;
    }
    case LayerKind::kMaxPool2d:
      node->set_op_type("MaxPool");
      IntsAttribute(node, "kernel_shape", {k, k});
      IntsAttribute(node, "strides", {s, s});
      break;
    case LayerKind::kRelu:
      node->set_op_type("Relu");
      break;
    case LayerKind::kFlatten:
      node->set_op_type("Flatten");
      IntAttribute(node, "axis", 1);
      break;
  }
  return out;
}

}  // namespace

Status WriteOnnx(const std::string& path, const config::ModelConfig& model,
                 std::span<const float> flat) {
  if (model.has_external()) {
    return InvalidArgumentError(
        "--format onnx: the run's model is the clients' own (model.external); Cohort holds no "
        "graph of it (--format torch or npz write its tensors)");
  }
  COHORT_ASSIGN_OR_RETURN(TorchLayout layout, TorchLayoutFor(model));
  COHORT_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, TorchStateDict(model, flat));
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("cohort");
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* graph = m.mutable_graph();
  graph->set_name("cohort");
  ValueInfo(graph->add_input(), "input", layout.input_shape);
  std::string x = "input";
  for (size_t i = 0; i < layout.modules.size(); ++i) {
    x = AddNode(graph, i, layout.modules[i], x, tensors);
  }
  graph->mutable_node(graph->node_size() - 1)->set_output(0, "logits");
  ValueInfo(graph->add_output(), "logits", {layout.num_classes});
  // Written beside, then renamed: a reader never sees half a file.
  const std::string part = path + ".part";
  {
    std::ofstream f(part, std::ios::binary | std::ios::trunc);
    if (!f || !m.SerializeToOstream(&f) || !f.flush()) {
      std::remove(part.c_str());
      return InternalError(path + ": cannot write");
    }
  }
  std::error_code ec;
  std::filesystem::rename(part, path, ec);
  if (ec) {
    std::remove(part.c_str());
    return InternalError(path + ": cannot write: " + ec.message());
  }
  return OkStatus();
}

}  // namespace cohort::train
