#include "proto/config_io.h"

#include <fcntl.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/decimal.h"

namespace cohort::config {
namespace {

// Keeps the first error the text parser reports, with its position.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (message_.empty()) {
      // The parser counts from 0; editors count from 1.
      message_ = "line " + std::to_string(line + 1) + ", column " + std::to_string(column + 1) +
                 ": " + message;
    }
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

bool IsFinitePositive(float v) { return std::isfinite(v) && v > 0; }

// Every duration becomes int64 milliseconds (llround(s * 1000)) added to a
// steady clock. Below a millisecond it rounds to a deadline already past;
// 1e20 s overflows the arithmetic. A week is longer than any sensible wait.
constexpr double kMinSeconds = 0.001;
constexpr double kMaxSeconds = 7 * 24 * 3600.0;
// The client clamps the heartbeat it is told to [50 ms, 60 s]; a value
// outside would be silently changed.
constexpr double kMinHeartbeatS = 0.05;
constexpr double kMaxHeartbeatS = 60;
// A client is gone after this many heartbeat periods without a message (the
// client's own rule for a quiet coordinator).
constexpr double kTimeoutHeartbeats = 3;
// A config file is a few hundred bytes; this stops `--config /dev/zero`.
constexpr size_t kMaxConfigBytes = size_t{1} << 20;

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// "FIELD: must be in [LO, HI]UNIT, got V"; NaN is out of every range.
Status CheckRange(const char* field, double v, double lo, double hi, const char* unit = "") {
  if (v >= lo && v <= hi) return OkStatus();
  return InvalidArgumentError(std::string(field) + ": must be in [" + Number(lo) + ", " +
                              Number(hi) + "]" + unit + ", got " + Number(v));
}

Status CheckSeconds(const char* field, float v) {
  return CheckRange(field, v, kMinSeconds, kMaxSeconds, " seconds (1 ms to 7 days)");
}

std::string DescribeModel(const ModelConfig& m) {
  if (m.arch() != "mlp" && m.arch() != "logreg") {
    StatusOr<NetSpec> net = NetFromConfig(m);
    return net.ok() ? DescribeNet(*net) : m.arch();
  }
  std::string hidden;
  for (int i = 0; i < m.hidden_size() && i < 8; ++i) {
    hidden += (i ? ", " : "") + std::to_string(m.hidden(i));
  }
  if (m.hidden_size() > 8) hidden += ", ... (" + std::to_string(m.hidden_size()) + " layers)";
  return "input_dim " + std::to_string(m.input_dim()) + ", hidden [" + hidden + "], num_classes " +
         std::to_string(m.num_classes());
}

LayerSpec Linear(uint32_t out) { return LayerSpec{LayerKind::kLinear, out}; }
LayerSpec Relu() { return LayerSpec{LayerKind::kRelu}; }

// The layer list of a "sequential" model; kInvalidArgument naming the layer.
StatusOr<std::vector<LayerSpec>> LayersFromConfig(const ModelConfig& m) {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < m.layers_size(); ++i) {
    const LayerConfig& l = m.layers(i);
    LayerSpec spec;
    switch (l.kind_case()) {
      case LayerConfig::kLinear:
        spec = Linear(l.linear().out_features());
        break;
      case LayerConfig::kConv2D:
        spec = LayerSpec{LayerKind::kConv2d, l.conv2d().out_channels(), l.conv2d().kernel_size(),
                         l.conv2d().stride(), l.conv2d().padding()};
        break;
      case LayerConfig::kMaxPool2D: {
        const MaxPool2dLayer& p = l.max_pool2d();
        spec = LayerSpec{LayerKind::kMaxPool2d, 0, p.kernel_size(),
                         p.has_stride() ? p.stride() : p.kernel_size()};
        break;
      }
      case LayerConfig::kRelu:
        spec = Relu();
        break;
      case LayerConfig::kFlatten:
        spec = LayerSpec{LayerKind::kFlatten};
        break;
      default:
        return InvalidArgumentError("model.layers[" + std::to_string(i) +
                                    "]: names no layer (linear, conv2d, max_pool2d, relu, "
                                    "flatten)");
    }
    layers.push_back(spec);
  }
  return layers;
}

}  // namespace

StatusOr<NetSpec> NetFromConfig(const ModelConfig& m) {
  if (m.has_external()) {
    return InvalidArgumentError(
        "model.external: the run's model is the clients' own (a PyTorch model behind "
        "cohort.Client); Cohort's engine does not build it");
  }
  const bool sequential = m.layers_size() > 0;
  if (sequential && m.has_arch() && m.arch() != "sequential") {
    return InvalidArgumentError("model.arch: \"" + m.arch() +
                                "\" is a preset; a model that lists layers takes arch "
                                "\"sequential\" or none");
  }
  const std::string arch = sequential ? "sequential" : m.arch();
  if (!sequential && arch != "mlp" && arch != "logreg" && arch != "lenet5") {
    return InvalidArgumentError("model.arch: \"" + arch +
                                "\" is not one of mlp, logreg, lenet5 (or sequential with "
                                "layers)");
  }
  if ((arch == "logreg" || arch == "lenet5") && m.hidden_size() > 0) {
    return InvalidArgumentError("model.hidden: only mlp has hidden layers");
  }
  NetSpec net;
  net.num_classes = m.num_classes();
  if (m.has_input_shape()) {
    const InputShape& s = m.input_shape();
    net.input = Shape{s.channels(), s.height(), s.width()};
    if (m.has_input_dim() && net.input.size() != m.input_dim()) {
      return InvalidArgumentError("model.input_shape: " + std::to_string(net.input.size()) +
                                  " features, but input_dim is " + std::to_string(m.input_dim()));
    }
  } else if (arch == "lenet5") {
    if (m.input_dim() != 784) {
      return InvalidArgumentError("model.input_shape: lenet5 on input_dim " +
                                  std::to_string(m.input_dim()) + " needs an input_shape");
    }
    net.input = Shape{1, 28, 28};
  } else {
    net.input = Shape{m.input_dim(), 1, 1};
  }
  if (sequential) {
    COHORT_ASSIGN_OR_RETURN(net.layers, LayersFromConfig(m));
  } else {
    net.layers = PresetLayers(arch, m.num_classes(), {m.hidden().begin(), m.hidden().end()});
  }
  return net;
}

StatusOr<NetPlan> PlanModel(const ModelConfig& m) {
  COHORT_ASSIGN_OR_RETURN(NetSpec net, NetFromConfig(m));
  StatusOr<NetPlan> plan = PlanNet(net);
  if (!plan.ok()) return plan.status().WithContext("model");
  return plan;
}

