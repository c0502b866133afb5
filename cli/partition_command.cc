// `cohort partition`: a dataset split into client shard files
// (datasets/split.h, datasets/shard.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "common/progress.h"
#include "datasets/shard.h"
#include "datasets/split.h"
#include "datasets/standardize.h"

namespace cohort::cli {
namespace {

// What `partition --help` says about CSV input (datasets/csv.h has the same).
constexpr char kCsvHelp[] = R"(CSV input (--format csv --train FILE [--test FILE]):
  - One sample per line, fields separated by commas. No quoting. Files using
    ';', tabs or '|' are refused with the line and the delimiter it seems to be.
  - The first line is a header, and skipped, when one of its feature fields is
    not a number, or when its label is not a number but the next line's is.
  - The label is the field at --label-column (0-based, default 0): either class
    indices 0, 1, 2, ... or class names (cat, dog, ...). Names are numbered in
    sorted order, printed as "labels: cat=0 dog=1", and the test file uses the
    training file's numbering (a name it lacks is an error).
  - Every other field is a feature: a finite decimal number (3, -0.5, 2.5e-3).
    Every line has as many fields as the first data line.
  - --standardize scales each feature to mean 0 and std 1 with figures from the
    training file alone, applies them to every shard and to test.shard, and
    writes them to OUT/standardize.csv (feature,column,mean,std) for new data.
    A feature with std 0 is left as it is.)";

// Training sets at least this large get progress lines while their shards
// are written.
constexpr size_t kProgressMinRows = 100000;

// The split, where the shards go and how their features are stored.
struct PartitionOptions : datasets::SplitOptions {
  std::string out;
  std::string encoding = "auto";  // auto, float32, uint8
  bool standardize = false;
  // Which flags with a default were given.
  bool clients_given = false, scheme_given = false, seed_given = false;
};

StatusOr<datasets::FeatureEncoding> ChooseEncoding(const std::string& name,
                                                   const std::string& format) {
  if (name == "float32") return datasets::FeatureEncoding::kFloat32;
  if (name == "uint8") return datasets::FeatureEncoding::kUint8;
  if (name == "auto") {
    return format == "idx" ? datasets::FeatureEncoding::kUint8
                           : datasets::FeatureEncoding::kFloat32;
  }
  return InvalidArgumentError("--encoding: \"" + name + "\" is not auto, float32 or uint8");
}

Status CheckStandardize(const PartitionOptions& o, datasets::FeatureEncoding encoding) {
  if (!o.standardize) return OkStatus();
  if (o.format != "csv") {
    return InvalidArgumentError("--standardize: only for --format csv, not " + o.format +
                                " (IDX pixels are scaled to [0, 1] already; synthetic "
                                "features are standard already)");
  }
  if (encoding == datasets::FeatureEncoding::kUint8) {
    return InvalidArgumentError(
        "--standardize: standardized features are not in [0, 1]; --encoding uint8 cannot hold "
        "them (use float32 or auto)");
  }
  return OkStatus();
}

// One line each on stderr for the defaults a person did not choose.
void PrintDefaults(const PartitionOptions& o, const datasets::Split& split) {
  if (o.assignment.empty() && !o.clients_given) {
    std::fprintf(stderr,
                 "--clients not given: split over the default %u clients; choose the number "
                 "with --clients N\n",
                 o.clients);
  }
  if (o.assignment.empty() && (!o.scheme_given || !o.seed_given)) {
    const std::string scheme_flag = "--scheme iid|dirichlet:ALPHA|shards:K|quantity:ALPHA";
    const bool both = !o.scheme_given && !o.seed_given;
    const std::string what = both ? "scheme and seed" : !o.scheme_given ? "scheme" : "seed";
    const std::string flags = both              ? scheme_flag + " and --seed S"
                              : !o.scheme_given ? scheme_flag
                                                : "--seed S";
    std::fprintf(stderr, "split %s with seed %lu, the default %s; choose with %s\n",
                 o.scheme.c_str(), static_cast<unsigned long>(o.seed), what.c_str(), flags.c_str());
  }
  if (split.has_test) return;
  const char* how = o.format == "csv"   ? "give --test FILE to write one"
                    : o.format == "idx" ? "give --test-images and --test-labels to write one"
                                        : "--test-samples is 0";
  std::fprintf(stderr, "no test.shard written: %s\n", how);
}

// "labels: cat=0 dog=1" on stdout for CSV labels that were names.
void PrintClassNames(const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::string line = "labels:";
  for (size_t i = 0; i < names.size() && i < 100; ++i) {
    line += " " + names[i] + "=" + std::to_string(i);
  }
  if (names.size() > 100) line += " ... (" + std::to_string(names.size()) + " classes)";
  std::printf("%s\n", line.c_str());
}

// The features' largest magnitude: an unscaled CSV with large features
// tends to leave a model at the majority class, and nothing else says so.
void HintStandardize(const PartitionOptions& o, const datasets::Dataset& train) {
  if (o.format != "csv" || o.standardize || train.num_features == 0) return;
  size_t at = 0;
  for (size_t i = 1; i < train.features.size(); ++i) {
    if (std::fabs(train.features[i]) > std::fabs(train.features[at])) at = i;
  }
  if (train.features.empty() || std::fabs(train.features[at]) <= 100) return;
  std::fprintf(stderr,
               "the features are not scaled (feature %zu reaches %g): if training stays at the "
               "majority class, partition again with --standardize\n",
               at % train.num_features, static_cast<double>(train.features[at]));
}

// Scales the training and test sets with the training set's figures,
// writes them to OUT/standardize.csv and says so on stdout.
Status Standardize(const PartitionOptions& o, datasets::Split& split) {
  const datasets::Standardization s = datasets::FitStandardization(split.train);
  COHORT_RETURN_IF_ERROR(datasets::ApplyStandardization(s, split.train));
  if (split.has_test) COHORT_RETURN_IF_ERROR(datasets::ApplyStandardization(s, split.test));
  const std::string path = o.out + "/standardize.csv";
  COHORT_RETURN_IF_ERROR(datasets::WriteStandardization(s, o.label_column, path));
  std::printf(
      "standardize: mean and std of %zu features from the %lu training rows, applied to "
      "every shard%s; written to %s\n",
      s.mean.size(), static_cast<unsigned long>(s.rows), split.has_test ? " and test.shard" : "",
      path.c_str());
  if (!s.constant.empty()) {
    std::string list;
    for (size_t i = 0; i < s.constant.size() && i < 20; ++i) {
      list += (i > 0 ? ", " : "") + std::to_string(s.constant[i]);
    }
    if (s.constant.size() > 20) list += ", ...";
    std::printf("standardize: %zu features have std 0 and are left unscaled (features %s)\n",
                s.constant.size(), list.c_str());
  }
  return OkStatus();
}

// Writes OUT/client-NNN.shard per client with samples, then prints a table
// of samples per label per client (after the shards, so that progress on
// stderr and the table on stdout do not interleave).
Status WriteShards(const PartitionOptions& o, const datasets::Split& split,
                   datasets::FeatureEncoding encoding) {
  const datasets::Dataset& train = split.train;
  const auto& parts = split.parts;
  ProgressOptions progress_options;
  progress_options.unit = "shards";
  if (train.size() < kProgressMinRows) progress_options.mode = ProgressMode::kOff;
  Progress progress("writing shards", parts.size(), stderr, progress_options);
  std::string table, empty;
  for (uint32_t k = 0; k < static_cast<uint32_t>(parts.size()); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "client-%03u", k);
    if (parts[k].empty()) {
      // As `cohort simulate` does with the same split: a client with no
      // samples could not register; no shard file is written for it.
      empty += std::string(name) + " has no samples in this split: no shard written\n";
      continue;
    }
    datasets::Dataset shard = datasets::Subset(train, parts[k]);
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(shard, o.out + "/" + name + ".shard", encoding));
    char row[64];
    std::snprintf(row, sizeof(row), "%-14s %8zu", name, shard.size());
    table += row;
    for (uint64_t n : datasets::LabelCounts(shard)) {
      std::snprintf(row, sizeof(row), " %6lu", static_cast<unsigned long>(n));
      table += row;
    }
    table += "\n";
    progress.Update(k + 1);
  }
  progress.Finish();
  std::fputs(empty.c_str(), stderr);
  std::printf("%-14s %8s", "client", "samples");
  for (uint32_t c = 0; c < train.num_classes; ++c) std::printf(" %6u", c);
  std::printf("\n%s", table.c_str());
  return OkStatus();
}

