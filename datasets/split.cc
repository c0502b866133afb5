#include "datasets/split.h"

#include <new>

#include "datasets/csv.h"
#include "datasets/idx.h"
#include "datasets/partition.h"
#include "datasets/synthetic.h"

namespace cohort::datasets {

namespace {

Status LoadIdx(const SplitOptions& o, Split& split) {
  if (o.train_images.empty() || o.train_labels.empty()) {
    return InvalidArgumentError("format idx needs the training images and labels");
  }
  COHORT_ASSIGN_OR_RETURN(split.train, ReadIdx(o.train_images, o.train_labels));
  if (!o.test_images.empty() || !o.test_labels.empty()) {
    COHORT_ASSIGN_OR_RETURN(split.test, ReadIdx(o.test_images, o.test_labels));
    split.has_test = true;
  }
  return OkStatus();
}

Status LoadCsv(const SplitOptions& o, Split& split) {
  if (o.train_csv.empty()) return InvalidArgumentError("format csv needs the training file");
  CsvOptions csv;
  csv.label_column = o.label_column;
  csv.progress = o.progress;
  csv.progress_min_bytes = o.progress_min_bytes;
  COHORT_ASSIGN_OR_RETURN(CsvTable train, ReadCsvTable(o.train_csv, csv));
  split.train = std::move(train.data);
  split.class_names = std::move(train.class_names);
  if (o.test_csv.empty()) return OkStatus();
  csv.num_classes = split.train.num_classes;
  csv.class_names = split.class_names;
  COHORT_ASSIGN_OR_RETURN(CsvTable test, ReadCsvTable(o.test_csv, csv));
  if (split.class_names.empty() && !test.class_names.empty()) {
    return InvalidArgumentError(o.test_csv + ": labels are names (\"" + test.class_names[0] +
                                "\"), but " + o.train_csv + "'s are class indices");
  }
  split.test = std::move(test.data);
  split.has_test = true;
  return OkStatus();
}

// The bounds data.partition's validation applies (proto/config_io.cc),
// checked here for the command line: samples + test_samples then fits the
// uint32 row indices, and no size below overflows.
Status CheckSyntheticSizes(const SplitOptions& o) {
  if (o.samples == 0 || o.samples > kMaxSyntheticSamples) {
    return InvalidArgumentError("format synthetic: --samples " + std::to_string(o.samples) +
                                " is outside [1, " + std::to_string(kMaxSyntheticSamples) + "]");
  }
  if (o.test_samples > kMaxSyntheticSamples) {
    return InvalidArgumentError("format synthetic: --test-samples " +
                                std::to_string(o.test_samples) + " is outside [0, " +
                                std::to_string(kMaxSyntheticSamples) + "]");
  }
  if (o.features == 0 || o.features > kMaxSyntheticFeatures) {
    return InvalidArgumentError("format synthetic: --features " + std::to_string(o.features) +
                                " is outside [1, " + std::to_string(kMaxSyntheticFeatures) + "]");
  }
  if (o.classes < 2 || o.classes > kMaxSyntheticClasses) {
    return InvalidArgumentError("format synthetic: --classes " + std::to_string(o.classes) +
                                " is outside [2, " + std::to_string(kMaxSyntheticClasses) + "]");
  }
  return OkStatus();
}

// One generated set: its first `samples` rows train, the rest test.
Status LoadSynthetic(const SplitOptions& o, Split& split) {
  COHORT_RETURN_IF_ERROR(CheckSyntheticSizes(o));
  SyntheticOptions s;
  s.num_samples = o.samples + o.test_samples;
  s.num_features = o.features;
  s.num_classes = o.classes;
  s.seed = o.seed;
  Dataset all = MakeSynthetic(s);
  std::vector<uint32_t> tail(o.test_samples);
  for (uint32_t i = 0; i < o.test_samples; ++i) tail[i] = o.samples + i;
  split.test = Subset(all, tail);
  // The head is the training set: cut in place, not copied (at 100,000
  // clients the copy doubled the simulator's peak memory).
  all.features.resize(size_t{o.samples} * o.features);
  all.labels.resize(o.samples);
  split.train = std::move(all);
  split.has_test = o.test_samples > 0;
  return OkStatus();
}

StatusOr<Split> LoadAndSplitOrThrow(const SplitOptions& o) {
  COHORT_ASSIGN_OR_RETURN(PartitionSpec spec, ParsePartitionSpec(o.scheme));
  Split split;
  if (o.format == "idx") {
    COHORT_RETURN_IF_ERROR(LoadIdx(o, split));
  } else if (o.format == "csv") {
    COHORT_RETURN_IF_ERROR(LoadCsv(o, split));
  } else if (o.format == "synthetic") {
    COHORT_RETURN_IF_ERROR(LoadSynthetic(o, split));
  } else {
    return InvalidArgumentError("format \"" + o.format + "\" is not idx, csv or synthetic");
  }
  const Dataset& train = split.train;
  if (split.has_test && split.test.num_features != train.num_features) {
    return InvalidArgumentError("test set has " + std::to_string(split.test.num_features) +
                                " features, training set " + std::to_string(train.num_features));
  }
  if (!o.assignment.empty()) {
    COHORT_ASSIGN_OR_RETURN(split.parts, ReadAssignment(o.assignment, train.size()));
  } else {
    COHORT_ASSIGN_OR_RETURN(split.parts,
                            Partition(train.labels, train.num_classes, o.clients, spec, o.seed));
  }
  return split;
}

}  // namespace

StatusOr<Split> LoadAndSplit(const SplitOptions& o) {
  // Within every bound a request can still be more than this machine has
  // (2^27 synthetic samples of 65536 features are 32 TiB; a large IDX or
  // CSV file is read whole): an error that says so, not an abort.
  try {
    return LoadAndSplitOrThrow(o);
  } catch (const std::bad_alloc&) {
    std::string what = "format " + o.format;
    if (o.format == "synthetic") {
      const uint64_t values = (uint64_t{o.samples} + o.test_samples) * o.features;
      what += ", " + std::to_string(uint64_t{o.samples} + o.test_samples) + " samples of " +
              std::to_string(o.features) + " features (" +
              std::to_string((values * sizeof(float)) >> 20) +
              " MiB): use fewer --samples or --features";
    } else {
      what += ": the data set does not fit in this process's memory";
    }
    return ResourceExhaustedError("out of memory loading the data: " + what);
  }
}

}  // namespace cohort::datasets
