// Reading and checking the run configuration.
#ifndef COHORT_PROTO_CONFIG_IO_H_
#define COHORT_PROTO_CONFIG_IO_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/net_shape.h"
#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::config {

// Protobuf text format into `message`, strictly (an unknown field is an
// error); kInvalidArgument "SOURCE: line L, column C: what" at the first
// syntax error. The run config and `cohort provision`'s project use it.
Status ParseTextStrict(std::string_view text, std::string_view source,
                       google::protobuf::Message& message);

// Parses protobuf text format, or JSON when the first non-blank character is
// '{'. Unknown fields and syntax errors are kInvalidArgument naming the
// source, line and column, and the field. Validates the result.
StatusOr<RunConfig> ParseRunConfig(std::string_view text, std::string_view source_name);
// Reads and parses `path` (a file or a pipe). kNotFound when it cannot be
// opened or read (the error says why); kInvalidArgument when it is a
// directory, empty (only blanks), larger than 1 MiB, or does not parse.
StatusOr<RunConfig> LoadRunConfig(const std::string& path);

// The largest model a run accepts. A checkpoint row in the run store holds
// the model and the server velocity as float32 blobs, and SQLite refuses a row
// over 10^9 bytes: 2 x 4 x 2^26 bytes fits, 2^27 parameters would not. At the
// cap each copy the coordinator keeps (global model, velocity, the round's
// task, the sum, the checkpoint) is 256 MiB.
inline constexpr uint64_t kMaxModelParams = uint64_t{1} << 26;

// The layer list a model config describes, presets expanded: the one
// translation from ModelConfig to the NetSpec that train::Model builds.
// kInvalidArgument naming the field (arch, input_shape, layers[i]).
StatusOr<NetSpec> NetFromConfig(const ModelConfig& model);
// NetFromConfig, then every layer's shape (common/net_shape.h); errors name
// the field under "model.".
StatusOr<NetPlan> PlanModel(const ModelConfig& model);

// A training step holds at most this many floats (1 GiB).
inline constexpr uint64_t kMaxStepFloats = uint64_t{1} << 28;

// Floats one sample needs in a training step (NetPlan); 0 for an invalid
// model. Evaluation needs less, so the bound covers it too.
uint64_t StepFloatsPerSample(const ModelConfig& model);

// The batch for evaluating `model` on the coordinator: 1000 samples, or
// fewer where 1000 would pass kMaxStepFloats (at least 1).
uint32_t EvalBatchSize(const ModelConfig& model);

// Checks value ranges; the error names the field and the allowed range
// ("rounds.client_timeout_s: must be in [0.001, 604800] seconds ..., got 1e+20").
// Durations are in [1 ms, 7 days] (net.heartbeat_s in [0.05, 60] s, and
// rounds.client_timeout_s at least 3 heartbeats); the model has at most
// kMaxModelParams parameters; a training step (train.batch_size x the floats
// one sample needs) holds at most 2^28 floats.
Status ValidateRunConfig(const RunConfig& config);

// Text-format rendering (stored in the run database, printed by tools).
std::string ToText(const RunConfig& config);

// Whether a run directory created with the config `stored_text` may go on
// with `given`: every field must match (an unset field counts as its
// default) except how long the run lasts (rounds.num_rounds,
// data_parallel.epochs), so a run can be extended but never silently
// resumed with another model, optimizer, data or seed.
// kFailedPrecondition naming the fields that differ, with both values.
Status CheckResumable(std::string_view stored_text, const RunConfig& given);

}  // namespace cohort::config

#endif  // COHORT_PROTO_CONFIG_IO_H_
