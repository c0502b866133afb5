// `cohort status`: the rounds of a run, read from its store.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
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
  bool json = false, csv = false, clients = false, follow = false;
};

// The clients' own training figures are known only in plain rounds: secure
// ones hold their means alone (and data-parallel epochs none per client).
bool PerClientMetrics(const store::RoundRecord& r) { return r.aggregation == "plain"; }

// RFC 4180: quoted when it holds a comma, a quote or a line break.
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

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

bool HasPrivacy(const std::vector<store::RoundRecord>& rounds) {
  for (const auto& r : rounds) {
    if (r.dp_epsilon >= 0) return true;
  }
  return false;
}

bool HasReleasedModelView(const std::vector<store::RoundRecord>& rounds) {
  for (const auto& r : rounds) {
    if (r.dp_epsilon_released_model >= 0) return true;
  }
  return false;
}

// The run's ε after each round, in a run with privacy: central DP's, or
// distributed DP's against the coordinator ("epsilon") and for the
// released model ("released").
std::string PrivacyColumn(const std::vector<store::RoundRecord>& rounds, size_t i) {
  if (!HasPrivacy(rounds)) return "";
  char buf[32];
  std::string out = "        -";
  if (rounds[i].dp_epsilon >= 0) {
    std::snprintf(buf, sizeof(buf), " %8.4g", rounds[i].dp_epsilon);
    out = buf;
  }
  if (!HasReleasedModelView(rounds)) return out;
  if (rounds[i].dp_epsilon_released_model < 0) return out + "         -";
  std::snprintf(buf, sizeof(buf), " %9.4g", rounds[i].dp_epsilon_released_model);
  return out + buf;
}

bool HasAdaptiveClip(const std::vector<store::RoundRecord>& rounds) {
  for (const auto& r : rounds) {
    if (r.dp_clip_norm > 0) return true;
  }
  return false;
}

// The clip norm C each round clipped at, in a run with adaptive clipping
// (privacy.adaptive_clip).
std::string ClipColumn(const std::vector<store::RoundRecord>& rounds, size_t i) {
  if (!HasAdaptiveClip(rounds)) return "";
  if (rounds[i].dp_clip_norm <= 0) return "         -";
  char buf[32];
  std::snprintf(buf, sizeof(buf), " %9.4g", rounds[i].dp_clip_norm);
  return buf;
}

// The q the accountant charged the run's noised rounds at: "0.5", or
// "0.1 to 0.5" when the population moved; "" before any.
std::string SamplingRates(const std::vector<store::RoundRecord>& rounds) {
  double lo = 2, hi = -1;
  for (const auto& r : rounds) {
    if (r.dp_sampling_rate <= 0) continue;
    lo = std::min(lo, r.dp_sampling_rate);
    hi = std::max(hi, r.dp_sampling_rate);
  }
  if (hi < 0) return "";
  return lo == hi ? Number(lo) : Number(lo) + " to " + Number(hi);
}

// Distributed DP's two epsilons after the last round, each named with whom
// it holds against (docs/privacy.md, "Two views"), and the budget's view.
std::string DistributedEpsilons(const config::PrivacyConfig& p,
                                const std::vector<store::RoundRecord>& rounds,
                                const std::string& q) {
  const double against = rounds.empty() ? 0 : std::max(0.0, rounds.back().dp_epsilon);
  const double released = rounds.empty() ? 0 : rounds.back().dp_epsilon_released_model;
  const bool on_released = p.budget_view() == config::RELEASED_MODEL;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%.4g", released);
  return fmt::format(
      "epsilon {:.4g} against the coordinator (who picks the cohorts: no amplification by "
      "sampling) and {} for the released model (amplified by the cohort's sampling without "
      "replacement at q={}; holds only while cohort membership stays secret) at delta {:g} "
      "after round {} ({})",
      against, released < 0 ? std::string("not recorded (an older store)") : std::string(buf), q,
      p.target_delta(), rounds.empty() ? 0u : rounds.back().round,
      p.epsilon_budget() > 0
          ? "budget " + Number(p.epsilon_budget()) +
                (on_released ? " for the released model" : " against the coordinator")
          : std::string("no budget"));
}

