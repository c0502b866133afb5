// cohort._model: a native model (mlp, logreg, lenet5, a layer list) under
// PyTorch's names and layouts, read from a run directory or given as a flat
// vector. The translation is train/torch_layout's; cohort.run_model builds
// the torch.nn.Sequential from what this returns.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datasets/shard.h"
#include "proto/config_io.h"
#include "store/run_reader.h"
#include "train/backend.h"
#include "train/model_config.h"
#include "train/torch_layout.h"

namespace py = pybind11;

namespace cohort::python {
namespace {

// A Status as the Python exception a caller would catch: a missing file or
// directory is FileNotFoundError, a missing or unknown round (or none
// committed) LookupError,
// bad input ValueError, the rest RuntimeError. The message is the Status's.
[[noreturn]] void Raise(const Status& status, bool files = false) {
  PyObject* type = PyExc_RuntimeError;
  switch (status.code()) {
    case StatusCode::kNotFound:
      type = files ? PyExc_FileNotFoundError : PyExc_LookupError;
      break;
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:  // No run, or no committed round.
      type = PyExc_LookupError;
      break;
    case StatusCode::kInvalidArgument:
    case StatusCode::kDataLoss:
      type = PyExc_ValueError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, status.message().c_str());
  throw py::error_already_set();
}

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

template <typename T>
T OrRaise(StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return std::move(v).value();
}

// A float32 array over `owner`'s data from `offset` (no copy): the capsule
// keeps the vector alive as long as any array over it.
py::array_t<float> ArrayOver(const std::shared_ptr<std::vector<float>>& owner, uint64_t offset,
                             const std::vector<uint64_t>& shape) {
  auto* keep = new std::shared_ptr<std::vector<float>>(owner);
  py::capsule base(keep,
                   [](void* p) { delete static_cast<std::shared_ptr<std::vector<float>>*>(p); });
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array_t<float>(dims, owner->data() + offset, base);
}

py::dict ModuleDict(const train::TorchModule& m) {
  py::dict d;
  d["class"] = train::TorchClassName(m.kind);
  d["repr"] = train::TorchModuleRepr(m);
  switch (m.kind) {
    case LayerKind::kLinear:
      d["in_features"] = m.in;
      d["out_features"] = m.out;
      break;
    case LayerKind::kConv2d:
      d["in_channels"] = m.in;
      d["out_channels"] = m.out;
      d["kernel_size"] = m.kernel_size;
      d["stride"] = m.stride;
      d["padding"] = m.padding;
      break;
    case LayerKind::kMaxPool2d:
      d["kernel_size"] = m.kernel_size;
      d["stride"] = m.stride;
      break;
    default:
      break;
  }
  return d;
}

// The layout and the model's values in it, as Python objects: modules
// (dicts of the torch.nn class and its arguments), state_dict (a list of
// (name, float32 array) in order), input_shape, num_classes.
py::dict TorchDict(const train::TorchLayout& layout, std::vector<float> torch_values) {
  auto values = std::make_shared<std::vector<float>>(std::move(torch_values));
  py::list modules, state;
  for (const auto& m : layout.modules) modules.append(ModuleDict(m));
  for (const auto& t : layout.tensors) {
    state.append(py::make_tuple(t.name, ArrayOver(values, t.offset, t.shape)));
  }
  py::dict d;
  d["modules"] = modules;
  d["state_dict"] = state;
  d["input_shape"] = py::tuple(py::cast(layout.input_shape));
  d["num_classes"] = layout.num_classes;
  return d;
}

config::ModelConfig ModelOf(const std::string& config_text) {
  return OrRaise(config::ParseRunConfig(config_text, "config")).model();
}

// A 1-d float32 view of `flat` (copied only when it is not one already).
std::span<const float> FlatSpan(const FloatArray& a) {
  return {a.data(), static_cast<size_t>(a.size())};
}

// RUN_DIR's checkpoint at `round` (default: the last committed), read-only;
// the reader's errors as Python's exceptions.
store::RunCheckpoint ReadCheckpoint(const std::string& run_dir, std::optional<int64_t> round) {
  if (round && (*round < 0 || *round > UINT32_MAX)) {
    Raise(OutOfRangeError(run_dir + ": round " + std::to_string(*round) + " is not a round"));
  }
  StatusOr<store::RunCheckpoint> read = [&] {
    py::gil_scoped_release release;
    return store::ReadRunCheckpoint(run_dir,
                                    round ? std::optional<uint32_t>(*round) : std::nullopt);
  }();
  if (!read.ok()) {
    // A missing directory or run.db is FileNotFoundError; a missing round
    // LookupError.
    std::error_code ec;
    const bool files = !std::filesystem::is_directory(run_dir, ec) ||
                       !std::filesystem::exists(run_dir + "/run.db", ec);
    Raise(read.status(), files);
  }
  return std::move(read).value();
}

py::dict ReadFlat(const std::string& run_dir, std::optional<int64_t> round) {
  store::RunCheckpoint read = ReadCheckpoint(run_dir, round);
  auto owner = std::make_shared<std::vector<float>>(std::move(read.checkpoint.model));
  py::dict d;
  d["flat"] = ArrayOver(owner, 0, {owner->size()});
  d["round"] = read.checkpoint.round;
  d["last_round"] = read.info.last_round;
  d["config"] = read.info.config_text;
  return d;
}

py::dict ReadRun(const std::string& run_dir, std::optional<int64_t> round) {
  const store::RunCheckpoint read = ReadCheckpoint(run_dir, round);
  const std::string& text = read.info.config_text;
  StatusOr<config::RunConfig> config = config::ParseRunConfig(text, run_dir + "/run.db config");
  if (!config.ok()) Raise(config.status());
  StatusOr<train::TorchLayout> layout = train::TorchLayoutFor(config->model());
  if (!layout.ok()) Raise(layout.status().WithContext(run_dir));
  StatusOr<std::vector<float>> values = train::ToTorchOrder(*layout, read.checkpoint.model);
  if (!values.ok()) {
    Raise(DataLossError(run_dir + ": round " + std::to_string(read.checkpoint.round) + ": " +
                        values.status().message()));
  }
  py::dict d = TorchDict(*layout, std::move(*values));
  d["round"] = read.checkpoint.round;
  d["last_round"] = read.info.last_round;
  d["config"] = text;
  d["test_shard"] = config->data().test_shard();
  return d;
}

py::dict ToTorch(const std::string& config_text, const FloatArray& flat) {
  const auto layout = OrRaise(train::TorchLayoutFor(ModelOf(config_text)));
  return TorchDict(layout, OrRaise(train::ToTorchOrder(layout, FlatSpan(flat))));
}

uint64_t NumParams(const std::string& config_text) {
  return OrRaise(train::TorchLayoutFor(ModelOf(config_text))).num_params();
}

py::array_t<float> FromTorch(const std::string& config_text, const FloatArray& flat) {
  const auto layout = OrRaise(train::TorchLayoutFor(ModelOf(config_text)));
  const std::vector<float> native = OrRaise(train::FromTorchOrder(layout, FlatSpan(flat)));
  return py::array_t<float>(static_cast<py::ssize_t>(native.size()), native.data());
}

py::tuple ReadShard(const std::string& path) {
  StatusOr<datasets::Dataset> data = [&] {
    py::gil_scoped_release release;
    return datasets::ReadShard(path);
  }();
  if (!data.ok()) Raise(data.status(), true);
  const py::ssize_t n = static_cast<py::ssize_t>(data->size());
  py::array_t<float> x({n, static_cast<py::ssize_t>(data->num_features)});
  std::copy(data->features.begin(), data->features.end(), x.mutable_data());
  py::array_t<int32_t> y(n);
  std::copy(data->labels.begin(), data->labels.end(), y.mutable_data());
  return py::make_tuple(x, y, data->num_classes);
}

// Cohort's own forward pass (the CPU backend, as the coordinator evaluates)
// over `features` ([n, C*H*W] in (C, H, W) order): the logits, [n, classes].
py::array_t<float> NativeLogits(const std::string& config_text, const FloatArray& flat,
                                const FloatArray& features) {
  auto backend = OrRaise(train::NewCpuBackend());
  auto model = OrRaise(train::BuildModel(ModelOf(config_text), backend.get()));
  const uint64_t f = model->input_features();
  if (features.ndim() != 2 || static_cast<uint64_t>(features.shape(1)) != f) {
    Raise(InvalidArgumentError("features: expected [n, " + std::to_string(f) + "]"));
  }
  if (Status s = model->SetParams(FlatSpan(flat)); !s.ok()) Raise(s);
  constexpr int kBatch = 256;
  if (Status s = model->Reserve(kBatch); !s.ok()) Raise(s);
  const size_t n = static_cast<size_t>(features.shape(0));
  const uint32_t classes = model->num_classes();
  auto x = OrRaise(train::DeviceArray<float>::Create(backend.get(), kBatch * f));
  auto y = OrRaise(train::DeviceArray<int32_t>::Create(backend.get(), kBatch));
  const std::vector<int32_t> labels(kBatch, 0);
  std::vector<uint32_t> index(kBatch);
  for (uint32_t i = 0; i < index.size(); ++i) index[i] = i;
  py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(classes)});
  const Shape& in = model->spec().input;
  for (size_t begin = 0; begin < n; begin += kBatch) {
    const int batch = static_cast<int>(std::min<size_t>(kBatch, n - begin));
    // The CPU backend's memory is the host's: Gather reads the array itself.
    backend->Gather(features.data() + begin * f, labels.data(), index.data(), batch, int(in.c),
                    int(in.h), int(in.w), x.data(), y.data());
    double stats[2] = {0, 0};
    model->Evaluate(x.data(), y.data(), batch, stats);
    backend->Download(out.mutable_data() + begin * classes, model->logits(),
                      sizeof(float) * batch * classes);
  }
  if (Status s = backend->Sync(); !s.ok()) Raise(s);
  return out;
}

}  // namespace

