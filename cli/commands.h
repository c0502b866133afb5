// Bodies of the `cohort` subcommands that are not daemons. Flag parsing
// stays in main.cc (CLI11 is slow to compile; one translation unit).
#ifndef COHORT_CLI_COMMANDS_H_
#define COHORT_CLI_COMMANDS_H_

#include <cstdint>
#include <string>

#include "common/status.h"
#include "datasets/split.h"

namespace cohort::cli {

// `cohort partition`: the split (datasets/split.h), where the shards go and
// how their features are stored.
struct PartitionOptions : datasets::SplitOptions {
  std::string out;
  std::string encoding = "auto";  // auto, float32, uint8
};

// Writes OUT/client-NNN.shard per client and OUT/test.shard (when a test set
// is given), and prints a table of samples per label per client.
Status RunPartition(const PartitionOptions& options);

// Prints the rounds of the run in `run_dir` as a table, or with `json` one
// JSON object per round.
Status RunStatus(const std::string& run_dir, bool json);

}  // namespace cohort::cli

#endif  // COHORT_CLI_COMMANDS_H_