namespace {

// The path of the first field below `m` that the schema does not know (JSON
// keeps an out-of-range enum number as one), or "" when there is none.
std::string FirstUnknownField(const google::protobuf::Message& m, const std::string& path = "") {
  const google::protobuf::Reflection* reflection = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(m);
  if (!unknown.empty()) {
    const int number = unknown.field(0).number();
    const auto* field = m.GetDescriptor()->FindFieldByNumber(number);
    const std::string name = field != nullptr ? field->name() : std::to_string(number);
    return path.empty() ? name : path + "." + name;
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(m, &fields);
  for (const auto* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string below = path.empty() ? field->name() : path + "." + field->name();
    const int count = field->is_repeated() ? reflection->FieldSize(m, field) : 1;
    for (int i = 0; i < count; ++i) {
      const auto& child = field->is_repeated() ? reflection->GetRepeatedMessage(m, field, i)
                                               : reflection->GetMessage(m, field);
      if (std::string found = FirstUnknownField(child, below); !found.empty()) return found;
    }
  }
  return "";
}

}  // namespace

uint64_t StepFloatsPerSample(const ModelConfig& model) {
  StatusOr<NetPlan> plan = PlanModel(model);
  return plan.ok() ? plan->step_floats_per_sample : 0;
}

uint32_t EvalBatchSize(const ModelConfig& model) {
  const uint64_t per_sample = std::max<uint64_t>(StepFloatsPerSample(model), 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(kMaxStepFloats / per_sample, 1, 1000));
}

Status ParseTextStrict(std::string_view text, std::string_view source,
                       google::protobuf::Message& message) {
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  if (!parser.ParseFromString(std::string(text), &message)) {
    return InvalidArgumentError(std::string(source) + ": " + errors.message());
  }
  return OkStatus();
}

StatusOr<RunConfig> ParseRunConfig(std::string_view text, std::string_view source_name) {
  RunConfig config;
  const size_t first = text.find_first_not_of(" \t\r\n");
  const std::string where(source_name);
  if (first != std::string_view::npos && text[first] == '{') {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    auto status = google::protobuf::util::JsonStringToMessage(std::string(text), &config, options);
    if (!status.ok()) {
      return InvalidArgumentError(where +
                                  ": invalid JSON config: " + std::string(status.message()));
    }
    // JSON takes an enum number that names no value ("aggregation": 4); proto2
    // keeps it as an unknown field, which the run store could not read back.
    if (const std::string field = FirstUnknownField(config); !field.empty()) {
      return InvalidArgumentError(where + ": invalid JSON config: " + field +
                                  " is not a value this field allows");
    }
  } else {
    COHORT_RETURN_IF_ERROR(ParseTextStrict(text, where, config));
  }
  COHORT_RETURN_IF_ERROR(ValidateRunConfig(config).WithContext(where));
  return config;
}

StatusOr<RunConfig> LoadRunConfig(const std::string& path) {
  // open + fstat rather than std::ifstream: an ifstream opens a directory and
  // reads it as an empty file, which parses as a run on defaults.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    return NotFoundError(path + ": cannot open config file: " + why);
  }
  struct stat st = {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return NotFoundError(path + ": cannot stat config file: " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": is a directory, not a config file");
  }
  // Not only regular files: `--config <(generate)` is a pipe.
  std::string text;
  char buf[65536];
  while (text.size() <= kMaxConfigBytes) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return NotFoundError(path + ": cannot read config file: " + std::strerror(err));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (text.size() > kMaxConfigBytes) {
    return InvalidArgumentError(path + ": config file is larger than " +
                                std::to_string(kMaxConfigBytes) + " bytes");
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return InvalidArgumentError(path +
                                ": config file is empty; write at least one field (a run "
                                "on defaults is `name: \"run\"`)");
  }
  return ParseRunConfig(text, path);
}