// Writes OUT/client-NNN.shard per client and OUT/test.shard (when a test set
// is given), and prints a table of samples per label per client.
Status RunPartition(PartitionOptions o) {
  COHORT_ASSIGN_OR_RETURN(datasets::FeatureEncoding encoding, ChooseEncoding(o.encoding, o.format));
  if (o.out.empty()) return InvalidArgumentError("--out: an output directory is required");
  COHORT_RETURN_IF_ERROR(CheckStandardize(o, encoding));
  o.progress = stderr;
  COHORT_ASSIGN_OR_RETURN(datasets::Split split, datasets::LoadAndSplit(o));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return UnavailableError(o.out + ": " + ec.message());
  PrintClassNames(split.class_names);
  HintStandardize(o, split.train);
  if (o.standardize) COHORT_RETURN_IF_ERROR(Standardize(o, split));
  COHORT_RETURN_IF_ERROR(WriteShards(o, split, encoding));
  if (split.has_test) {
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(split.test, o.out + "/test.shard", encoding));
    std::printf("%-14s %8zu\n", "test", split.test.size());
  }
  std::fflush(stdout);
  PrintDefaults(o, split);
  return OkStatus();
}

}  // namespace

Command AddPartitionCommand(CLI::App& app, const std::string& log_level) {
  auto* part = app.add_subcommand("partition", "Split a dataset into client shard files");
  auto o = std::make_shared<PartitionOptions>();
  part->add_option("--format", o->format, "idx, csv or synthetic");
  part->add_option("--train-images", o->train_images, "IDX training images (.gz ok)");
  part->add_option("--train-labels", o->train_labels, "IDX training labels");
  part->add_option("--test-images", o->test_images, "IDX test images");
  part->add_option("--test-labels", o->test_labels, "IDX test labels");
  part->add_option("--train", o->train_csv, "CSV training file (format below)");
  part->add_option("--test", o->test_csv, "CSV test file");
  part->add_option("--label-column", o->label_column, "CSV label column (0-based)");
  part->add_option("--samples", o->samples, "synthetic: training samples");
  part->add_option("--test-samples", o->test_samples, "synthetic: test samples");
  part->add_option("--features", o->features, "synthetic: features");
  part->add_option("--classes", o->classes, "synthetic: classes");
  auto* clients = part->add_option("--clients", o->clients, "Number of client shards (default 10)")
                      ->check(CLI::Range(1, 1000000));
  auto* scheme = part->add_option("--scheme", o->scheme,
                                  "iid (default), dirichlet:ALPHA, shards:K, quantity:ALPHA");
  auto* seed = part->add_option("--seed", o->seed, "Partition seed (default 0)");
  part->add_option("--assignment", o->assignment,
                   "Explicit split: one line of sample indices per client (overrides --scheme, "
                   "--clients)");
  part->add_option("--out", o->out, "Output directory")->required();
  part->add_option("--encoding", o->encoding, "auto, float32 or uint8");
  part->add_flag("--standardize", o->standardize,
                 "CSV: scale each feature to mean 0, std 1 (training file's figures; "
                 "OUT/standardize.csv)");
  part->footer(kCsvHelp);
  return {part, [o, &log_level, clients, scheme, seed] {
            InitLogging("partition", "", log_level);
            o->clients_given = clients->count() > 0;
            o->scheme_given = scheme->count() > 0;
            o->seed_given = seed->count() > 0;
            return Report(RunPartition(*o), "partition");
          }};
}

}  // namespace cohort::cli
