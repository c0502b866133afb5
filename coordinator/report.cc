#include "coordinator/report.h"

#include <cstdio>
#include <iterator>
#include <map>

#include "aggregation/secagg_stage.h"

namespace cohort::coordinator {
namespace {

std::string JsonNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

// The clients' evaluation of the model this round started from (the last
// round's), when the round had one.
std::string FederatedEvalJson(const store::RoundRecord& r) {
  if (r.federated_eval_samples == 0) return "";
  return ",\"federated_eval\":{\"model_round\":" + std::to_string(r.round - 1) +
         ",\"loss\":" + JsonNumber(r.federated_eval_loss) +
         ",\"accuracy\":" + JsonNumber(r.federated_eval_accuracy) +
         ",\"samples\":" + std::to_string(r.federated_eval_samples) + "}";
}

// Privacy (config privacy): the round's sampling rate and the run's ε
// after it (distributed DP: against the coordinator), and distributed DP's
// ε for the released model.
std::string PrivacyJson(const store::RoundRecord& r) {
  if (r.dp_epsilon < 0) return "";
  const std::string released =
      r.dp_epsilon_released_model < 0
          ? ""
          : ",\"epsilon_released_model\":" + JsonNumber(r.dp_epsilon_released_model);
  return ",\"privacy\":{\"sampling_rate\":" + JsonNumber(r.dp_sampling_rate) +
         ",\"epsilon\":" + JsonNumber(r.dp_epsilon) + released + "}";
}

// The round's traffic (all its stages' bytes), its stages and its
// data-parallel ranks, as the store holds them (issue 33's timings).
std::string TimingsJson(const store::RoundRecord& r) {
  uint64_t in = 0, out = 0;
  std::string stages, ranks;
  for (const auto& st : r.stages) {
    in += st.bytes_in;
    out += st.bytes_out;
    stages += std::string(stages.empty() ? "" : ",") + "{\"stage\":" + JsonString(st.stage) +
              ",\"seconds\":" + JsonNumber(st.seconds) +
              ",\"bytes_in\":" + std::to_string(st.bytes_in) +
              ",\"bytes_out\":" + std::to_string(st.bytes_out) + "}";
  }
  for (const auto& rk : r.ranks) {
    ranks +=
        std::string(ranks.empty() ? "" : ",") + "{\"rank\":" + std::to_string(rk.rank) +
        ",\"steps\":" + std::to_string(rk.steps) + ",\"samples\":" + std::to_string(rk.samples) +
        ",\"compute_seconds\":" + JsonNumber(rk.compute_seconds) +
        ",\"comm_seconds\":" + JsonNumber(rk.comm_seconds) +
        ",\"seconds\":" + JsonNumber(rk.seconds) + ",\"device\":" + JsonString(rk.device) + "}";
  }
  return ",\"bytes_in\":" + std::to_string(in) + ",\"bytes_out\":" + std::to_string(out) +
         ",\"stages\":[" + stages + "],\"ranks\":[" + ranks + "]";
}

}  // namespace

std::string RoundJson(const store::RoundRecord& r,
                      const std::vector<store::ClientRoundRecord>& clients) {
  // Secure aggregation: who left at which stage. A client that left after
  // its masked input is not a dropout (its input is in the sum): it is
  // listed apart, so dropped_by_stage counts what `dropped` counts.
  std::map<std::string, std::string> by_stage;
  std::string dropped, misbehaving, after_input;
  for (const auto& c : clients) {
    if (!c.stage.empty()) {
      std::string& list = c.status == "ok" ? after_input : by_stage[c.stage];
      list += (list.empty() ? "" : ",") + (c.status == "ok"
                                               ? "{\"client\":" + JsonString(c.client) +
                                                     ",\"stage\":" + JsonString(c.stage) + "}"
                                               : JsonString(c.client));
    }
    if (c.misbehaved) {
      misbehaving += (misbehaving.empty() ? "" : ",") + std::string("{\"client\":") +
                     JsonString(c.client) + ",\"what\":" + JsonString(c.reason) + "}";
    }
    if (c.status == "ok") continue;
    dropped += (dropped.empty() ? "" : ",") + JsonString(c.client);
  }
  std::string stages;
  if (r.aggregation != "plain") {
    stages = ",\"dropped_by_stage\":{";
    for (aggregation::SecAggStage stage : aggregation::kSecAggStages) {
      const char* name = aggregation::StageName(stage);
      stages += std::string(stages.back() == '{' ? "" : ",") + "\"" + name + "\":[" +
                by_stage[name] + "]";
    }
    stages += "},\"left_after_input\":[" + after_input + "]";
  }
  return "{\"round\":" + std::to_string(r.round) + ",\"aggregation\":" + JsonString(r.aggregation) +
         ",\"outcome\":" + JsonString(r.outcome) +
         (r.outcome_reason.empty() ? "" : ",\"outcome_reason\":" + JsonString(r.outcome_reason)) +
         ",\"participants\":" + std::to_string(r.participants) +
         ",\"selected\":" + std::to_string(r.selected) +
         ",\"dropped\":" + std::to_string(r.dropped) + ",\"dropped_clients\":[" + dropped + "]" +
         stages + ",\"misbehaving\":[" + misbehaving +
         "],\"train_loss\":" + (r.train_loss >= 0 ? JsonNumber(r.train_loss) : "null") +
         ",\"test_accuracy\":" + (r.test_accuracy >= 0 ? JsonNumber(r.test_accuracy) : "null") +
         ",\"test_loss\":" + (r.test_loss >= 0 ? JsonNumber(r.test_loss) : "null") +
         ",\"seconds\":" + JsonNumber(r.seconds) +
         ",\"coordinator_seconds\":" + JsonNumber(r.coordinator_seconds) +
         ",\"clock_seconds\":" + JsonNumber(r.clock_seconds) + FederatedEvalJson(r) +
         PrivacyJson(r) +
         (r.scaffold_population > 0
              ? ",\"scaffold_population\":" + std::to_string(r.scaffold_population)
              : "") +
         TimingsJson(r) + "}";
}

void PrintRound(const store::RoundRecord& r, uint32_t total) {
  if (r.outcome == "aborted") {
    // Nothing was trained into the model: no loss to show, only why.
    std::printf("round %3u/%u  aborted: %s  clients %u/%u  dropped %u  %.2fs\n", r.round, total,
                r.outcome_reason.c_str(), r.participants, r.selected, r.dropped, r.seconds);
    std::fflush(stdout);
    return;
  }
  // A train loss below 0 is not known (distributed DP: the clients do not say).
  std::printf("round %3u/%u  clients %u/%u  dropped %u  train_loss ", r.round, total,
              r.participants, r.selected, r.dropped);
  if (r.train_loss >= 0) {
    std::printf("%.4f", r.train_loss);
  } else {
    std::printf("-");
  }
  if (r.test_accuracy >= 0) {
    std::printf("  test_acc %.4f  test_loss %.4f", r.test_accuracy, r.test_loss);
  }
  if (r.dp_epsilon >= 0) std::printf("  epsilon %.4g", r.dp_epsilon);
  if (r.dp_epsilon_released_model >= 0) {
    std::printf(" (released model %.4g)", r.dp_epsilon_released_model);
  }
  std::printf("  %.2fs\n", r.seconds);
  std::fflush(stdout);
}

}  // namespace cohort::coordinator
