#include "cli/commands.h"

#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>

#include "coordinator/report.h"
#include "coordinator/run_store.h"
#include "datasets/csv.h"
#include "datasets/idx.h"
#include "datasets/partition.h"
#include "datasets/shard.h"
#include "datasets/synthetic.h"

namespace cohort::cli {
namespace {

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

}  // namespace

Status RunPartition(const PartitionOptions& o) {
  COHORT_ASSIGN_OR_RETURN(datasets::PartitionSpec spec, datasets::ParsePartitionSpec(o.scheme));
  COHORT_ASSIGN_OR_RETURN(datasets::FeatureEncoding encoding, ChooseEncoding(o.encoding, o.format));
  if (o.out.empty()) return InvalidArgumentError("--out: an output directory is required");
  datasets::Dataset train, test;
  bool has_test = false;
  if (o.format == "idx") {
    if (o.train_images.empty() || o.train_labels.empty()) {
      return InvalidArgumentError("--format idx needs --train-images and --train-labels");
    }
    COHORT_ASSIGN_OR_RETURN(train, datasets::ReadIdx(o.train_images, o.train_labels));
    if (!o.test_images.empty() || !o.test_labels.empty()) {
      COHORT_ASSIGN_OR_RETURN(test, datasets::ReadIdx(o.test_images, o.test_labels));
      has_test = true;
    }
  } else if (o.format == "csv") {
    if (o.train_csv.empty()) return InvalidArgumentError("--format csv needs --train");
    datasets::CsvOptions csv;
    csv.label_column = o.label_column;
    COHORT_ASSIGN_OR_RETURN(train, datasets::ReadCsv(o.train_csv, csv));
    if (!o.test_csv.empty()) {
      csv.num_classes = train.num_classes;
      COHORT_ASSIGN_OR_RETURN(test, datasets::ReadCsv(o.test_csv, csv));
      has_test = true;
    }
  } else if (o.format == "synthetic") {
    datasets::SyntheticOptions s;
    s.num_samples = o.samples + o.test_samples;
    s.num_features = o.features;
    s.num_classes = o.classes;
    s.seed = o.seed;
    if (o.features == 0 || o.classes < 2 || o.samples == 0) {
      return InvalidArgumentError(
          "--format synthetic needs --samples >= 1, --features >= 1 "
          "and --classes >= 2");
    }
    datasets::Dataset all = datasets::MakeSynthetic(s);
    std::vector<uint32_t> head(o.samples), tail(o.test_samples);
    for (uint32_t i = 0; i < o.samples; ++i) head[i] = i;
    for (uint32_t i = 0; i < o.test_samples; ++i) tail[i] = o.samples + i;
    train = datasets::Subset(all, head);
    test = datasets::Subset(all, tail);
    has_test = o.test_samples > 0;
  } else {
    return InvalidArgumentError("--format: \"" + o.format + "\" is not idx, csv or synthetic");
  }
  if (has_test && test.num_features != train.num_features) {
    return InvalidArgumentError("test set has " + std::to_string(test.num_features) +
                                " features, training set " + std::to_string(train.num_features));
  }
  std::vector<std::vector<uint32_t>> parts;
  if (!o.assignment.empty()) {
    COHORT_ASSIGN_OR_RETURN(parts, datasets::ReadAssignment(o.assignment, train.size()));
  } else {
    COHORT_ASSIGN_OR_RETURN(
        parts, datasets::Partition(train.labels, train.num_classes, o.clients, spec, o.seed));
  }
  const auto num_clients = static_cast<uint32_t>(parts.size());
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return UnavailableError(o.out + ": " + ec.message());

  std::printf("%-14s %8s", "client", "samples");
  for (uint32_t c = 0; c < train.num_classes; ++c) std::printf(" %6u", c);
  std::printf("\n");
  for (uint32_t k = 0; k < num_clients; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "client-%03u", k);
    datasets::Dataset shard = datasets::Subset(train, parts[k]);
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(shard, o.out + "/" + name + ".shard", encoding));
    std::printf("%-14s %8zu", name, shard.size());
    for (uint64_t n : datasets::LabelCounts(shard))
      std::printf(" %6lu", static_cast<unsigned long>(n));
    std::printf("\n");
  }
  if (has_test) {
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(test, o.out + "/test.shard", encoding));
    std::printf("%-14s %8zu\n", "test", test.size());
  }
  return OkStatus();
}

Status RunStatus(const std::string& run_dir, bool json) {
  const std::string path = run_dir + "/run.db";
  if (!std::filesystem::exists(path)) return NotFoundError(path + ": no run database here");
  COHORT_ASSIGN_OR_RETURN(auto store, coordinator::OpenSqliteRunStore(path));
  COHORT_ASSIGN_OR_RETURN(auto rounds, store->Rounds());
  if (!json) {
    // A data-parallel run commits one record per epoch, its workers as the
    // participants.
    const bool epochs = !rounds.empty() && rounds[0].aggregation.rfind("all-reduce", 0) == 0;
    std::printf("%5s %-8s %12s %7s %10s %8s %9s %8s\n", epochs ? "epoch" : "round", "agg",
                epochs ? "workers" : "participants", "dropped", "train_loss", "test_acc",
                "test_loss", "seconds");
  }
  for (const auto& r : rounds) {
    COHORT_ASSIGN_OR_RETURN(auto clients, store->ClientRounds(r.round));
    if (json) {
      std::printf("%s\n", coordinator::RoundJson(r, clients).c_str());
      continue;
    }
    std::printf(
        "%5u %-8s %8u/%-3u %7u %10.4f %8.4f %9.4f %8.2f%s\n", r.round, r.aggregation.c_str(),
        r.participants, r.selected, r.dropped, r.train_loss, r.test_accuracy, r.test_loss,
        r.seconds,
        r.outcome == "committed" ? "" : ("  " + r.outcome + ": " + r.outcome_reason).c_str());
    for (const auto& c : clients) {
      if (coordinator::ProvedMisbehaving(c))
        std::printf("      %s %s\n", c.client.c_str(), c.reason.c_str());
    }
  }
  return OkStatus();
}

}  // namespace cohort::cli