namespace {

Status CheckDataParallel(const RunConfig& c) {
  if (c.data().train_shard().empty()) {
    return InvalidArgumentError("data.train_shard: DATA_PARALLEL needs the training set");
  }
  const DataParallelConfig& dp = c.data_parallel();
  if (dp.epochs() == 0 || dp.epochs() > 100000) {
    return InvalidArgumentError("data_parallel.epochs: must be in [1, 100000]");
  }
  if (dp.accumulation_steps() == 0 || dp.accumulation_steps() > 4096) {
    return InvalidArgumentError("data_parallel.accumulation_steps: must be in [1, 4096]");
  }
  if (!(dp.bucket_mb() >= 0 && dp.bucket_mb() <= 1024)) {
    return InvalidArgumentError("data_parallel.bucket_mb: must be in [0, 1024]");
  }
  if (dp.local_sgd_steps() > 1000000) {
    return InvalidArgumentError("data_parallel.local_sgd_steps: must be in [0, 1000000]");
  }
  if (dp.check_replicas_every() > 1000000) {
    return InvalidArgumentError("data_parallel.check_replicas_every: must be in [0, 1000000]");
  }
  if (dp.gradient_dtype() != FLOAT32 && dp.exact()) {
    return InvalidArgumentError(
        "data_parallel.gradient_dtype: exact mode sums float32 gradients only (FLOAT32)");
  }
  if (dp.gradient_dtype() != FLOAT32 && dp.local_sgd_steps() > 0) {
    return InvalidArgumentError(
        "data_parallel.gradient_dtype: local SGD averages float32 models, not gradients "
        "(FLOAT32)");
  }
  if (dp.accumulation_steps() > 1 && dp.local_sgd_steps() > 0) {
    return InvalidArgumentError(
        "data_parallel: gradient accumulation (accumulation_steps) and local SGD "
        "(local_sgd_steps) cannot be combined");
  }
  return CheckSeconds("data_parallel.timeout_s", dp.timeout_s());
}

// A model the clients bring: its size within the cap, a layout that adds up
// to it, and nothing of Cohort's own layer settings beside it.
Status CheckExternal(const RunConfig& c) {
  const ModelConfig& m = c.model();
  const ExternalModel& e = m.external();
  if (c.mode() == DATA_PARALLEL) {
    return InvalidArgumentError(
        "model.external: DATA_PARALLEL trains Cohort's own models; a PyTorch model trains "
        "data-parallel under torch.distributed with backend=\"cohort\"");
  }
  if (m.has_arch() || m.hidden_size() > 0 || m.layers_size() > 0 || m.has_input_shape()) {
    return InvalidArgumentError(
        "model.external: a model the clients bring takes no arch, hidden, layers or "
        "input_shape");
  }
  if (e.num_params() == 0 || e.num_params() > kMaxModelParams) {
    return InvalidArgumentError("model.external.num_params: must be in [1, " +
                                std::to_string(kMaxModelParams) + "] (2^26)");
  }
  if (c.data().has_test_shard() && !c.data().test_shard().empty()) {
    return InvalidArgumentError(
        "data.test_shard: the coordinator cannot evaluate a model the clients bring "
        "(model.external); leave it out");
  }
  if (e.layout_size() == 0) return OkStatus();
  uint64_t total = 0;
  std::set<std::string> names;
  for (int i = 0; i < e.layout_size(); ++i) {
    const ExternalModel::Tensor& t = e.layout(i);
    const std::string at = "model.external.layout[" + std::to_string(i) + "]";
    if (t.name().empty()) return InvalidArgumentError(at + ".name: must not be empty");
    if (!names.insert(t.name()).second) {
      return InvalidArgumentError(at + ".name: \"" + t.name() + "\" is named twice");
    }
    uint64_t size = 1;
    for (uint64_t d : t.shape()) {
      if (d == 0 || d > kMaxModelParams) {
        return InvalidArgumentError(at + ".shape: each size must be in [1, 2^26]");
      }
      size *= d;
      if (size > kMaxModelParams) {
        return InvalidArgumentError(at + ".shape: more than 2^26 values");
      }
    }
    total += size;
  }
  if (total != e.num_params()) {
    return InvalidArgumentError("model.external.layout: its tensors hold " + std::to_string(total) +
                                " values, but num_params is " + std::to_string(e.num_params()));
  }
  return OkStatus();
}

// The model section's ranges, then its plan (shapes, within the caps).
StatusOr<NetPlan> CheckModel(const ModelConfig& m) {
  if (m.input_dim() == 0 || m.input_dim() > (1u << 24)) {
    return InvalidArgumentError("model.input_dim: must be in [1, 2^24]");
  }
  if (m.num_classes() < 2 || m.num_classes() > 65536) {
    return InvalidArgumentError("model.num_classes: must be in [2, 65536]");
  }
  for (int i = 0; i < m.hidden_size(); ++i) {
    if (m.hidden(i) == 0 || m.hidden(i) > (1u << 20)) {
      return InvalidArgumentError("model.hidden[" + std::to_string(i) + "]: must be in [1, 2^20]");
    }
  }
  COHORT_ASSIGN_OR_RETURN(NetPlan plan, PlanModel(m));
  if (plan.params > kMaxModelParams) {
    return InvalidArgumentError("model: " + DescribeModel(m) + " make " +
                                std::to_string(plan.params) + " parameters; at most " +
                                std::to_string(kMaxModelParams) + " (2^26) are supported");
  }
  return plan;
}

Status CheckPartition(const PartitionConfig& p) {
  if (p.format() != "idx" && p.format() != "synthetic") {
    return InvalidArgumentError("data.partition.format: must be idx or synthetic");
  }
  if (p.clients() == 0 || p.clients() > 1000000) {
    return InvalidArgumentError("data.partition.clients: must be in [1, 1000000]");
  }
  if (p.format() == "synthetic" &&
      (p.samples() == 0 || p.samples() > (1u << 26) || p.test_samples() > (1u << 26) ||
       p.features() == 0 || p.features() > (1u << 16) || p.classes() < 2 || p.classes() > 65536)) {
    return InvalidArgumentError(
        "data.partition: synthetic needs samples in [1, 2^26], test_samples <= 2^26, features "
        "in [1, 65536] and classes in [2, 65536]");
  }
  return OkStatus();
}

// The batch size, and the floats one step of it holds (PlanNet bounds every
// activation, so the product cannot overflow).
Status CheckBatch(const TrainConfig& t, const NetPlan& plan, const ModelConfig& m) {
  if (t.batch_size() == 0 || t.batch_size() > 65536) {
    return InvalidArgumentError("train.batch_size: must be in [1, 65536]");
  }
  const uint64_t per_sample = plan.step_floats_per_sample;
  const uint64_t floats = per_sample * t.batch_size();
  if (floats > kMaxStepFloats) {
    return InvalidArgumentError(
        "train.batch_size: " + std::to_string(t.batch_size()) + " samples x " +
        std::to_string(per_sample) + " floats each (inputs, activations, gradients of " +
        DescribeModel(m) + ") = " + std::to_string(floats) + " floats per step; at most " +
        std::to_string(kMaxStepFloats) + " (2^28, 1 GiB)");
  }
  return OkStatus();
}

// The local optimizer's settings: SGD's and Adam's, and which belong to which.
Status CheckOptimizer(const TrainConfig& t) {
  if (!IsFinitePositive(t.learning_rate())) {
    return InvalidArgumentError("train.learning_rate: must be > 0");
  }
  if (!std::isfinite(t.momentum()) || t.momentum() < 0 || t.momentum() >= 1) {
    return InvalidArgumentError("train.momentum: must be in [0, 1)");
  }
  if (!std::isfinite(t.weight_decay()) || t.weight_decay() < 0) {
    return InvalidArgumentError("train.weight_decay: must be >= 0");
  }
  if (!std::isfinite(t.dampening()) || t.dampening() < 0 || t.dampening() > 1) {
    return InvalidArgumentError("train.dampening: must be in [0, 1]");
  }
  if (t.nesterov() && (t.optimizer() != SGD || t.momentum() == 0 || t.dampening() != 0)) {
    return InvalidArgumentError(
        "train.nesterov: needs optimizer SGD with momentum > 0 and dampening 0");
  }
  if (t.optimizer() != SGD && t.momentum() != 0) {
    return InvalidArgumentError("train.momentum: SGD only; Adam uses beta1");
  }
  if (t.optimizer() != SGD && t.dampening() != 0) {
    return InvalidArgumentError("train.dampening: SGD only");
  }
  if (!std::isfinite(t.beta1()) || t.beta1() < 0 || t.beta1() >= 1) {
    return InvalidArgumentError("train.beta1: must be in [0, 1)");
  }
  if (!std::isfinite(t.beta2()) || t.beta2() < 0 || t.beta2() >= 1) {
    return InvalidArgumentError("train.beta2: must be in [0, 1)");
  }
  if (!IsFinitePositive(t.eps())) {
    return InvalidArgumentError("train.eps: must be > 0");
  }
  if (!std::isfinite(t.proximal_mu()) || t.proximal_mu() < 0) {
    return InvalidArgumentError(
        "train.proximal_mu: must be a finite value >= 0 (0: no FedProx "
        "term), got " +
        Number(t.proximal_mu()));
  }
  return OkStatus();
}

Status CheckRounds(const RoundsConfig& r) {
  if (r.num_rounds() == 0 || r.num_rounds() > 1000000) {
    return InvalidArgumentError("rounds.num_rounds: must be in [1, 1000000]");
  }
  if (r.min_clients() == 0) {
    return InvalidArgumentError("rounds.min_clients: must be >= 1");
  }
  if (r.start_clients() != 0 && r.start_clients() < r.min_clients()) {
    return InvalidArgumentError("rounds.start_clients: must be 0 or >= rounds.min_clients");
  }
  if (!std::isfinite(r.fraction()) || r.fraction() <= 0 || r.fraction() > 1) {
    return InvalidArgumentError("rounds.fraction: must be in (0, 1]");
  }
  if (r.max_clients_per_round() != 0 && r.max_clients_per_round() < r.min_clients()) {
    return InvalidArgumentError("rounds.max_clients_per_round: must be 0 or >= rounds.min_clients");
  }
  COHORT_RETURN_IF_ERROR(CheckSeconds("rounds.round_deadline_s", r.round_deadline_s()));
  COHORT_RETURN_IF_ERROR(CheckSeconds("rounds.client_timeout_s", r.client_timeout_s()));
  if (r.keep_checkpoints() == 0) {
    return InvalidArgumentError("rounds.keep_checkpoints: must be >= 1");
  }
  if (r.federated_eval_every() > 1000000) {
    return InvalidArgumentError("rounds.federated_eval_every: must be in [0, 1000000] (0: never)");
  }
  return OkStatus();
}

// The heartbeat, the client timeout it bounds, and the header cap.
Status CheckNet(const NetConfig& n, const RoundsConfig& r) {
  COHORT_RETURN_IF_ERROR(
      CheckRange("net.heartbeat_s", n.heartbeat_s(), kMinHeartbeatS, kMaxHeartbeatS, " seconds"));
  // A live client says something every heartbeat; a shorter timeout marks it
  // gone between two of them.
  if (double{r.client_timeout_s()} < kTimeoutHeartbeats * n.heartbeat_s()) {
    return InvalidArgumentError("rounds.client_timeout_s: must be at least 3 x net.heartbeat_s (" +
                                Number(kTimeoutHeartbeats * n.heartbeat_s()) + " seconds), got " +
                                Number(r.client_timeout_s()));
  }
  if (n.max_header_bytes() < 1024) {
    return InvalidArgumentError("net.max_header_bytes: must be >= 1024");
  }
  return OkStatus();
}

// Checked only when the aggregation is secure (SECAGG, SECAGG_PLUS).
Status CheckSecAgg(const SecAggConfig& sa, const RoundsConfig& r) {
  if (r.max_clients_per_round() != 0 && r.max_clients_per_round() < 3) {
    return InvalidArgumentError(
        "rounds.max_clients_per_round: secure aggregation needs cohorts of >= 3 clients");
  }
  if (!IsFinitePositive(sa.clip()) || sa.clip() > 1e6f) {
    return InvalidArgumentError("secagg.clip: must be in (0, 1e6]");
  }
  // The threshold is above half of each client's neighbours, so a round
  // in which half the cohort drops aborts whatever the graph.
  if (!std::isfinite(sa.expected_dropout()) || sa.expected_dropout() < 0 ||
      sa.expected_dropout() >= 0.5f) {
    return InvalidArgumentError("secagg.expected_dropout: must be in [0, 0.5)");
  }
  if (!sa.consistency_check()) {
    return InvalidArgumentError(
        "secagg.consistency_check: must be true: clients refuse to unmask without the "
        "survivors' signatures");
  }
  if (!std::isfinite(sa.corrupt_fraction()) || sa.corrupt_fraction() < 0 ||
      sa.corrupt_fraction() >= 0.5f) {
    return InvalidArgumentError("secagg.corrupt_fraction: must be in [0, 0.5)");
  }
  if (!std::isfinite(sa.l2_clip()) || sa.l2_clip() < 0) {
    return InvalidArgumentError("secagg.l2_clip: must be a finite value >= 0 (0: no bound), got " +
                                Number(sa.l2_clip()));
  }
  return CheckSeconds("secagg.stage_timeout_s", sa.stage_timeout_s());
}

// The server step: FedAvg(M)'s settings or an adaptive optimizer's, never a
// mix of both.
Status CheckServerOptimizer(const ServerConfig& s) {
  if (s.optimizer() == FEDAVG) {
    const std::pair<const char*, bool> adaptive[] = {
        {"beta_1", s.has_beta_1()}, {"beta_2", s.has_beta_2()}, {"tau", s.has_tau()}};
    for (const auto& [field, set] : adaptive) {
      if (!set) continue;
      return InvalidArgumentError(std::string("server.") + field +
                                  ": a setting of the adaptive server optimizers, but "
                                  "server.optimizer is FEDAVG (set FEDADAM, FEDYOGI or "
                                  "FEDADAGRAD, or leave server." +
                                  field + " out)");
    }
    return OkStatus();
  }
  const std::string name = ServerOptimizer_Name(s.optimizer());
  if (s.momentum() != 0) {
    return InvalidArgumentError(
        "server.momentum: FedAvgM's momentum does not combine with "
        "server.optimizer " +
        name + ", which keeps its own first moment (server.beta_1)");
  }
  if (!s.has_learning_rate()) {
    return InvalidArgumentError(
        "server.learning_rate: server.optimizer " + name +
        " needs it set: the default 1.0 is FedAvg's step, far too large an adaptive one "
        "(Flower uses 0.1 for FEDADAM and FEDADAGRAD, 0.01 for FEDYOGI)");
  }
  if (s.optimizer() == FEDADAGRAD && s.has_beta_2()) {
    return InvalidArgumentError(
        "server.beta_2: server.optimizer FEDADAGRAD adds up every squared delta without "
        "decay; beta_2 is FEDADAM's and FEDYOGI's");
  }
  if (!std::isfinite(s.beta_1()) || s.beta_1() < 0 || s.beta_1() >= 1) {
    return InvalidArgumentError("server.beta_1: must be in [0, 1), got " + Number(s.beta_1()));
  }
  if (!std::isfinite(s.beta_2()) || s.beta_2() < 0 || s.beta_2() >= 1) {
    return InvalidArgumentError("server.beta_2: must be in [0, 1), got " + Number(s.beta_2()));
  }
  // tau² starts v: below 1e-18 it would fall out of float's normal range.
  return CheckRange("server.tau", s.tau(), 1e-18, 1e6);
}

bool IsKrumFamily(RobustRule rule) { return rule == KRUM || rule == MULTI_KRUM || rule == BULYAN; }

// A setting of another rule than the configured one.
Status CheckRobustFields(const RobustConfig& r) {
  const std::string name = RobustRule_Name(r.rule());
  const auto foreign = [&](const char* field, const char* owner) {
    return InvalidArgumentError(std::string("server.robust.") + field + ": a setting of " + owner +
                                ", but server.robust.rule is " + name);
  };
  if (r.has_trim_fraction() && r.rule() != TRIMMED_MEAN) {
    return foreign("trim_fraction", "TRIMMED_MEAN");
  }
  if (r.has_byzantine_clients() && !IsKrumFamily(r.rule())) {
    return foreign("byzantine_clients", "KRUM, MULTI_KRUM and BULYAN");
  }
  if (r.has_multi_krum_m() && r.rule() != MULTI_KRUM) return foreign("multi_krum_m", "MULTI_KRUM");
  if (!(r.trim_fraction() >= 0 && r.trim_fraction() < 0.5f)) {
    return InvalidArgumentError("server.robust.trim_fraction: must be in [0, 0.5), got " +
                                Number(r.trim_fraction()));
  }
  return OkStatus();
}

// Each rule's smallest cohort, known from rounds.min_clients: a round
// commits with no fewer updates. At fewer, the median and the trimmed mean
// would be the plain mean, silently.
Status CheckRobustCohort(const RobustConfig& r, const RoundsConfig& rounds) {
  const uint32_t n = rounds.min_clients();
  if (r.rule() == MEDIAN && n < 3) {
    return InvalidArgumentError(
        "server.robust.rule: MEDIAN of fewer than 3 updates is their mean, and "
        "rounds.min_clients is " +
        std::to_string(n) + " (a round commits with as few); raise rounds.min_clients to 3");
  }
  // As aggregation/robust.cc's TrimmedMean counts.
  const uint64_t cut = FloorOfDecimalTimes(r.trim_fraction(), n);
  if (r.rule() == TRIMMED_MEAN && cut == 0) {
    return InvalidArgumentError(
        "server.robust.trim_fraction: " + Number(r.trim_fraction()) + " of rounds.min_clients " +
        std::to_string(n) +
        " updates rounds down to 0 cut from each end (a round commits with as few), which is "
        "the plain mean; raise trim_fraction to at least 1 / rounds.min_clients or raise "
        "rounds.min_clients");
  }
  if (!IsKrumFamily(r.rule())) return OkStatus();
  const std::string name = RobustRule_Name(r.rule());
  const uint64_t f = r.byzantine_clients();
  if (f == 0) {
    // (Independent review: MULTI_KRUM then averaged every update, BULYAN
    // took the plain mean, KRUM one update for no reason.)
    return InvalidArgumentError(
        "server.robust.byzantine_clients: " + name +
        " tolerating f = 0 Byzantine clients defends against none (MULTI_KRUM and BULYAN "
        "would be the plain mean); set f, at least 1, to the Byzantine clients to tolerate");
  }
  const bool bulyan = r.rule() == BULYAN;
  const uint64_t least = bulyan ? 4 * f + 3 : 2 * f + 3;
  if (rounds.min_clients() < least) {
    return InvalidArgumentError(
        "server.robust.byzantine_clients: " + name + " tolerating f = " + std::to_string(f) +
        " Byzantine clients needs n >= " + (bulyan ? "4f + 3" : "2f + 3") + " = " +
        std::to_string(least) + " updates a round, but rounds.min_clients is " +
        std::to_string(rounds.min_clients()) +
        " (a round commits with as few); raise rounds.min_clients or lower byzantine_clients");
  }
  const uint64_t most = rounds.min_clients() - f;
  if (r.rule() == MULTI_KRUM && r.multi_krum_m() > most) {
    return InvalidArgumentError(
        "server.robust.multi_krum_m: must be in [1, rounds.min_clients - "
        "byzantine_clients] = [1, " +
        std::to_string(most) + "] (0: n - f), got " + std::to_string(r.multi_krum_m()));
  }
  return OkStatus();
}

// server.robust: a rule, for plain federated rounds, with its own settings
// only and a cohort large enough.
Status CheckRobust(const RunConfig& c) {
  const RobustConfig& r = c.server().robust();
  if (r.rule() == ROBUST_RULE_UNSPECIFIED) {
    return InvalidArgumentError(
        "server.robust.rule: must be MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM or BULYAN");
  }
  const std::string name = RobustRule_Name(r.rule());
  if (c.secagg().aggregation() != PLAIN) {
    return InvalidArgumentError(
        "server.robust.rule: " + name + " needs every client's update, but secagg.aggregation " +
        Aggregation_Name(c.secagg().aggregation()) +
        " shows the coordinator only the sum of the masked updates; set secagg.aggregation: "
        "PLAIN (a coordinator trusted with each update) or leave server.robust out");
  }
  COHORT_RETURN_IF_ERROR(CheckRobustFields(r));
  return CheckRobustCohort(r, c.rounds());
}

// The largest privacy.target_delta accepted (CheckPrivacy says why).
constexpr double kMaxTargetDelta = 0.01;

// privacy.adaptive_clip: the quantile in (0, 1), a step in range, and
// count noise that leaves the update's noise multiplier
// (z^-2 - (2 sigma_b)^-2)^-1/2 finite (coordinator/adaptive_clip.h).
Status CheckAdaptiveClip(const PrivacyConfig& p) {
  const AdaptiveClipConfig& a = p.adaptive_clip();
  if (!(a.target_quantile() > 0 && a.target_quantile() < 1)) {
    return InvalidArgumentError(
        "privacy.adaptive_clip.target_quantile: must be in (0, 1) (the fraction of updates "
        "left unclipped), got " +
        Number(a.target_quantile()));
  }
  COHORT_RETURN_IF_ERROR(
      CheckRange("privacy.adaptive_clip.learning_rate", a.learning_rate(), 1e-6, 10));
  const double half_z = p.noise_multiplier() / 2;
  if (!(a.clipped_count_stddev() > half_z) || std::isinf(a.clipped_count_stddev())) {
    return InvalidArgumentError(
        "privacy.adaptive_clip.clipped_count_stddev: must be finite and above "
        "privacy.noise_multiplier / 2 = " +
        Number(half_z) + ", got " + Number(a.clipped_count_stddev()) +
        " (the count's noise takes a share of the privacy budget, and the update keeps "
        "noise multiplier (z^-2 - (2 sigma_b)^-2)^-1/2, which needs 2 sigma_b > z; the paper "
        "suggests the expected cohort / 20)");
  }
  // Under DISTRIBUTED_SKELLAM the bit rides in the masked vector with the
  // clients' noise share (coordinator/strategy_dp.h, privacy/skellam.h).
  return OkStatus();
}

// privacy.mechanism DISTRIBUTED_SKELLAM: the clients noise their own
// updates, which only secure aggregation then hides; the scale of the
// 32-bit grid needs a bound on the inputs in one sum.
Status CheckDistributedPrivacy(const RunConfig& c) {
  constexpr char kWhat[] = "privacy.mechanism DISTRIBUTED_SKELLAM: ";
  if (c.mode() != FEDERATED) {
    return InvalidArgumentError(std::string(kWhat) +
                                "needs mode: FEDERATED (the clients' noise rides in federated "
                                "rounds' masked updates)");
  }
  if (c.secagg().aggregation() == PLAIN) {
    return InvalidArgumentError(
        std::string(kWhat) +
        "each client adds only its share of the noise, which hides its update only inside "
        "the sum; secagg.aggregation PLAIN would show the coordinator every update with a "
        "fraction of the noise. Set secagg.aggregation: SECAGG or SECAGG_PLUS, or "
        "privacy.mechanism: CENTRAL_GAUSSIAN for a trusted coordinator");
  }
  if (c.rounds().max_clients_per_round() == 0) {
    return InvalidArgumentError(
        std::string(kWhat) +
        "needs rounds.max_clients_per_round > 0: the integer grid is chosen at start-up so "
        "that the 32-bit sum of at most that many noised updates does not wrap around");
  }
  if (c.secagg().l2_clip() != 0) {
    return InvalidArgumentError(std::string(kWhat) +
                                "each client clips its update to privacy.clip_norm itself; "
                                "leave secagg.l2_clip 0");
  }
  if (c.rounds().federated_eval_every() > 0) {
    return InvalidArgumentError(
        std::string(kWhat) +
        "rounds.federated_eval_every would have the clients' evaluation means unmasked without "
        "noise, which the accountant does not cover (the clients leave those slots empty under "
        "distributed DP); set rounds.federated_eval_every to 0 (the coordinator's own test set "
        "still evaluates each round)");
  }
  return OkStatus();
}

// privacy: central DP (DP-FedAvg) on plain federated rounds, or distributed
// DP under secure aggregation, with its four numbers in range.
Status CheckPrivacy(const RunConfig& c) {
  const bool distributed = c.privacy().mechanism() == DISTRIBUTED_SKELLAM;
  if (distributed) COHORT_RETURN_IF_ERROR(CheckDistributedPrivacy(c));
  if (!distributed && c.mode() != FEDERATED) {
    return InvalidArgumentError(
        "privacy: central differential privacy needs mode: FEDERATED (it is DP-FedAvg, over "
        "federated rounds); mode: DATA_PARALLEL has no per-example clipping (DP-SGD is not "
        "built): set mode: FEDERATED or leave privacy out");
  }
  if (!distributed && c.secagg().aggregation() != PLAIN) {
    return InvalidArgumentError(
        "privacy: central differential privacy clips and noises each update on the "
        "coordinator, but secagg.aggregation " +
        Aggregation_Name(c.secagg().aggregation()) +
        " hides the updates from it; the coordinator would have to be trusted with the "
        "un-noised sum, which secure aggregation is there to deny it. Set secagg.aggregation: "
        "PLAIN for central DP (a trusted coordinator), or set privacy.mechanism: "
        "DISTRIBUTED_SKELLAM (the "
        "clients' noise under secure aggregation)");
  }
  if (c.server().has_robust()) {
    return InvalidArgumentError(
        "privacy: the noise is calibrated to the sum of clipped updates; server.robust "
        "replaces the sum by a rule whose sensitivity is not accounted for; leave one out");
  }
  const PrivacyConfig& p = c.privacy();
  COHORT_RETURN_IF_ERROR(CheckRange("privacy.noise_multiplier", p.noise_multiplier(), 1e-3, 1e6));
  COHORT_RETURN_IF_ERROR(CheckRange("privacy.clip_norm", p.clip_norm(), 1e-9, 1e6));
  // Central DP refuses no update for its length (it clips every one);
  // server.max_update_norm is the clip norm's upper bound there (adaptive
  // clipping's cap), so a clip norm above it is a contradiction. Compared
  // in float, the field's type, so the same number in both passes.
  const float max_norm = c.server().max_update_norm();
  if (!distributed && max_norm > 0 && max_norm < static_cast<float>(p.clip_norm())) {
    return InvalidArgumentError(
        "server.max_update_norm " + Number(max_norm) + " is below privacy.clip_norm " +
        Number(p.clip_norm()) +
        ": under central DP it bounds the clip norm (updates are clipped, never refused for "
        "their length); set server.max_update_norm to 0 (no bound) or to at least "
        "privacy.clip_norm");
  }
  // delta is the chance the epsilon bound fails outright: publishing the
  // data of one of N clients, picked at random, in full is (0, 1/N)-DP, so
  // delta must stay far below 1 / the clients. 0.01 (meaningful only from
  // hundreds of clients up) is a loose upper limit that refuses the
  // nonsense values: at delta 0.5 and sigma 20 the conversion gives
  // epsilon -0.69, clamped to 0, a "perfect" privacy for any run.
  if (!(p.target_delta() > 0 && p.target_delta() <= kMaxTargetDelta)) {
    return InvalidArgumentError(
        "privacy.target_delta: must be in (0, 0.01], got " + Number(p.target_delta()) +
        " (delta is the chance the guarantee fails outright; keep it well below 1 / the "
        "number of clients, e.g. the default 1e-5)");
  }
  COHORT_RETURN_IF_ERROR(
      CheckRange("privacy.epsilon_budget", p.epsilon_budget(), 0, 1e6, " (0: no budget)"));
  if (!distributed && p.budget_view() == RELEASED_MODEL) {
    return InvalidArgumentError(
        "privacy.budget_view: RELEASED_MODEL is distributed DP's amplified view and needs "
        "privacy.mechanism: DISTRIBUTED_SKELLAM; with privacy.mechanism: CENTRAL_GAUSSIAN the "
        "one epsilon already amplifies by the cohort's sampling (leave budget_view out)");
  }
  return p.has_adaptive_clip() ? CheckAdaptiveClip(p) : OkStatus();
}

// train.fednova: FedNova's normaliser is that of heavy-ball SGD's local
// steps (aggregation/fednova.h), and its rescaled mean is a federated
// round's weighted mean.
Status CheckFedNova(const RunConfig& c) {
  const TrainConfig& t = c.train();
  if (c.mode() != FEDERATED) {
    return InvalidArgumentError(
        "train.fednova: FedNova normalises each client's round of local steps; DATA_PARALLEL "
        "workers step together and have no rounds");
  }
  if (t.optimizer() != SGD) {
    return InvalidArgumentError("train.fednova: needs train.optimizer SGD (the normaliser of " +
                                Optimizer_Name(t.optimizer()) + "'s steps is not defined)");
  }
  if (t.nesterov() || t.dampening() != 0) {
    return InvalidArgumentError(
        "train.fednova: the normaliser is heavy-ball momentum's; set train.nesterov false and "
        "train.dampening 0");
  }
  if (t.proximal_mu() != 0) {
    return InvalidArgumentError(
        "train.fednova: with FedProx's term (train.proximal_mu) the steps have another "
        "normaliser, which is not built; leave one of them out");
  }
  if (c.server().has_robust()) {
    return InvalidArgumentError(
        "train.fednova: server.robust replaces the weighted mean that FedNova rescales by "
        "the clients' tau_eff; leave one of them out");
  }
  if (c.has_privacy()) {
    return InvalidArgumentError(
        "train.fednova: privacy's noise is calibrated to the mean of clipped updates, which "
        "FedNova would rescale by the clients' own tau_eff; leave one of them out");
  }
  return OkStatus();
}

// train.scaffold: the correction and c_i+ = c_i - c + (x - y) / (K lr)
// are SGD's (aggregation/scaffold.h), and the variates' change is summed
// beside the model's weighted mean.
Status CheckScaffold(const RunConfig& c) {
  const TrainConfig& t = c.train();
  if (c.mode() != FEDERATED) {
    return InvalidArgumentError(
        "train.scaffold: SCAFFOLD corrects each client's round of local steps; DATA_PARALLEL "
        "workers step together and have no rounds");
  }
  if (t.optimizer() != SGD) {
    return InvalidArgumentError(
        "train.scaffold: needs train.optimizer SGD (c_i+ = c_i - c + (x - y) / (K lr) is SGD's; " +
        Optimizer_Name(t.optimizer()) + "'s steps are not)");
  }
  if (t.fednova()) {
    return InvalidArgumentError(
        "train.scaffold: train.fednova rescales the deltas that SCAFFOLD's variates are "
        "computed from; leave one of them out");
  }
  if (c.server().has_robust()) {
    return InvalidArgumentError(
        "train.scaffold: server.robust replaces the sums that SCAFFOLD's control variates "
        "need; leave one of them out");
  }
  if (c.has_privacy()) {
    return InvalidArgumentError(
        "train.scaffold: privacy's clipping and noise cover the model's update, not the control "
        "variates that would ride with it; leave one of them out");
  }
  if (c.model().has_external()) {
    return InvalidArgumentError(
        "train.scaffold: model.external is trained by the Python client's fit, which does not "
        "apply SCAFFOLD's control variates (every client would refuse every round); leave one of "
        "them out");
  }
  return OkStatus();
}

// A setting only the other mode reads, set explicitly: a config error
// rather than a setting silently ignored.
Status CheckModeFields(const RunConfig& c) {
  if (c.mode() == FEDERATED) {
    if (!c.has_data_parallel()) return OkStatus();
    return InvalidArgumentError(
        "data_parallel: settings of mode DATA_PARALLEL, but mode is FEDERATED (its rounds are "
        "rounds.num_rounds of local training); set mode: DATA_PARALLEL or leave data_parallel "
        "out");
  }
  const char* field = c.server().has_learning_rate()          ? "server.learning_rate"
                      : c.server().has_momentum()             ? "server.momentum"
                      : c.secagg().has_l2_clip()              ? "secagg.l2_clip"
                      : c.rounds().has_federated_eval_every() ? "rounds.federated_eval_every"
                                                              : nullptr;
  if (field == nullptr) return OkStatus();
  return InvalidArgumentError(
      std::string(field) +
      ": a setting of federated rounds; DATA_PARALLEL workers step their own optimizer "
      "(train.*) on all-reduced gradients and have no rounds; leave it out");
}

// The largest fedbuff.buffer_size and concurrency.
constexpr uint32_t kMaxFedBuffClients = 100000;

// fedbuff's own two numbers, and the rounds fields its groups replace.
Status CheckFedBuffSizes(const RunConfig& c) {
  const FedBuffConfig& f = c.fedbuff();
  const RoundsConfig& r = c.rounds();
  const uint32_t k = f.buffer_size();
  if (k == 0 || k > kMaxFedBuffClients) {
    return InvalidArgumentError("fedbuff.buffer_size: must be in [1, 100000], got " +
                                std::to_string(k));
  }
  if (f.concurrency() < k || f.concurrency() > kMaxFedBuffClients || f.concurrency() % k != 0) {
    return InvalidArgumentError("fedbuff.concurrency: must be a multiple of fedbuff.buffer_size " +
                                std::to_string(k) +
                                " (the clients of the groups in flight), at most 100000, got " +
                                std::to_string(f.concurrency()));
  }
  if (c.secagg().aggregation() != PLAIN && k < 3) {
    return InvalidArgumentError(
        "fedbuff.buffer_size: each group is one secure aggregation (secagg.aggregation " +
        Aggregation_Name(c.secagg().aggregation()) +
        "), which needs >= 3 clients (with 2, each could subtract its own update from the sum "
        "and learn the other's); got " +
        std::to_string(k));
  }
  if (k < r.min_clients()) {
    return InvalidArgumentError("fedbuff.buffer_size " + std::to_string(k) +
                                " is below rounds.min_clients " + std::to_string(r.min_clients()) +
                                ": a group commits only with rounds.min_clients updates, so no "
                                "group could ever commit");
  }
  if (r.max_clients_per_round() != 0 || r.fraction() != 1.0f) {
    return InvalidArgumentError(std::string(r.max_clients_per_round() != 0
                                                ? "rounds.max_clients_per_round"
                                                : "rounds.fraction") +
                                ": fedbuff.buffer_size sets how many clients each group has; leave "
                                "rounds.max_clients_per_round at 0 and rounds.fraction at 1");
  }
  if (r.has_start_clients()) {
    return InvalidArgumentError(
        "rounds.start_clients: a fedbuff group starts as soon as fedbuff.buffer_size clients are "
        "free, so there is no first round to wait for; leave rounds.start_clients out");
  }
  return OkStatus();
}

// fedbuff: federated clients in groups, and none of the settings that need
// whole synchronous cohorts.
Status CheckFedBuff(const RunConfig& c) {
  if (c.mode() != FEDERATED) {
    return InvalidArgumentError(
        "fedbuff: buffered asynchronous aggregation folds federated clients' updates; mode: "
        "DATA_PARALLEL workers step together on all-reduced gradients and have no updates to "
        "buffer");
  }
  COHORT_RETURN_IF_ERROR(CheckFedBuffSizes(c));
  if (c.has_privacy()) {
    return InvalidArgumentError(
        "fedbuff and privacy do not compose: privacy's accountant takes each round's cohort as a "
        "random sample of the clients (amplification by subsampling, q = cohort / "
        "population), but under fedbuff a client joins whichever group is open when it becomes "
        "free, so who contributes follows the clients' speed, not a random draw (and distributed "
        "DP's clients count their noised rounds by round number, which is 1 in every group); "
        "leave one of them out");
  }
  if (c.train().scaffold()) {
    return InvalidArgumentError(
        "fedbuff and train.scaffold are not built together: SCAFFOLD's server variate c must "
        "take each group's variate changes in full (c stays the mean of the clients' c_i) "
        "while the group's model mean is weighed by its staleness, and the buffered step "
        "weighs the whole vector; leave one of them out");
  }
  if (c.rounds().federated_eval_every() > 0) {
    return InvalidArgumentError(
        "fedbuff and rounds.federated_eval_every are not built together: federated evaluation "
        "scores the model a synchronous round starts from, and groups in flight start from "
        "different versions; set rounds.federated_eval_every to 0 (the coordinator still "
        "evaluates each version centrally)");
  }
  return OkStatus();
}

// What replaces or rescales the weighted mean: a robust rule, central DP,
// FedNova, SCAFFOLD.
Status CheckAggregationRules(const RunConfig& c) {
  if (c.server().has_robust()) COHORT_RETURN_IF_ERROR(CheckRobust(c));
  if (c.has_privacy()) COHORT_RETURN_IF_ERROR(CheckPrivacy(c));
  if (c.train().fednova()) COHORT_RETURN_IF_ERROR(CheckFedNova(c));
  if (c.train().scaffold()) COHORT_RETURN_IF_ERROR(CheckScaffold(c));
  return OkStatus();
}

}  // namespace

