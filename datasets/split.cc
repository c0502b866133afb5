#include "datasets/split.h"

#include "datasets/csv.h"
#include "datasets/idx.h"
#include "datasets/partition.h"
#include "datasets/synthetic.h"

namespace cohort::datasets {

StatusOr<Split> LoadAndSplit(const SplitOptions& o) {
  COHORT_ASSIGN_OR_RETURN(PartitionSpec spec, ParsePartitionSpec(o.scheme));
  Split split;
  Dataset& train = split.train;
  Dataset& test = split.test;
  bool& has_test = split.has_test;
  if (o.format == "idx") {
    if (o.train_images.empty() || o.train_labels.empty()) {
      return InvalidArgumentError("format idx needs the training images and labels");
    }
    COHORT_ASSIGN_OR_RETURN(train, ReadIdx(o.train_images, o.train_labels));
    if (!o.test_images.empty() || !o.test_labels.empty()) {
      COHORT_ASSIGN_OR_RETURN(test, ReadIdx(o.test_images, o.test_labels));
      has_test = true;
    }
  } else if (o.format == "csv") {
    if (o.train_csv.empty()) return InvalidArgumentError("format csv needs the training file");
    CsvOptions csv;
    csv.label_column = o.label_column;
    COHORT_ASSIGN_OR_RETURN(train, ReadCsv(o.train_csv, csv));
    if (!o.test_csv.empty()) {
      csv.num_classes = train.num_classes;
      COHORT_ASSIGN_OR_RETURN(test, ReadCsv(o.test_csv, csv));
      has_test = true;
    }
  } else if (o.format == "synthetic") {
    SyntheticOptions s;
    s.num_samples = o.samples + o.test_samples;
    s.num_features = o.features;
    s.num_classes = o.classes;
    s.seed = o.seed;
    if (o.features == 0 || o.classes < 2 || o.samples == 0) {
      return InvalidArgumentError(
          "format synthetic needs samples >= 1, features >= 1 and classes >= 2");
    }
    Dataset all = MakeSynthetic(s);
    std::vector<uint32_t> tail(o.test_samples);
    for (uint32_t i = 0; i < o.test_samples; ++i) tail[i] = o.samples + i;
    test = Subset(all, tail);
    // The head is the training set: cut in place, not copied (at 100,000
    // clients the copy doubled the simulator's peak memory).
    all.features.resize(size_t{o.samples} * o.features);
    all.labels.resize(o.samples);
    train = std::move(all);
    has_test = o.test_samples > 0;
  } else {
    return InvalidArgumentError("format \"" + o.format + "\" is not idx, csv or synthetic");
  }
  if (has_test && test.num_features != train.num_features) {
    return InvalidArgumentError("test set has " + std::to_string(test.num_features) +
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

}  // namespace cohort::datasets
