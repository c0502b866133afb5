// Bodies of the `cohort` subcommands that are not daemons. Flag parsing
// stays in main.cc (CLI11 is slow to compile; one translation unit).
#ifndef COHORT_CLI_COMMANDS_H_
#define COHORT_CLI_COMMANDS_H_

#include <cstdint>
#include <string>

#include "common/status.h"

namespace cohort::cli {

struct PartitionOptions {
  std::string format = "idx";                                        // idx, csv, synthetic
  std::string train_images, train_labels, test_images, test_labels;  // idx
  std::string train_csv, test_csv;                                   // csv
  int label_column = 0;
  uint32_t samples = 2000, test_samples = 500, features = 20, classes = 4;  // synthetic
  uint32_t clients = 10;
  std::string scheme = "iid";
  std::string assignment;  // Explicit split file; overrides scheme and clients.
  uint64_t seed = 0;
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
