// Reading and checking the run configuration.
#ifndef COHORT_PROTO_CONFIG_IO_H_
#define COHORT_PROTO_CONFIG_IO_H_

#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::config {

// Parses protobuf text format, or JSON when the first non-blank character is
// '{'. Unknown fields and syntax errors are kInvalidArgument naming the
// source, line and column, and the field. Validates the result.
StatusOr<RunConfig> ParseRunConfig(std::string_view text, std::string_view source_name);
// Reads and parses `path`; kNotFound when it cannot be read.
StatusOr<RunConfig> LoadRunConfig(const std::string& path);

// Checks value ranges; the error names the field ("rounds.min_clients: ...").
Status ValidateRunConfig(const RunConfig& config);

// Text-format rendering (stored in the run database, printed by tools).
std::string ToText(const RunConfig& config);

}  // namespace cohort::config

#endif  // COHORT_PROTO_CONFIG_IO_H_