// "clip norm C" or, under adaptive clipping, where C started and where
// the last round left it (each round's C is in the clip_norm column).
std::string ClipNormText(const config::PrivacyConfig& p,
                         const std::vector<store::RoundRecord>& rounds) {
  if (!p.has_adaptive_clip()) return "clip norm " + Number(p.clip_norm());
  std::string text = "adaptive clip norm from " + Number(p.clip_norm()) + " (target quantile " +
                     Number(p.adaptive_clip().target_quantile()) + ")";
  if (!rounds.empty() && rounds.back().dp_next_clip_norm > 0) {
    text += ", " + Number(rounds.back().dp_next_clip_norm) + " for round " +
            std::to_string(rounds.back().round + 1);
  }
  return text;
}

// Central DP's settings and what the run has spent, and what was accounted:
// a fixed-size cohort drawn without replacement, replace-one adjacency, the
// noise against the 2 x clip norm a replaced client moves the sum by
// (coordinator/strategy_dp.h, docs/privacy.md). Distributed DP: both its
// views (DistributedEpsilons).
void PrintPrivacy(const config::RunConfig& config, const std::vector<store::RoundRecord>& rounds) {
  if (!config.has_privacy()) return;
  const config::PrivacyConfig& p = config.privacy();
  const double eps = rounds.empty() ? 0 : std::max(0.0, rounds.back().dp_epsilon);
  std::string q = SamplingRates(rounds);
  if (q.empty()) q = "cohort/clients";
  if (p.mechanism() == config::DISTRIBUTED_SKELLAM) {
    std::printf(
        "privacy: distributed DP (Skellam noise from the clients under secure aggregation), "
        "noise multiplier %g, %s; %s; replace-one adjacency (a replaced client moves "
        "the sum by up to 2 x its clipped, rounded update; docs/privacy.md)\n",
        p.noise_multiplier(), ClipNormText(p, rounds).c_str(),
        DistributedEpsilons(p, rounds, q).c_str());
    return;
  }
  std::printf(
      "privacy: DP-FedAvg, noise multiplier %g, %s; epsilon %.4g at delta %g after "
      "round %u (%s), accounted as a fixed-size cohort sampled without replacement at q=%s, "
      "replace-one adjacency (noise multiplier %s / 2: a replaced client moves the sum by up "
      "to 2 x clip norm; docs/privacy.md)\n",
      p.noise_multiplier(), ClipNormText(p, rounds).c_str(), eps, p.target_delta(),
      rounds.empty() ? 0u : rounds.back().round,
      p.epsilon_budget() > 0 ? ("budget " + Number(p.epsilon_budget())).c_str() : "no budget",
      q.c_str(), Number(p.noise_multiplier()).c_str());
}

// SCAFFOLD's N, which divides c's step: the most clients registered in the
// run so far (it never falls, and a resumed coordinator keeps it), after
// the last round. Stores from before N was kept have none to show.
void PrintScaffold(const config::RunConfig& config, const std::vector<store::RoundRecord>& rounds) {
  if (!config.train().scaffold() || rounds.empty()) return;
  const store::RoundRecord& last = rounds.back();
  if (last.scaffold_population == 0) return;
  std::printf(
      "SCAFFOLD: c steps by the sum of the counted clients' c_i changes / N, N = %llu after "
      "round %u (the most clients registered in the run; it never falls)\n",
      static_cast<unsigned long long>(last.scaffold_population), last.round);
}

void PrintInitialFederatedEval(const std::vector<store::RoundRecord>& rounds) {
  if (rounds.empty() || rounds[0].federated_eval_samples == 0) return;
  std::printf(
      "federated evaluation of the initial model: accuracy %.4f, loss %.4f (%llu test "
      "samples)\n",
      rounds[0].federated_eval_accuracy, rounds[0].federated_eval_loss,
      static_cast<unsigned long long>(rounds[0].federated_eval_samples));
}

// One line per client of a round, under the round's line.
void PrintClientRows(const store::RoundRecord& r,
                     const std::vector<store::ClientRoundRecord>& clients) {
  for (const auto& c : clients) {
    char figures[96] = "loss -        acc -        -";
    if (PerClientMetrics(r) && c.status == "ok") {
      std::snprintf(figures, sizeof(figures), "loss %-8.4f acc %-8.4f %.2fs", c.train_loss,
                    c.train_accuracy, c.train_seconds);
    }
    std::printf("      %-16s %-8s samples %-8llu %s  %s%s%s\n", c.client.c_str(), c.status.c_str(),
                static_cast<unsigned long long>(c.num_samples), figures,
                c.stage.empty() ? "" : ("left at " + c.stage + ": ").c_str(), c.reason.c_str(),
                c.misbehaved ? " (misbehaved)" : "");
  }
}