// The sections in a fixed order (a config with several errors reports the
// first of them).
Status ValidateRunConfig(const RunConfig& c) {
  if (c.mode() != FEDERATED && c.mode() != DATA_PARALLEL) {
    return InvalidArgumentError("mode: must be FEDERATED or DATA_PARALLEL");
  }
  if (c.data().has_partition()) COHORT_RETURN_IF_ERROR(CheckPartition(c.data().partition()));
  if (c.mode() == DATA_PARALLEL) COHORT_RETURN_IF_ERROR(CheckDataParallel(c));
  const TrainConfig& t = c.train();
  if (c.model().has_external()) {
    COHORT_RETURN_IF_ERROR(CheckExternal(c));
    // The clients' own loop takes the batch size; no step plan to bound.
    if (t.batch_size() == 0 || t.batch_size() > 65536) {
      return InvalidArgumentError("train.batch_size: must be in [1, 65536]");
    }
  } else {
    COHORT_ASSIGN_OR_RETURN(NetPlan plan, CheckModel(c.model()));
    COHORT_RETURN_IF_ERROR(CheckBatch(t, plan, c.model()));
  }
  if (t.local_epochs() == 0 || t.local_epochs() > 1000) {
    return InvalidArgumentError("train.local_epochs: must be in [1, 1000]");
  }
  COHORT_RETURN_IF_ERROR(CheckOptimizer(t));
  if (c.mode() == DATA_PARALLEL && t.proximal_mu() != 0) {
    return InvalidArgumentError(
        "train.proximal_mu: FedProx pulls each client towards its round's model; "
        "DATA_PARALLEL workers keep one model and have no rounds");
  }
  COHORT_RETURN_IF_ERROR(CheckRounds(c.rounds()));
  const ServerConfig& s = c.server();
  if (!IsFinitePositive(s.learning_rate())) {
    return InvalidArgumentError("server.learning_rate: must be > 0");
  }
  if (!std::isfinite(s.momentum()) || s.momentum() < 0 || s.momentum() >= 1) {
    return InvalidArgumentError("server.momentum: must be in [0, 1)");
  }
  if (c.mode() == DATA_PARALLEL && (s.optimizer() != FEDAVG || s.has_robust())) {
    return InvalidArgumentError(
        std::string(s.has_robust() ? "server.robust" : "server.optimizer") +
        ": a federated server step; DATA_PARALLEL workers are trusted and step their own "
        "optimizer (train.optimizer) on all-reduced gradients");
  }
  COHORT_RETURN_IF_ERROR(CheckModeFields(c));
  COHORT_RETURN_IF_ERROR(CheckServerOptimizer(s));
  COHORT_RETURN_IF_ERROR(CheckNet(c.net(), c.rounds()));
  if (!std::isfinite(s.max_update_norm()) || s.max_update_norm() < 0) {
    return InvalidArgumentError(
        "server.max_update_norm: must be a finite value >= 0 (0: no bound)");
  }
  const SecAggConfig& sa = c.secagg();
  if (sa.aggregation() == AGGREGATION_UNSPECIFIED) {
    return InvalidArgumentError("secagg.aggregation: must be PLAIN, SECAGG or SECAGG_PLUS");
  }
  if (sa.aggregation() != PLAIN) COHORT_RETURN_IF_ERROR(CheckSecAgg(sa, c.rounds()));
  if (sa.aggregation() == PLAIN && sa.l2_clip() != 0) {
    return InvalidArgumentError(
        "secagg.l2_clip: a bound clients apply under secure aggregation, but "
        "secagg.aggregation is PLAIN; plain rounds reject an update above "
        "server.max_update_norm instead");
  }
  if (c.has_fedbuff()) COHORT_RETURN_IF_ERROR(CheckFedBuff(c));
  return CheckAggregationRules(c);
}

