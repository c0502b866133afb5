// cohort._client: the federated client's daemon (client/daemon.h) with the
// user's Python `fit` as its LocalTrainer. The protocol, CURVE and SecAgg+
// run in C++ on a thread of their own, without the GIL; the thread that
// called Client.run() holds the GIL only to call `fit` (and to check for
// Ctrl-C), so `fit` runs on the caller's thread, as a plain loop would.
#include <fmt/format.h>
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "client/daemon.h"
#include "client/local_trainer.h"
#include "common/env.h"
#include "common/logging.h"
#include "python/cohort/fit_bridge.h"
#include "python/cohort/fit_result.h"
#include "train/backend.h"
#include "train/device.h"
#include "train/model_config.h"

namespace py = pybind11;

namespace cohort::python {
void AddModelBindings(py::module_& m);  // model.cc
namespace {

// What the coordinator asks of one round, as `fit` sees it.
struct PyTask {
  uint32_t round = 0;
  uint64_t task_id = 0;
  uint64_t seed = 0;
  uint32_t epochs = 0;
  uint32_t batch_size = 0;
  std::string optimizer;
  double learning_rate = 0, momentum = 0, weight_decay = 0;
  double proximal_mu = 0;  // FedProx (train.proximal_mu); 0: none.
  bool secure = false;
  bool evaluate = false;         // The coordinator asks for this round's federated evaluation.
  bool fednova = false;          // train.fednova: fit reports metrics["steps"].
  uintptr_t buffer_address = 0;  // Of the C++ buffer `fit`'s array views (tests).
};

const char* OptimizerName(train::OptimizerKind kind) {
  switch (kind) {
    case train::OptimizerKind::kSgd:
      return "sgd";
    case train::OptimizerKind::kAdam:
      return "adam";
    case train::OptimizerKind::kAdamW:
      return "adamw";
  }
  return "sgd";
}

PyTask ToPyTask(const client::TrainTask& t, std::span<float> params) {
  const train::OptimizerOptions& o = t.options.optimizer;
  return {.round = t.round,
          .task_id = t.task_id,
          .seed = t.options.seed,
          .epochs = t.options.epochs,
          .batch_size = t.options.batch_size,
          .optimizer = OptimizerName(o.kind),
          .learning_rate = o.learning_rate,
          .momentum = o.momentum,
          .weight_decay = o.weight_decay,
          .proximal_mu = o.proximal_mu,
          .secure = t.secure,
          .evaluate = t.evaluate,
          .fednova = t.fednova,
          .buffer_address = reinterpret_cast<uintptr_t>(params.data())};
}

// The parameter count of the coordinator's model: an external model's
// stated count, or a native model's as Cohort's engine builds it.
StatusOr<size_t> CoordinatorModelSize(const config::ModelConfig& config) {
  if (config.has_external()) {
    const uint64_t n = config.external().num_params();
    if (n == 0 || n > (uint64_t{1} << 32)) {
      return InvalidArgumentError("coordinator's model: external.num_params " + std::to_string(n) +
                                  " is out of range (1 to 2^32)");
    }
    return static_cast<size_t>(n);
  }
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<train::Backend> cpu,
                          train::NewBackend({.device = "cpu", .threads = 1}));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<train::Model> model,
                          train::BuildModel(config, cpu.get()));
  return model->num_params();
}

// The LocalTrainer whose Train hands each task to the Python thread.
class PyTrainer final : public client::LocalTrainer {
 public:
  PyTrainer(uint64_t num_samples, std::optional<size_t> num_params, FitBridge& bridge)
      : num_samples_(num_samples), num_params_(num_params), bridge_(bridge) {}

  uint64_t num_samples() const override { return num_samples_; }

  StatusOr<size_t> BuildModel(const config::ModelConfig& config) override {
    COHORT_ASSIGN_OR_RETURN(size_t n, CoordinatorModelSize(config));
    if (num_params_ && *num_params_ != n) {
      return FailedPreconditionError("the coordinator's model has " + std::to_string(n) +
                                     " parameters; this client's has " +
                                     std::to_string(*num_params_) +
                                     " (Client(num_params=" + std::to_string(*num_params_) + "))");
    }
    return n;
  }

