// What the user's `fit` returned, checked: it is untrusted input, and a bad
// value leaves the round (a dropout), never the run.
#ifndef COHORT_PYTHON_COHORT_FIT_RESULT_H_
#define COHORT_PYTHON_COHORT_FIT_RESULT_H_

#include <pybind11/pybind11.h>

#include <span>
#include <string>

#include "common/status.h"
#include "train/trainer.h"

namespace cohort::python {

// `out` must be (values, num_samples, metrics): values an array (or
// anything NumPy reads, a CPU tensor included) of exactly params.size()
// finite numbers, the new parameters or (`delta`) their change from
// `global`; num_samples an int >= 0; metrics None or a dict of str to a
// finite number ("loss" and "accuracy", in 0..1, reach the coordinator;
// "steps", an int >= 0, is the optimizer steps taken, which train.fednova
// needs; other keys are ignored). Writes the new parameters into `params` (no copy
// when `values` is `params` itself, trained in place). kInvalidArgument
// naming what was wrong, params then undefined. GIL held.
StatusOr<train::TrainResult> ReadFitResult(const pybind11::object& out, std::span<float> params,
                                           std::span<const float> global, bool delta);

// `out` must be (num_samples, metrics): num_samples an int >= 0 (the test
// samples), metrics a dict with "loss" (finite, >= 0) and "accuracy" (0 to
// 1). kInvalidArgument naming what was wrong. GIL held.
StatusOr<train::EvalResult> ReadEvaluateResult(const pybind11::object& out);

// "ValueError: the message" for a Python exception.
std::string FormatException(const pybind11::error_already_set& e);

}  // namespace cohort::python

#endif  // COHORT_PYTHON_COHORT_FIT_RESULT_H_
