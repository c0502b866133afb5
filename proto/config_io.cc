#include "proto/config_io.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <fstream>
#include <sstream>

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

}  // namespace

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
  } else {
    google::protobuf::TextFormat::Parser parser;
    FirstErrorCollector errors;
    parser.RecordErrorsTo(&errors);
    parser.AllowUnknownField(false);
    if (!parser.ParseFromString(std::string(text), &config)) {
      return InvalidArgumentError(where + ": " + errors.message());
    }
  }
  COHORT_RETURN_IF_ERROR(ValidateRunConfig(config).WithContext(where));
  return config;
}

StatusOr<RunConfig> LoadRunConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open config file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseRunConfig(buffer.str(), path);
}

Status ValidateRunConfig(const RunConfig& c) {
  if (c.mode() == DATA_PARALLEL) {
    return UnimplementedError("mode: DATA_PARALLEL is not implemented yet; use FEDERATED");
  }
  if (c.mode() != FEDERATED) return InvalidArgumentError("mode: must be FEDERATED");
  const ModelConfig& m = c.model();
  if (m.arch() != "mlp" && m.arch() != "logreg") {
    return InvalidArgumentError("model.arch: \"" + m.arch() + "\" is not one of mlp, logreg");
  }
  if (m.input_dim() == 0 || m.input_dim() > (1u << 24)) {
    return InvalidArgumentError("model.input_dim: must be in [1, 2^24]");
  }
  if (m.num_classes() < 2 || m.num_classes() > 65536) {
    return InvalidArgumentError("model.num_classes: must be in [2, 65536]");
  }
  if (m.arch() == "logreg" && m.hidden_size() > 0) {
    return InvalidArgumentError("model.hidden: logreg has no hidden layers");
  }
  for (int i = 0; i < m.hidden_size(); ++i) {
    if (m.hidden(i) == 0 || m.hidden(i) > (1u << 20)) {
      return InvalidArgumentError("model.hidden[" + std::to_string(i) + "]: must be in [1, 2^20]");
    }
  }
  const TrainConfig& t = c.train();
  if (t.local_epochs() == 0 || t.local_epochs() > 1000) {
    return InvalidArgumentError("train.local_epochs: must be in [1, 1000]");
  }
  if (t.batch_size() == 0 || t.batch_size() > 65536) {
    return InvalidArgumentError("train.batch_size: must be in [1, 65536]");
  }
  if (!IsFinitePositive(t.learning_rate())) {
    return InvalidArgumentError("train.learning_rate: must be > 0");
  }
  if (!std::isfinite(t.momentum()) || t.momentum() < 0 || t.momentum() >= 1) {
    return InvalidArgumentError("train.momentum: must be in [0, 1)");
  }
  if (!std::isfinite(t.weight_decay()) || t.weight_decay() < 0) {
    return InvalidArgumentError("train.weight_decay: must be >= 0");
  }
  const RoundsConfig& r = c.rounds();
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
  if (!IsFinitePositive(r.round_deadline_s())) {
    return InvalidArgumentError("rounds.round_deadline_s: must be > 0");
  }
  if (!IsFinitePositive(r.client_timeout_s())) {
    return InvalidArgumentError("rounds.client_timeout_s: must be > 0");
  }
  if (r.keep_checkpoints() == 0) {
    return InvalidArgumentError("rounds.keep_checkpoints: must be >= 1");
  }
  const ServerConfig& s = c.server();
  if (!IsFinitePositive(s.learning_rate())) {
    return InvalidArgumentError("server.learning_rate: must be > 0");
  }
  if (!std::isfinite(s.momentum()) || s.momentum() < 0 || s.momentum() >= 1) {
    return InvalidArgumentError("server.momentum: must be in [0, 1)");
  }
  if (!IsFinitePositive(c.net().heartbeat_s())) {
    return InvalidArgumentError("net.heartbeat_s: must be > 0");
  }
  if (c.net().max_header_bytes() < 1024) {
    return InvalidArgumentError("net.max_header_bytes: must be >= 1024");
  }
  const SecAggConfig& sa = c.secagg();
  if (sa.aggregation() == AGGREGATION_UNSPECIFIED) {
    return InvalidArgumentError("secagg.aggregation: must be PLAIN, SECAGG or SECAGG_PLUS");
  }
  if (sa.aggregation() != PLAIN) {
    if (r.max_clients_per_round() != 0 && r.max_clients_per_round() < 3) {
      return InvalidArgumentError(
          "rounds.max_clients_per_round: secure aggregation needs cohorts of >= 3 clients");
    }
    if (!IsFinitePositive(sa.clip()) || sa.clip() > 1e6f) {
      return InvalidArgumentError("secagg.clip: must be in (0, 1e6]");
    }
    if (!std::isfinite(sa.expected_dropout()) || sa.expected_dropout() < 0 ||
        sa.expected_dropout() >= 0.9f) {
      return InvalidArgumentError("secagg.expected_dropout: must be in [0, 0.9)");
    }
    if (!std::isfinite(sa.corrupt_fraction()) || sa.corrupt_fraction() < 0 ||
        sa.corrupt_fraction() >= 0.5f) {
      return InvalidArgumentError("secagg.corrupt_fraction: must be in [0, 0.5)");
    }
    if (!IsFinitePositive(sa.stage_timeout_s())) {
      return InvalidArgumentError("secagg.stage_timeout_s: must be > 0");
    }
  }
  return OkStatus();
}

std::string ToText(const RunConfig& config) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(config, &out);
  return out;
}

}  // namespace cohort::config