  StatusOr<train::TrainResult> Train(const client::TrainTask& task, std::span<float> params,
                                     const std::atomic<bool>* cancel) override {
    if (task.scaffold) {
      return FailedPreconditionError(
          "train.scaffold: a Python client's fit does not apply SCAFFOLD's control variates; "
          "use `cohort client` or leave train.scaffold out");
    }
    return bridge_.Train(task, params, cancel);
  }

  StatusOr<train::EvalResult> Evaluate(const client::TrainTask& task,
                                       std::span<const float> params) override {
    return bridge_.Evaluate(task, params);
  }

 private:
  uint64_t num_samples_;
  std::optional<size_t> num_params_;
  FitBridge& bridge_;
};

// Calls the user's fit on the Python thread (GIL held) for one task.
StatusOr<train::TrainResult> CallFit(const py::object& fit, FitBridge::Call& call, bool delta,
                                     std::optional<py::error_already_set>& interrupt) {
  const PyTask task = ToPyTask(*call.task, call.params);
  // A view of the daemon's buffer: fit may train it in place. The capsule
  // owns nothing; the buffer lives until this call returns.
  py::capsule no_owner(call.params.data(), [](void*) {});
  py::array_t<float> view({call.params.size()}, {sizeof(float)}, call.params.data(), no_owner);
  // Seconds from the process's Env, as the native trainer measures them.
  const double start = Env::Default()->MonotonicSeconds();
  py::object out;
  try {
    out = fit(view, py::cast(task));
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
      // The reason goes to the coordinator: a SystemExit's message says why.
      const std::string why =
          e.matches(PyExc_SystemExit) ? "fit exited: " + FormatException(e) : "stopped in fit";
      interrupt.emplace(std::move(e));
      return CancelledError(why);
    }
    py::module_::import("traceback").attr("print_exception")(e.type(), e.value(), e.trace());
    return InvalidArgumentError("fit raised " + FormatException(e));
  }
  StatusOr<train::TrainResult> read = InternalError("unread");
  try {
    read = ReadFitResult(out, call.params, call.task->global, delta);
  } catch (const std::exception& e) {  // A value pybind11 could not convert.
    read = InvalidArgumentError(std::string("fit's result could not be read: ") + e.what());
  }
  COHORT_ASSIGN_OR_RETURN(train::TrainResult result, std::move(read));
  result.seconds = Env::Default()->MonotonicSeconds() - start;
  return result;
}

// Calls the user's evaluate on the Python thread (GIL held) for one task.
StatusOr<train::EvalResult> CallEvaluate(const py::object& evaluate, FitBridge::Call& call,
                                         std::optional<py::error_already_set>& interrupt) {
  if (evaluate.is_none()) {
    return UnimplementedError("Client.run was given no evaluate (run(fit, evaluate=...))");
  }
  const PyTask task = ToPyTask(*call.task, call.params);
  py::capsule no_owner(call.params.data(), [](void*) {});
  py::array_t<float> view({call.params.size()}, {sizeof(float)}, call.params.data(), no_owner);
  view.attr("setflags")(py::arg("write") = false);  // The round's global model.
  py::object out;
  try {
    out = evaluate(view, py::cast(task));
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
      interrupt.emplace(std::move(e));
      return CancelledError("stopped in evaluate");
    }
    py::module_::import("traceback").attr("print_exception")(e.type(), e.value(), e.trace());
    return InvalidArgumentError("evaluate raised " + FormatException(e));
  }
  try {
    return ReadEvaluateResult(out);
  } catch (const std::exception& e) {  // A value pybind11 could not convert.
    return InvalidArgumentError(std::string("evaluate's result could not be read: ") + e.what());
  }
}

// SIGTERM (Kubernetes, Slurm, `docker stop`) stops a client as Ctrl-C
// does: its Goodbye is sent, then SystemExit(143) is raised. Python leaves
// SIGTERM at SIG_DFL, which ends the process at once with no Goodbye. Put
// in place on the main thread only and only over SIG_DFL (an application's
// own handler stays), and taken away when Run returns.
class TermStopsTheClient {
 public:
  TermStopsTheClient() {
    const py::module_ signal = py::module_::import("signal");
    const py::module_ threading = py::module_::import("threading");
    if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return;
    if (!signal.attr("getsignal")(signal.attr("SIGTERM")).equal(signal.attr("SIG_DFL"))) return;
    signal.attr("signal")(signal.attr("SIGTERM"), py::cpp_function([](int, py::object) {
                            PyErr_SetObject(PyExc_SystemExit, py::int_(128 + SIGTERM).ptr());
                            throw py::error_already_set();
                          }));
    installed_ = true;
  }
  ~TermStopsTheClient() {
    if (!installed_) return;
    try {
      const py::module_ signal = py::module_::import("signal");
      signal.attr("signal")(signal.attr("SIGTERM"), signal.attr("SIG_DFL"));
    } catch (py::error_already_set&) {
      // Interpreter shutting down: nothing to restore.
    }
  }
  TermStopsTheClient(const TermStopsTheClient&) = delete;
  TermStopsTheClient& operator=(const TermStopsTheClient&) = delete;

