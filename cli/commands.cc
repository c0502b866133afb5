#include "cli/commands.h"

#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>

#include "coordinator/report.h"
#include "coordinator/run_store.h"
#include "datasets/shard.h"
#include "datasets/split.h"

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
  COHORT_ASSIGN_OR_RETURN(datasets::FeatureEncoding encoding, ChooseEncoding(o.encoding, o.format));
  if (o.out.empty()) return InvalidArgumentError("--out: an output directory is required");
  COHORT_ASSIGN_OR_RETURN(datasets::Split split, datasets::LoadAndSplit(o));
  const datasets::Dataset& train = split.train;
  const datasets::Dataset& test = split.test;
  const bool has_test = split.has_test;
  const auto& parts = split.parts;
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
  if (has_test) {
    COHORT_RETURN_IF_ERROR(datasets::WriteShard(test, o.out + "/test.shard", encoding));
    std::printf("%-14s %8zu\n", "test", test.size());
  }
  return OkStatus();
}

Status RunStatus(const std::string& run_dir, bool json) {
  const std::string path = run_dir + "/run.db";
  if (!std::filesystem::exists(path)) return NotFoundError(path + ": no run database here");
  // Read-only: the file stays exactly as it was, whatever it holds.
  COHORT_ASSIGN_OR_RETURN(auto store, coordinator::OpenSqliteRunStoreReadOnly(path));
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
