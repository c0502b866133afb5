#include "train/export.h"

#include <zip.h>

#include <cstring>
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

}  // namespace cohort::train
