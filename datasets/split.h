// A dataset loaded and split over clients: what `cohort partition` writes as
// shard files and what `cohort simulate` keeps in memory (each client a list
// of rows of the one training set), from the same options and seed.
#ifndef COHORT_DATASETS_SPLIT_H_
#define COHORT_DATASETS_SPLIT_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"
#include "datasets/dataset.h"

namespace cohort::datasets {

// Bounds on format synthetic's sizes (as data.partition's validation has
// them); LoadAndSplit refuses others with kInvalidArgument.
inline constexpr uint32_t kMaxSyntheticSamples = 1u << 26;  // Each of samples, test_samples.
inline constexpr uint32_t kMaxSyntheticFeatures = 1u << 16;
inline constexpr uint32_t kMaxSyntheticClasses = 1u << 16;

struct SplitOptions {
  std::string format = "idx";                                        // idx, csv, synthetic
  std::string train_images, train_labels, test_images, test_labels;  // idx
  std::string train_csv, test_csv;                                   // csv
  int label_column = 0;
  uint32_t samples = 2000, test_samples = 500, features = 20, classes = 4;  // synthetic
  uint32_t clients = 10;
  std::string scheme = "iid";  // ParsePartitionSpec's forms.
  std::string assignment;      // Explicit split file; overrides scheme and clients.
  uint64_t seed = 0;
  // Where progress on large inputs goes (the CLI's stderr); null: none.
  FILE* progress = nullptr;
  uint64_t progress_min_bytes = uint64_t{50} << 20;  // A CSV file at least this large.
};

struct Split {
  Dataset train, test;
  bool has_test = false;
  // CSV labels that were names: class i's name (the test file uses the
  // training file's). Empty for class indices and the other formats.
  std::vector<std::string> class_names;
  std::vector<std::vector<uint32_t>> parts;  // Client k's rows of `train`.
};

// Reads (or generates) the data and splits it; errors name the option or
// file that was wrong. Sizes from outside (flags, file headers) are
// bounded; a split this machine has not the memory for is
// kResourceExhausted, never an abort.
StatusOr<Split> LoadAndSplit(const SplitOptions& options);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_SPLIT_H_
