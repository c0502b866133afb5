// `cohort partition`: a dataset split into client shard files
// (datasets/split.h, datasets/shard.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "datasets/shard.h"
#include "datasets/split.h"

namespace cohort::cli {
namespace {

// The split, where the shards go and how their features are stored.
struct PartitionOptions : datasets::SplitOptions {
  std::string out;
  std::string encoding = "auto";  // auto, float32, uint8
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

// Writes OUT/client-NNN.shard per client and OUT/test.shard (when a test set
// is given), and prints a table of samples per label per client.
Status RunPartition(const PartitionOptions& o) {
  COHORT_ASSIGN_OR_RETURN(datasets::FeatureEncoding encoding, ChooseEncoding(o.encoding, o.format));
  if (o.out.empty()) return InvalidArgumentError("--out: an output directory is required");
  COHORT_ASSIGN_OR_RETURN(datasets::Split split, datasets::LoadAndSplit(o));
  const datasets::Dataset& train = split.train;
  const auto& parts = split.parts;
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return UnavailableError(o.out + ": " + ec.message());

  std::printf("%-14s %8s", "client", "samples");
  for (uint32_t c = 0; c < train.num_classes; ++c) std::printf(" %6u", c);
  std::printf("\n");
  for (uint32_t k = 0; k < static_cast<uint32_t>(parts.size()); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "client-%03u", k);
    if (parts[k].empty()) {
      // As `cohort simulate` does with the same split: a client with no
      // samples could not register; no shard file is written for it.
      std::fprintf(stderr, "%s has no samples in this split: no shard written\n", name);
      continue;
    }
    datasets::Dataset shard = datasets::Subset(train, parts[k]);
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(shard, o.out + "/" + name + ".shard", encoding));
    std::printf("%-14s %8zu", name, shard.size());
    for (uint64_t n : datasets::LabelCounts(shard))
      std::printf(" %6lu", static_cast<unsigned long>(n));
    std::printf("\n");
  }
  if (split.has_test) {
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(split.test, o.out + "/test.shard", encoding));
    std::printf("%-14s %8zu\n", "test", split.test.size());
  }
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
  part->add_option("--train", o->train_csv, "CSV training file");
  part->add_option("--test", o->test_csv, "CSV test file");
  part->add_option("--label-column", o->label_column, "CSV label column (0-based)");
  part->add_option("--samples", o->samples, "synthetic: training samples");
  part->add_option("--test-samples", o->test_samples, "synthetic: test samples");
  part->add_option("--features", o->features, "synthetic: features");
  part->add_option("--classes", o->classes, "synthetic: classes");
  part->add_option("--clients", o->clients, "Number of client shards")
      ->check(CLI::Range(1, 1000000));
  part->add_option("--scheme", o->scheme, "iid, dirichlet:ALPHA, shards:K, quantity:ALPHA");
  part->add_option("--seed", o->seed, "Partition seed");
  part->add_option("--assignment", o->assignment,
                   "Explicit split: one line of sample indices per client (overrides --scheme, "
                   "--clients)");
  part->add_option("--out", o->out, "Output directory")->required();
  part->add_option("--encoding", o->encoding, "auto, float32 or uint8");
  return {part, [o, &log_level] {
            InitLogging("partition", "", log_level);
            return Report(RunPartition(*o), "partition");
          }};
}

}  // namespace cohort::cli