 private:
  bool installed_ = false;
};

class Client {
 public:
  Client(client::ClientOptions options, uint64_t num_samples, std::optional<size_t> num_params,
         bool delta)
      : options_(std::move(options)),
        num_samples_(num_samples),
        num_params_(num_params),
        delta_(delta) {}

  // Runs the daemon until the run finishes (returns), fails (raises
  // RuntimeError), Ctrl-C (Goodbye sent, then KeyboardInterrupt raised) or
  // SIGTERM (Goodbye sent, then SystemExit(143) raised).
  void Run(const py::object& fit, const py::object& evaluate) {
    if (!PyCallable_Check(fit.ptr())) throw py::type_error("fit must be callable");
    if (!evaluate.is_none() && !PyCallable_Check(evaluate.ptr())) {
      throw py::type_error("evaluate must be callable (or None)");
    }
    const TermStopsTheClient term;
    FitBridge bridge;
    PyTrainer trainer(num_samples_, num_params_, bridge);
    std::atomic<bool> stop{false};
    Status status = OkStatus();
    // Ctrl-C must land on this (Python's main) thread: the daemon's thread
    // and ZeroMQ's, which it starts, inherit a mask that blocks it.
    sigset_t block, previous;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &previous);
    std::thread loop([&] {
      status = client::RunClient(options_, trainer, stop);
      bridge.Close();
    });
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    std::optional<py::error_already_set> interrupt;
    auto join = [&] {
      py::gil_scoped_release released;
      loop.join();
    };
    try {
      ServeFits(bridge, fit, evaluate, stop, interrupt);
    } catch (...) {  // Never leave the daemon's thread running.
      stop = true;
      bridge.Refuse();
      join();
      throw;
    }
    join();
    if (interrupt) throw std::move(*interrupt);
    if (!status.ok()) throw std::runtime_error(status.ToString());
  }

 private:
  // The Python thread's loop: fit calls as they come, Ctrl-C between them,
  // until the daemon's loop ends.
  void ServeFits(FitBridge& bridge, const py::object& fit, const py::object& evaluate,
                 std::atomic<bool>& stop, std::optional<py::error_already_set>& interrupt) {
    // After Ctrl-C or a SystemExit no fit is called again: the bridge
    // refuses before the call is completed, or the daemon's thread, released
    // by the completion, could hand over the next round's task first. `stop`
    // follows the completion, so that the daemon's loop usually hands the
    // ended call (and the Goodbye that says why) to the session first.
    auto refuse_if_interrupted = [&] {
      if (interrupt) bridge.Refuse();
    };
    auto stop_if_interrupted = [&] {
      if (interrupt && !stop.load()) {
        stop = true;
        bridge.Refuse();
      }
    };
    for (;;) {
      FitBridge::Call* call = nullptr;
      bool closed = false;
      {
        py::gil_scoped_release released;
        call = bridge.Next(std::chrono::milliseconds(100), &closed);
      }
      if (call != nullptr && call->kind == FitBridge::Call::Kind::kEvaluate) {
        StatusOr<train::EvalResult> result = InternalError("evaluate not called");
        try {
          result = CallEvaluate(evaluate, *call, interrupt);
        } catch (const std::exception& e) {
          result = InternalError(std::string("calling evaluate: ") + e.what());
        }
        refuse_if_interrupted();
        bridge.CompleteEvaluation(call, std::move(result));
      } else if (call != nullptr) {
        // A taken call must be completed: the daemon's thread waits for it.
        StatusOr<train::TrainResult> result = InternalError("fit not called");
        try {
          result = CallFit(fit, *call, delta_, interrupt);
        } catch (const std::exception& e) {
          result = InternalError(std::string("calling fit: ") + e.what());
        }
        refuse_if_interrupted();
        bridge.Complete(call, std::move(result));
      }
      stop_if_interrupted();
      if (closed) return;
      if (!interrupt && PyErr_CheckSignals() != 0) interrupt.emplace();
      stop_if_interrupted();
    }
  }

  client::ClientOptions options_;
  uint64_t num_samples_;
  std::optional<size_t> num_params_;
  bool delta_;
};

