#include "python/cohort/fit_result.h"

#include <fmt/format.h>
#include <pybind11/numpy.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>

namespace py = pybind11;

namespace cohort::python {
namespace {

std::string TypeName(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

// The parameters (or delta) into `params`.
// The index of the first NaN or infinity in `x`, or x.size(). The common
// case, every value finite, is one branch-free pass over the bits (an
// exponent of all ones is NaN or infinity) that the compiler vectorises;
// only a vector that has one is scanned again for where.
size_t FirstNonFinite(std::span<const float> x) {
  uint32_t any = 0;
  for (const float f : x) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (any == 0) return x.size();
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return x.size();
}

// A complex NumPy array or tensor (a tensor's is_complex(), an array's
// dtype kind 'c').
bool IsComplex(py::handle v) {
  if (py::isinstance<py::array>(v)) {
    return py::reinterpret_borrow<py::array>(v).dtype().kind() == 'c';
  }
  if (!py::hasattr(v, "is_complex")) return false;
  try {
    return v.attr("is_complex")().cast<bool>();
  } catch (py::error_already_set&) {
    return false;  // Not a tensor's is_complex: left to NumPy's reading.
  } catch (py::cast_error&) {
    return false;
  }
}

Status ReadValues(py::handle values, std::span<float> params, std::span<const float> global,
                  bool delta) {
  const std::string expected = "expected a NumPy array (or a CPU tensor) of " +
                               std::to_string(params.size()) + " float32 values";
  if (py::isinstance<py::str>(values) || py::isinstance<py::bytes>(values) || values.is_none()) {
    return InvalidArgumentError("fit returned a " + TypeName(values) + " for the parameters; " +
                                expected);
  }
  // NumPy would drop the imaginary parts (with only a warning).
  if (IsComplex(values)) {
    return InvalidArgumentError("fit returned complex values for the parameters; " + expected);
  }
  // ensure() clears NumPy's error and returns null: asked again, NumPy says
  // why (a tensor that requires grad: "Can't call numpy() on Tensor that
  // requires grad. Use tensor.detach().numpy() instead.").
  auto arr = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(values);
  if (!arr) {
    std::string why;
    try {
      (void)py::module_::import("numpy").attr("asarray")(values, py::arg("dtype") = "float32");
    } catch (py::error_already_set& e) {
      why = " that NumPy cannot read (" + FormatException(e) + ")";
    }
    return InvalidArgumentError("fit returned a " + TypeName(values) + " for the parameters" + why +
                                "; " + expected);
  }
  const size_t n = static_cast<size_t>(arr.size());
  if (n != params.size()) {
    return InvalidArgumentError("fit returned " + std::to_string(n) + " values; the model has " +
                                std::to_string(params.size()));
  }
  const float* v = arr.data();
  if (const size_t i = FirstNonFinite(std::span<const float>(v, n)); i < n) {
    return InvalidArgumentError("fit returned a non-finite value (" +
                                std::string(std::isnan(v[i]) ? "nan" : "inf") + ") at index " +
                                std::to_string(i) + " of " + std::to_string(n));
  }
  if (delta) {
    for (size_t i = 0; i < n; ++i) params[i] = global[i] + v[i];
    // A delta may not overflow into a non-finite parameter either.
    if (const size_t i = FirstNonFinite(params); i < n) {
      return InvalidArgumentError("fit's delta makes parameter " + std::to_string(i) +
                                  " non-finite");
    }
  } else if (v != params.data()) {
    std::memcpy(params.data(), v, n * sizeof(float));
  }
  return OkStatus();
}

// An int (not a bool) as a count: -1 for one below 0, and for one beyond
// 2^63 - 1 (which pybind11's cast would refuse without naming the value).
long long CountOf(py::handle h) {
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(
      py::int_(py::reinterpret_borrow<py::object>(h)).ptr(), &overflow);
  return overflow != 0 ? -1 : n;
}

std::string Repr(py::handle h) { return std::string(py::str(py::repr(h))).substr(0, 40); }

StatusOr<uint64_t> ReadNumSamples(py::handle h, const std::string& who) {
  if (py::isinstance<py::bool_>(h) || !PyIndex_Check(h.ptr())) {
    return InvalidArgumentError(who + " returned num_samples of type " + TypeName(h) +
                                "; expected an int");
  }
  const long long n = CountOf(h);
  if (n < 0) {
    return InvalidArgumentError(who + " returned num_samples=" + Repr(h) +
                                "; expected 0 or more, below 2^63");
  }
  return static_cast<uint64_t>(n);
}

// metrics["loss"] and metrics["accuracy"] (`who`: "fit" or "evaluate", for
// the messages); each left as it was where the dict lacks it.
Status ReadMetrics(py::handle metrics, const std::string& who, double& loss, double& accuracy) {
  if (metrics.is_none()) return OkStatus();
  if (!py::isinstance<py::dict>(metrics)) {
    return InvalidArgumentError(who + " returned metrics of type " + TypeName(metrics) +
                                "; expected a dict of str to float (or None)");
  }
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(metrics)) {
    if (!py::isinstance<py::str>(key)) {
      return InvalidArgumentError(who + "'s metrics have a key of type " + TypeName(key) +
                                  "; expected str");
    }
    const std::string name = py::str(key);
    if (py::isinstance<py::str>(value) || py::isinstance<py::bool_>(value) ||
        PyNumber_Check(value.ptr()) == 0) {
      return InvalidArgumentError(who + "'s metrics['" + name + "'] is a " + TypeName(value) +
                                  "; expected a number");
    }
    double x = 0;
    try {
      x = py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
    } catch (py::error_already_set& e) {
      return InvalidArgumentError(who + "'s metrics['" + name + "'] is not a number (" +
                                  FormatException(e) + ")");
    }
    if (!std::isfinite(x)) {
      return InvalidArgumentError(who + "'s metrics['" + name + "'] is " + fmt::format("{}", x) +
                                  "; expected a finite number");
    }
    if (name == "loss") loss = x;
    if (name == "accuracy") {
      if (x < 0 || x > 1) {
        return InvalidArgumentError(who + "'s metrics['accuracy'] is " + fmt::format("{}", x) +
                                    "; expected 0 to 1");
      }
      accuracy = x;
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<train::TrainResult> ReadFitResult(const py::object& out, std::span<float> params,
                                           std::span<const float> global, bool delta) {
  if (!(py::isinstance<py::tuple>(out) || py::isinstance<py::list>(out)) || py::len(out) != 3) {
    return InvalidArgumentError("fit returned a " + TypeName(out) +
                                "; expected a tuple (params, num_samples, metrics)");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(out);
  const py::object values = seq[0], num_samples = seq[1], metrics = seq[2];
  train::TrainResult result;
  COHORT_RETURN_IF_ERROR(ReadValues(values, params, global, delta));
  COHORT_ASSIGN_OR_RETURN(result.samples, ReadNumSamples(num_samples, "fit"));
  COHORT_RETURN_IF_ERROR(ReadMetrics(metrics, "fit", result.mean_loss, result.accuracy));
  if (py::isinstance<py::dict>(metrics) && metrics.contains("steps")) {
    // FedNova's tau (train.fednova): the optimizer steps fit took.
    const py::object steps = metrics["steps"];
    if (py::isinstance<py::bool_>(steps) || !PyIndex_Check(steps.ptr()) || CountOf(steps) < 0) {
      return InvalidArgumentError("fit's metrics['steps'] is " + Repr(steps) +
                                  "; expected an int from 0 to 2^63 - 1 (the optimizer steps it "
                                  "took)");
    }
    result.steps = static_cast<uint64_t>(CountOf(steps));
  }
  return result;
}

StatusOr<train::EvalResult> ReadEvaluateResult(const py::object& out) {
  if (!(py::isinstance<py::tuple>(out) || py::isinstance<py::list>(out)) || py::len(out) != 2) {
    return InvalidArgumentError("evaluate returned a " + TypeName(out) +
                                "; expected a tuple (num_samples, metrics)");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(out);
  const py::object num_samples = seq[0], metrics = seq[1];
  train::EvalResult result;
  COHORT_ASSIGN_OR_RETURN(result.samples, ReadNumSamples(num_samples, "evaluate"));
  if (!py::isinstance<py::dict>(metrics) || !metrics.contains("loss") ||
      !metrics.contains("accuracy")) {
    return InvalidArgumentError("evaluate returned metrics " +
                                std::string(py::str(py::repr(metrics))).substr(0, 80) +
                                "; expected a dict with 'loss' and 'accuracy'");
  }
  COHORT_RETURN_IF_ERROR(ReadMetrics(metrics, "evaluate", result.loss, result.accuracy));
  if (result.loss < 0) {
    return InvalidArgumentError("evaluate's metrics['loss'] is " + fmt::format("{}", result.loss) +
                                "; expected 0 or more");
  }
  return result;
}

std::string FormatException(const py::error_already_set& e) {
  std::string type = "Exception";
  std::string message;
  try {
    type = py::str(e.type().attr("__name__"));
    message = py::str(e.value());
  } catch (py::error_already_set&) {
    // The exception's own __str__ failed: its type says enough.
  }
  return message.empty() ? type : type + ": " + message;
}

}  // namespace cohort::python