Status CheckResumable(std::string_view stored_text, const RunConfig& given) {
  auto parsed = ParseRunConfig(stored_text, "the stored config");
  if (!parsed.ok()) {
    return FailedPreconditionError("the run directory's stored config does not parse (" +
                                   std::string(parsed.status().message()) +
                                   "); use a new --run-dir");
  }
  RunConfig stored = std::move(*parsed), now = given;
  for (RunConfig* c : {&stored, &now}) {
    c->mutable_rounds()->clear_num_rounds();
    c->mutable_data_parallel()->clear_epochs();
  }
  google::protobuf::util::MessageDifferencer differ;
  differ.set_message_field_comparison(google::protobuf::util::MessageDifferencer::EQUIVALENT);
  std::string report;
  differ.ReportDifferencesToString(&report);
  if (differ.Compare(stored, now)) return OkStatus();
  // One line per difference ("modified: train.learning_rate: 0.05 -> 0.1");
  // the first few are enough to say what changed.
  std::string lines;
  size_t shown = 0, begin = 0;
  while (begin < report.size()) {
    size_t end = report.find('\n', begin);
    if (end == std::string::npos) end = report.size();
    if (shown++ < 4) lines += (lines.empty() ? "" : "; ") + report.substr(begin, end - begin);
    begin = end + 1;
  }
  if (shown > 4) lines += "; and " + std::to_string(shown - 4) + " more";
  return FailedPreconditionError(
      "the run directory holds a run with another configuration (" + lines +
      "); only rounds.num_rounds and data_parallel.epochs may change on resume: use the "
      "original config or a new --run-dir");
}

std::string ToText(const RunConfig& config) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(config, &out);
  return out;
}

}  // namespace cohort::config