// The functions below, on `m`: cohort._client's submodule `model` (one
// extension: two would each register Cohort's generated protobuf files,
// which protobuf refuses in one process).
void AddModelBindings(py::module_& m) {
  m.def("read_run", &ReadRun, py::arg("run_dir"), py::arg("round") = py::none(),
        "The model of a run directory at `round` (default: the last committed), read-only: "
        "a dict with modules, state_dict [(name, float32 array)], input_shape, num_classes, "
        "round, last_round, config (text) and test_shard.");
  m.def("read_flat", &ReadFlat, py::arg("run_dir"), py::arg("round") = py::none(),
        "Any run's model at `round` (default: the last committed) as the flat vector the "
        "clients train, read-only: a dict with flat (float32), round, last_round and config. "
        "For a model the clients bring (model.external), cohort.torch.set_flat loads it.");
  m.def("to_torch", &ToTorch, py::arg("config"), py::arg("flat"),
        "A flat Cohort vector of the run config's model (text format) in PyTorch's layout: "
        "a dict as read_run's, without the run's fields.");
  m.def("num_params", &NumParams, py::arg("config"),
        "The length of the run config's model's flat vector.");
  m.def("from_torch", &FromTorch, py::arg("config"), py::arg("flat"),
        "The state_dict's tensors back to back (PyTorch's order) as Cohort's flat vector.");
  m.def("read_shard", &ReadShard, py::arg("path"),
        "A shard file: (features [n, C*H*W] float32 in (C, H, W) order, labels int32, "
        "num_classes).");
  m.def("native_logits", &NativeLogits, py::arg("config"), py::arg("flat"), py::arg("features"),
        "Cohort's own forward pass on the CPU: logits [n, num_classes].");
}

}  // namespace cohort::python
