// cohort.distributed._c10d: the `cohort` process group for torch.distributed
// (process_group.h). The Python side (__init__.py) meets the other ranks
// through torch's store and calls create(); torch.distributed must be
// imported first, so that c10d's ProcessGroup is a known base type.
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>

#include "python/cohort/distributed/process_group.h"

namespace py = pybind11;

namespace cohort::distributed {
namespace {

c10::intrusive_ptr<ProcessGroupCohort> CreateGroup(const GroupConfig& config) {
  StatusOr<c10::intrusive_ptr<ProcessGroupCohort>> group = ProcessGroupCohort::Create(config);
  if (!group.ok()) {
    throw std::runtime_error("cohort process group (rank " + std::to_string(config.rank) +
                             "): cannot join: " + group.status().ToString());
  }
  return *std::move(group);
}

}  // namespace
}  // namespace cohort::distributed

PYBIND11_MODULE(_c10d, m) {
  using cohort::distributed::GroupConfig;
  using cohort::distributed::ProcessGroupCohort;
  m.doc() = "The cohort torch.distributed backend (import cohort.distributed to register it).";
  py::module_::import("torch.distributed");
  py::class_<GroupConfig>(m, "GroupConfig")
      .def(py::init<>())
      .def_readwrite("rank", &GroupConfig::rank)
      .def_readwrite("size", &GroupConfig::size)
      .def_readwrite("master", &GroupConfig::master)
      .def_readwrite("transport", &GroupConfig::transport)
      .def_readwrite("host", &GroupConfig::host)
      .def_readwrite("identity_file", &GroupConfig::identity_file)
      .def_readwrite("allow_dir", &GroupConfig::allow_dir)
      .def_readwrite("master_key_file", &GroupConfig::master_key_file)
      .def_readwrite("insecure", &GroupConfig::insecure)
      .def_readwrite("timeout_ms", &GroupConfig::timeout_ms);
  py::class_<ProcessGroupCohort, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupCohort>>(
      m, "ProcessGroupCohort")
      .def_property_readonly("description", &ProcessGroupCohort::description);
  m.def("create", &cohort::distributed::CreateGroup, py::arg("config"),
        "Joins the group (every rank calls it with the same master); waits up to "
        "config.timeout_ms for the others.",
        py::call_guard<py::gil_scoped_release>());
}