std::unique_ptr<Client> MakeClient(const std::string& coordinator, uint64_t num_samples,
                                   std::optional<std::string> identity,
                                   std::optional<std::string> coordinator_key,
                                   std::optional<std::string> peers, bool require_secure,
                                   bool insecure, std::optional<size_t> num_params,
                                   std::optional<std::string> name, bool delta,
                                   double corrupt_fraction, const std::string& log_level) {
  client::ClientOptions o;
  o.coordinator = coordinator;
  o.identity = identity.value_or("");
  o.coordinator_key = coordinator_key.value_or("");
  o.peers = peers.value_or("");
  o.require_secure = require_secure || !o.peers.empty();
  o.insecure = insecure;
  o.corrupt_fraction = corrupt_fraction;
  // The allowlist names a client by its key file: so does the client.
  o.name = name                  ? *name
           : !o.identity.empty() ? std::filesystem::path(o.identity).stem().string()
                                 : "python-" + std::to_string(getpid());
  if (!insecure && (o.identity.empty() || o.coordinator_key.empty())) {
    throw py::value_error(
        "Client needs identity= (its key file, cohort keygen) and coordinator_key= (the "
        "coordinator's .pub file), or insecure=True for local development");
  }
  if (num_samples == 0) throw py::value_error("Client(num_samples=0): expected at least 1");
  if (num_params && *num_params == 0) throw py::value_error("Client(num_params=0): expected >= 1");
  if (corrupt_fraction < 0 || corrupt_fraction > 0.49) {
    throw py::value_error("Client(corrupt_fraction=" + fmt::format("{}", corrupt_fraction) +
                          "): expected 0 to 0.49");
  }
  // As `cohort --log-level`: spdlog takes any other name for "off", which
  // would hide the very lines that name a bad fit result.
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  if (kLevels.count(log_level) == 0) {
    throw py::value_error("Client(log_level=" + std::string(py::str(py::repr(py::str(log_level)))) +
                          "): expected 'trace', 'debug', 'info', 'warn' or 'error'");
  }
  spdlog::drop("cohort");  // A second Client in this process: its own name in the lines.
  InitLogging("client", o.name, log_level);
  return std::make_unique<Client>(std::move(o), num_samples, num_params, delta);
}

}  // namespace
}  // namespace cohort::python

namespace {

constexpr const char* kClientDoc = R"(A federated client around your own training loop.

Client(coordinator="tcp://HOST:PORT", num_samples=N, identity="me.key",
       coordinator_key="coordinator.pub", peers=None, require_secure=True, ...)

The protocol underneath is the native `cohort client`'s (heartbeats,
reconnects, CURVE, SecAgg+ masking, --peers), in C++ without the GIL.
  num_samples:     this client's training samples: its weight in the mean.
  identity:        its key file (cohort keygen); coordinator_key: the
                   coordinator's .pub (pinned). insecure=True: no CURVE.
  peers:           directory of .pub files, the only keys accepted in a
                   secure cohort (implies require_secure).
  require_secure:  refuse any round that is not securely aggregated.
  num_params:      the model's size; a coordinator's model of another size
                   is refused with both sizes named.
  delta:           fit returns the change to the parameters, not new ones.

run(fit, evaluate=None) runs until the coordinator finishes the run. fit is
called on the calling thread as fit(params, task): params is a float32 view
of the client's own buffer (valid during the call; train it in place or
return new values), task a Task (round, seed, epochs, batch_size,
optimizer, learning_rate, ...). It returns (params, num_samples, metrics),
metrics a dict with "loss" and "accuracy". A fit that raises or returns
something wrong (length, NaN/Inf, type) leaves that round as a dropout, with
an error line naming what was wrong; the run goes on. Ctrl-C says Goodbye to
the coordinator and raises KeyboardInterrupt.

