// `cohort status`: the rounds of a run, read from its store.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/logging.h"
#include "coordinator/report.h"
#include "coordinator/secagg_plan.h"
#include "proto/config_io.h"
#include "store/run_store.h"

namespace cohort::cli {
namespace {

struct StatusFlags {
  std::string run_dir;
  bool json = false;
};

// A metric as the table prints it: 4 decimals, or "-" where there is none (-1).
std::string Metric(double v) {
  if (v < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

bool HasFederatedEval(const std::vector<store::RoundRecord>& rounds) {
  for (const auto& r : rounds) {
    if (r.federated_eval_samples > 0) return true;
  }
  return false;
}

// A round's model is evaluated by the clients of the next round (the record
// of round r holds round r - 1's model's federated evaluation): the row of
// rounds[i] shows rounds[i + 1]'s, or "-" where there is none (yet).
std::string FederatedEvalColumns(const std::vector<store::RoundRecord>& rounds, size_t i) {
  if (!HasFederatedEval(rounds)) return "";
  const store::RoundRecord* next = i + 1 < rounds.size() ? &rounds[i + 1] : nullptr;
  if (next == nullptr || next->federated_eval_samples == 0) return "         -         -";
  char buf[64];
  std::snprintf(buf, sizeof(buf), " %9.4f %9.4f", next->federated_eval_accuracy,
                next->federated_eval_loss);
  return buf;
}

void PrintInitialFederatedEval(const std::vector<store::RoundRecord>& rounds) {
  if (rounds.empty() || rounds[0].federated_eval_samples == 0) return;
  std::printf(
      "federated evaluation of the initial model: accuracy %.4f, loss %.4f (%llu test "
      "samples)\n",
      rounds[0].federated_eval_accuracy, rounds[0].federated_eval_loss,
      static_cast<unsigned long long>(rounds[0].federated_eval_samples));
}

// Prints the rounds of the run in `run_dir` as a table, or with `json` one
// JSON object per round.
Status RunStatus(const std::string& run_dir, bool json) {
  const std::string path = run_dir + "/run.db";
  if (!std::filesystem::exists(path)) return NotFoundError(path + ": no run database here");
  // Read-only: the file stays exactly as it was, whatever it holds.
  COHORT_ASSIGN_OR_RETURN(auto store, store::OpenSqliteRunStoreReadOnly(path));
  COHORT_ASSIGN_OR_RETURN(auto rounds, store->Rounds());
  if (!json) {
    // The secure rounds' plan, from the run's own config.
    COHORT_ASSIGN_OR_RETURN(std::optional<store::RunInfo> info, store->LoadRun());
    if (info) {
      auto config = config::ParseRunConfig(info->config_text, path);
      if (config.ok()) {
        const uint32_t first = coordinator::FirstRoundClients(*config);
        for (const auto& line : coordinator::DescribePlan(*config, first))
          std::printf("%s\n", line.c_str());
        std::printf("version %s\n", info->code_version.c_str());
      }
    }
    // A data-parallel run commits one record per epoch, its workers as the
    // participants.
    const bool epochs = !rounds.empty() && rounds[0].aggregation.rfind("all-reduce", 0) == 0;
    PrintInitialFederatedEval(rounds);
    std::printf("%5s %-8s %12s %7s %10s %8s %9s %8s%s\n", epochs ? "epoch" : "round", "agg",
                epochs ? "workers" : "participants", "dropped", "train_loss", "test_acc",
                "test_loss", "seconds", HasFederatedEval(rounds) ? "   fed_acc  fed_loss" : "");
  }
  for (size_t i = 0; i < rounds.size(); ++i) {
    const store::RoundRecord& r = rounds[i];
    COHORT_ASSIGN_OR_RETURN(auto clients, store->ClientRounds(r.round));
    if (json) {
      std::printf("%s\n", coordinator::RoundJson(r, clients).c_str());
      continue;
    }
    // No central evaluation (no test shard, or a model the clients bring): "-".
    std::printf(
        "%5u %-8s %8u/%-3u %7u %10.4f %8s %9s %8.2f%s%s\n", r.round, r.aggregation.c_str(),
        r.participants, r.selected, r.dropped, r.train_loss, Metric(r.test_accuracy).c_str(),
        Metric(r.test_loss).c_str(), r.seconds, FederatedEvalColumns(rounds, i).c_str(),
        r.outcome == "committed" ? "" : ("  " + r.outcome + ": " + r.outcome_reason).c_str());
    for (const auto& c : clients) {
      if (c.misbehaved) std::printf("      %s %s\n", c.client.c_str(), c.reason.c_str());
    }
  }
  return OkStatus();
}

}  // namespace

Command AddStatusCommand(CLI::App& app, const std::string& log_level) {
  auto* status = app.add_subcommand("status", "Print the rounds of a run");
  auto f = std::make_shared<StatusFlags>();
  status->add_option("--run-dir", f->run_dir, "Run directory")->required();
  status->add_flag("--json", f->json, "One JSON object per round");
  return {status, [f, &log_level] {
            InitLogging("status", "", log_level);
            return Report(RunStatus(f->run_dir, f->json), "status");
          }};
}

}  // namespace cohort::cli