// The rounds (or with `clients` the clients' rows) as CSV with a header.
Status PrintCsv(const std::vector<store::RoundRecord>& rounds, store::RunStore& store,
                bool clients) {
  if (clients) {
    std::printf(
        "round,client,status,reason,stage,num_samples,train_loss,train_accuracy,"
        "train_seconds,misbehaved,upload_bytes,download_bytes,data_sha256\n");
  } else {
    std::printf(
        "round,aggregation,outcome,outcome_reason,participants,selected,dropped,"
        "train_loss,test_accuracy,test_loss,seconds,federated_eval_of_round,"
        "federated_eval_accuracy,federated_eval_loss,federated_eval_samples,dp_sampling_rate,"
        "dp_epsilon,dp_epsilon_released_model\n");
  }
  for (const auto& r : rounds) {
    if (!clients) {
      const bool fed = r.federated_eval_samples > 0;
      std::printf(
          "%u,%s,%s,%s,%u,%u,%u,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", r.round,
          CsvField(r.aggregation).c_str(), CsvField(r.outcome).c_str(),
          CsvField(r.outcome_reason).c_str(), r.participants, r.selected, r.dropped,
          r.train_loss >= 0 ? Number(r.train_loss).c_str() : "",
          r.test_accuracy >= 0 ? Number(r.test_accuracy).c_str() : "",
          r.test_loss >= 0 ? Number(r.test_loss).c_str() : "", Number(r.seconds).c_str(),
          fed ? std::to_string(r.round - 1).c_str() : "",
          fed ? Number(r.federated_eval_accuracy).c_str() : "",
          fed ? Number(r.federated_eval_loss).c_str() : "",
          fed ? std::to_string(r.federated_eval_samples).c_str() : "",
          r.dp_epsilon >= 0 ? Number(r.dp_sampling_rate).c_str() : "",
          r.dp_epsilon >= 0 ? Number(r.dp_epsilon).c_str() : "",
          r.dp_epsilon_released_model >= 0 ? Number(r.dp_epsilon_released_model).c_str() : "");
      continue;
    }
    COHORT_ASSIGN_OR_RETURN(auto rows, store.ClientRounds(r.round));
    for (const auto& c : rows) {
      const bool known = PerClientMetrics(r) && c.status == "ok";
      std::printf(
          "%u,%s,%s,%s,%s,%llu,%s,%s,%s,%d,%llu,%llu,%s\n", r.round, CsvField(c.client).c_str(),
          CsvField(c.status).c_str(), CsvField(c.reason).c_str(), CsvField(c.stage).c_str(),
          static_cast<unsigned long long>(c.num_samples), known ? Number(c.train_loss).c_str() : "",
          known ? Number(c.train_accuracy).c_str() : "",
          known ? Number(c.train_seconds).c_str() : "", c.misbehaved ? 1 : 0,
          static_cast<unsigned long long>(c.upload_bytes),
          static_cast<unsigned long long>(c.download_bytes), c.data_sha256.c_str());
    }
  }
  return OkStatus();
}

// The rows of rounds[from..] (and their clients' rows, or their
// misbehaving clients), or their JSON lines.
Status PrintRows(store::RunStore& store, const std::vector<store::RoundRecord>& rounds, size_t from,
                 bool json, bool clients_rows) {
  for (size_t i = from; i < rounds.size(); ++i) {
    const store::RoundRecord& r = rounds[i];
    COHORT_ASSIGN_OR_RETURN(auto clients, store.ClientRounds(r.round));
    if (json) {
      std::printf("%s\n", coordinator::RoundJson(r, clients).c_str());
      continue;
    }
    // No central evaluation (no test shard, or a model the clients bring): "-".
    std::printf(
        "%5u %-8s %8u/%-3u %7u %10s %8s %9s %8.2f%s%s%s%s\n", r.round, r.aggregation.c_str(),
        r.participants, r.selected, r.dropped, Metric(r.train_loss).c_str(),
        Metric(r.test_accuracy).c_str(), Metric(r.test_loss).c_str(), r.seconds,
        FederatedEvalColumns(rounds, i).c_str(), PrivacyColumn(rounds, i).c_str(),
        ClipColumn(rounds, i).c_str(),
        r.outcome == "committed" ? "" : ("  " + r.outcome + ": " + r.outcome_reason).c_str());
    if (clients_rows) {
      PrintClientRows(r, clients);
      continue;
    }
    for (const auto& c : clients) {
      if (c.misbehaved) std::printf("      %s %s\n", c.client.c_str(), c.reason.c_str());
    }
  }
  std::fflush(stdout);
  return OkStatus();
}