evaluate(params, task), where the coordinator asks for federated evaluation
(rounds.federated_eval_every), is called before that round's fit on the
round's global model (a read-only view): it returns (num_samples, metrics)
for this client's own test split, metrics a dict with "loss" and
"accuracy". Without evaluate, or when it raises or returns something wrong
(an error line names it), the round's update goes without an evaluation.)";

}  // namespace

PYBIND11_MODULE(_client, m) {
  using cohort::python::Client;
  using cohort::python::PyTask;
  m.doc() =
      "The federated client's C++ core (see cohort.Client); `model`: native models "
      "under PyTorch's names and layouts (cohort.run_model).";
  py::module_ model = m.def_submodule("model",
                                      "Native Cohort models under PyTorch's names "
                                      "and layouts (train/torch_layout).");
  cohort::python::AddModelBindings(model);
  py::class_<PyTask>(m, "Task", "One round's task from the coordinator, as fit receives it.")
      .def_readonly("round", &PyTask::round)
      .def_readonly("task_id", &PyTask::task_id)
      .def_readonly("seed", &PyTask::seed, "Seeds this round's shuffling (run, round, client).")
      .def_readonly("epochs", &PyTask::epochs)
      .def_readonly("batch_size", &PyTask::batch_size)
      .def_readonly("optimizer", &PyTask::optimizer, "'sgd', 'adam' or 'adamw'.")
      .def_readonly("learning_rate", &PyTask::learning_rate)
      .def_readonly("momentum", &PyTask::momentum)
      .def_readonly("weight_decay", &PyTask::weight_decay)
      .def_readonly("proximal_mu", &PyTask::proximal_mu,
                    "FedProx's mu (train.proximal_mu): pass it to cohort.torch.fit_loop. "
                    "0: no proximal term.")
      .def_readonly("secure", &PyTask::secure, "Securely aggregated (SecAgg+).")
      .def_readonly("evaluate", &PyTask::evaluate,
                    "The coordinator asks for this round's federated evaluation.")
      .def_readonly("fednova", &PyTask::fednova,
                    "FedNova (train.fednova): fit must report the optimizer steps it took as "
                    "metrics['steps'] (cohort.torch.fit_loop does); the update is then divided "
                    "by their normaliser before it is sent.")
      .def_readonly("_buffer_address", &PyTask::buffer_address)
      .def("__repr__", [](const PyTask& t) {
        return "Task(round=" + std::to_string(t.round) + ", epochs=" + std::to_string(t.epochs) +
               ", batch_size=" + std::to_string(t.batch_size) + ", optimizer='" + t.optimizer +
               // The config's float32 values, as the config file wrote them.
               "', learning_rate=" + fmt::format("{}", static_cast<float>(t.learning_rate)) +
               (t.proximal_mu != 0
                    ? ", proximal_mu=" + fmt::format("{}", static_cast<float>(t.proximal_mu))
                    : "") +
               (t.fednova ? ", fednova=True" : "") + ", secure=" + (t.secure ? "True" : "False") +
               ")";
      });
  // Tests: ReadFitResult on its own; ValueError with its message.
  m.def(
      "_check_fit_result",
      [](const py::object& out, py::array_t<float> params, py::array_t<float> global, bool delta) {
        auto r = cohort::python::ReadFitResult(
            out, std::span<float>(params.mutable_data(), params.size()),
            std::span<const float>(global.data(), global.size()), delta);
        if (!r.ok()) throw py::value_error(std::string(r.status().message()));
        return py::make_tuple(r->samples, r->mean_loss, r->accuracy, r->steps);
      },
      py::arg("out"), py::arg("params"), py::arg("global_params"), py::arg("delta") = false);
  py::class_<Client>(m, "Client", kClientDoc)
      .def(py::init(&cohort::python::MakeClient), py::kw_only(), py::arg("coordinator"),
           py::arg("num_samples"), py::arg("identity") = py::none(),
           py::arg("coordinator_key") = py::none(), py::arg("peers") = py::none(),
           py::arg("require_secure") = true, py::arg("insecure") = false,
           py::arg("num_params") = py::none(), py::arg("name") = py::none(),
           py::arg("delta") = false, py::arg("corrupt_fraction") = 0.1,
           py::arg("log_level") = "info")
      .def("run", &Client::Run, py::arg("fit"), py::arg("evaluate") = py::none());
}