// --follow: the rows of each round as it commits, until the run's last
// round (or Ctrl-C). Reads the store twice a second, read-only.
Status Follow(store::RunStore& store, size_t printed, bool json, bool clients_rows) {
  while (!StopFlag().load()) {
    COHORT_ASSIGN_OR_RETURN(std::optional<store::RunInfo> info, store.LoadRun());
    COHORT_ASSIGN_OR_RETURN(std::vector<store::RoundRecord> rounds, store.Rounds());
    if (rounds.size() > printed) {
      COHORT_RETURN_IF_ERROR(PrintRows(store, rounds, printed, json, clients_rows));
      printed = rounds.size();
    }
    if (info) {
      StatusOr<config::RunConfig> config = config::ParseRunConfig(info->config_text, "run.db");
      if (config.ok() && info->last_round >= config->rounds().num_rounds()) return OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return OkStatus();
}

// Prints the rounds of the run in `run_dir` as a table (with `clients`, a
// line per client under each round), as CSV, or with `json` one JSON object
// per round.
// The run's lineage, where the store has it (stores older than it do not).
void PrintLineage(const store::RunInfo& info) {
  if (info.config_sha256.empty()) return;
  std::printf("config sha256 %s  world size %u%s%s\n", info.config_sha256.c_str(), info.world_size,
              info.devices.empty() ? "" : "  devices ", info.devices.c_str());
}

Status RunStatus(const std::string& run_dir, bool json, bool csv, bool clients_rows, bool follow) {
  const std::string path = run_dir + "/run.db";
  if (!std::filesystem::exists(path)) return NotFoundError(path + ": no run database here");
  // Read-only: the file stays exactly as it was, whatever it holds.
  COHORT_ASSIGN_OR_RETURN(auto store, store::OpenSqliteRunStoreReadOnly(path, follow));
  auto read = store->Rounds();
  if (!read.ok()) return read.status().WithContext(path);
  std::vector<store::RoundRecord> rounds = std::move(read).value();
  if (csv) return PrintCsv(rounds, *store, clients_rows);
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
        PrintLineage(*info);
        PrintPrivacy(*config, rounds);
        PrintScaffold(*config, rounds);
      }
    }
    // A data-parallel run commits one record per epoch, its workers as the
    // participants.
    const bool epochs = !rounds.empty() && rounds[0].aggregation.rfind("all-reduce", 0) == 0;
    PrintInitialFederatedEval(rounds);
    std::printf("%5s %-8s %12s %7s %10s %8s %9s %8s%s%s%s\n", epochs ? "epoch" : "round", "agg",
                epochs ? "workers" : "participants", "dropped", "train_loss", "test_acc",
                "test_loss", "seconds", HasFederatedEval(rounds) ? "   fed_acc  fed_loss" : "",
                HasPrivacy(rounds)
                    ? (HasReleasedModelView(rounds) ? "  epsilon  released" : "  epsilon")
                    : "",
                HasAdaptiveClip(rounds) ? " clip_norm" : "");
  }
  COHORT_RETURN_IF_ERROR(PrintRows(*store, rounds, 0, json, clients_rows));
  if (follow) return Follow(*store, rounds.size(), json, clients_rows);
  return OkStatus();
}

}  // namespace

Command AddStatusCommand(CLI::App& app, const std::string& log_level) {
  auto* status = app.add_subcommand("status", "Print the rounds of a run");
  auto f = std::make_shared<StatusFlags>();
  status->add_option("--run-dir", f->run_dir, "Run directory")->required();
  auto* json = status->add_flag("--json", f->json, "One JSON object per round");
  auto* csv =
      status->add_flag("--csv", f->csv, "CSV with a header: a row per round (or per client)")
          ->excludes(json);
  status
      ->add_flag("--follow", f->follow,
                 "Then print each round as it commits, until the run's last round (or Ctrl-C)")
      ->excludes(csv);
  status->add_flag("--clients", f->clients,
                   "A row per client of each round: samples, training loss, accuracy and "
                   "seconds (plain rounds), status, the stage it left at and why");
  return {status, [f, &log_level] {
            InitLogging("status", "", log_level);
            return Report(RunStatus(f->run_dir, f->json, f->csv, f->clients, f->follow), "status");
          }};
}

}  // namespace cohort::cli
