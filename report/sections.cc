#include "report/sections.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "report/svg.h"

namespace cohort::report::internal {
namespace {

// A long client list is cut in the table (the charts keep every client).
constexpr size_t kMaxClientRows = 500;

std::vector<std::string> RoundCategories(const RunData& run) {
  std::vector<std::string> out;
  for (const auto& r : run.rounds) out.push_back(std::to_string(r.round));
  return out;
}

// Adds `name` to `order` unless it is there.
void Remember(std::vector<std::string>& order, const std::string& name) {
  if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
}

// The stages in the coordinator's order (its stage records), then any
// other stage a client left at, as they first appear.
std::vector<std::string> StageOrder(const RunData& run) {
  std::vector<std::string> order;
  for (const auto& r : run.rounds) {
    for (const auto& s : r.stages) Remember(order, s.stage);
  }
  for (const auto& [round, clients] : run.clients) {
    for (const auto& c : clients) {
      if (!c.stage.empty()) Remember(order, c.stage);
    }
  }
  return order;
}

// Each round's clients by ParticipationCategory, in stage order.
BarChart DropoutChart(const RunData& run, size_t index) {
  BarChart chart{"dropouts", static_cast<int>(index), "Participation and dropouts by stage",
                 IsDataParallel(run) ? "epoch" : "round", "clients"};
  chart.categories = RoundCategories(run);
  std::vector<std::string> ids = {"completed"};
  std::map<std::string, BarStack> stacks;
  stacks["completed"] = {"completed", "completed", {}};
  for (const auto& stage : StageOrder(run)) {
    ids.push_back("stage:" + stage);
    stacks[ids.back()] = {ids.back(), "left at " + stage, {}};
  }
  for (size_t i = 0; i < run.rounds.size(); ++i) {
    auto it = run.clients.find(run.rounds[i].round);
    if (it == run.clients.end()) continue;
    for (const auto& c : it->second) {
      const auto [name, id] = ParticipationCategory(c);
      if (!stacks.count(id)) ids.push_back(id), stacks[id] = {id, name, {}};
      std::vector<double>& values = stacks[id].values;
      values.resize(run.rounds.size(), 0);
      values[i] += 1;
    }
  }
  // Only what happened: a stage no client left at gets no colour either.
  for (const auto& id : ids) {
    const auto& values = stacks[id].values;
    if (std::any_of(values.begin(), values.end(), [](double v) { return v > 0; })) {
      chart.stacks.push_back(stacks[id]);
    }
  }
  chart.empty_text = IsDataParallel(run)
                         ? "No per-client records: a data-parallel run's epochs have none."
                         : "No per-client records in this run.";
  chart.note =
      "A client that left after its masked input still counts: its input is in the sum "
      "(status ok). \"dropped\" or \"rejected\": the store names no stage for it (plain "
      "rounds have none).";
  return chart;
}

// A row per category of `chart` (in its order): client-rounds and the
// rounds it happened in.
std::string DropoutTable(const RunData& run, const BarChart& chart) {
  std::map<std::string, std::pair<size_t, size_t>> totals;  // name: (clients, rounds)
  for (const auto& [round, clients] : run.clients) {
    std::map<std::string, bool> in_round;
    for (const auto& c : clients) {
      const std::string name = ParticipationCategory(c).first;
      totals[name].first += 1;
      if (!in_round[name]) totals[name].second += 1, in_round[name] = true;
    }
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& stack : chart.stacks) {
    auto it = totals.find(stack.name);
    if (it == totals.end()) continue;
    rows.push_back(
        {stack.name, std::to_string(it->second.first), std::to_string(it->second.second)});
  }
  if (rows.empty()) return "";
  return Table({"", "client-rounds", "rounds"}, rows);
}

std::string AbortedRounds(const RunData& run) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : run.rounds) {
    if (r.outcome != "committed") {
      rows.push_back({std::to_string(r.round), r.outcome, r.aggregation, r.outcome_reason});
    }
  }
  if (rows.empty()) return "";
  return "<h3>Rounds not committed</h3>\n" +
         Table({"round", "outcome", "aggregation", "why"}, rows);
}

BarChart StageTimeChart(const RunData& run, size_t index) {
  BarChart chart{"stage-time", static_cast<int>(index), "Round time by stage",
                 IsDataParallel(run) ? "epoch" : "round", "seconds"};
  chart.unit = Unit::kSeconds;
  chart.categories = RoundCategories(run);
  for (const auto& stage : StageOrder(run)) {
    BarStack stack{stage, stage, std::vector<double>(run.rounds.size(), 0)};
    for (size_t i = 0; i < run.rounds.size(); ++i) {
      for (const auto& s : run.rounds[i].stages) {
        if (s.stage == stage) stack.values[i] += s.seconds;
      }
    }
    chart.stacks.push_back(std::move(stack));
  }
  chart.empty_text =
      "No stage timings in this store (a data-parallel run's epochs have none; older stores "
      "did not record them).";
  chart.note =
      "Seconds on the protocol's clock: wall time in the daemons, virtual time in "
      "the simulator.";
  return chart;
}

// What the store says of one client over the run.
struct ClientSummary {
  uint64_t samples = 0;  // Its latest non-zero figure.
  std::string data_sha256;
  bool sha_changed = false;
  size_t rounds = 0, ok = 0, dropped = 0, misbehaved = 0;
  uint64_t upload = 0, download = 0;
  std::vector<uint64_t> label_counts;  // Its latest shared ones (opt-in).
};

std::map<std::string, ClientSummary> Summarize(const RunData& run) {
  std::map<std::string, ClientSummary> out;
  for (const auto& [round, clients] : run.clients) {
    for (const auto& c : clients) {
      ClientSummary& s = out[c.client];
      if (c.num_samples > 0) s.samples = c.num_samples;
      if (!c.label_counts.empty()) s.label_counts = c.label_counts;
      if (!c.data_sha256.empty()) {
        if (!s.data_sha256.empty() && s.data_sha256 != c.data_sha256) s.sha_changed = true;
        s.data_sha256 = c.data_sha256;
      }
      s.rounds += 1;
      s.ok += c.status == "ok" ? 1 : 0;
      s.dropped += c.status == "ok" ? 0 : 1;
      s.misbehaved += c.misbehaved ? 1 : 0;
      s.upload += c.upload_bytes;
      s.download += c.download_bytes;
    }
  }
  return out;
}

// The spread of the clients' sample counts, in words.
std::string Spread(const std::map<std::string, ClientSummary>& clients) {
  std::vector<double> counts;
  for (const auto& [name, s] : clients) {
    if (s.samples > 0) counts.push_back(static_cast<double>(s.samples));
  }
  if (counts.empty()) return "No client reported a sample count.";
  std::sort(counts.begin(), counts.end());
  double sum = 0, squares = 0;
  for (double c : counts) sum += c, squares += c * c;
  const double n = static_cast<double>(counts.size()), mean = sum / n;
  const double sd = std::sqrt(std::max(0.0, squares / n - mean * mean));
  const size_t mid = counts.size() / 2;
  const double median = counts.size() % 2 ? counts[mid] : (counts[mid - 1] + counts[mid]) / 2;
  return std::to_string(counts.size()) + " clients, " + Format("%.0f", sum) +
         " samples in all; min " + Format("%.0f", counts.front()) + ", median " +
         Format("%.0f", median) + ", max " + Format("%.0f", counts.back()) + " (max/min " +
         Format("%.2f", counts.back() / counts.front()) + "), coefficient of variation " +
         Format("%.3f", sd / mean) + ".";
}

// Each client's share of each class (a stack per label), from the label
// counts the clients shared; the clients that did not share are left out.
BarChart LabelSkewChart(const std::map<std::string, ClientSummary>& clients, size_t index) {
  BarChart chart{"label-skew", static_cast<int>(index), "Label skew: each client's classes",
                 "client", "% of its samples"};
  size_t classes = 0, shared = 0;
  for (const auto& [name, s] : clients) {
    classes = std::max(classes, s.label_counts.size());
    shared += s.label_counts.empty() ? 0 : 1;
  }
  for (size_t label = 0; label < classes; ++label) {
    chart.stacks.push_back(
        {"label:" + std::to_string(label), "label " + std::to_string(label), {}});
  }
  for (const auto& [name, s] : clients) {
    if (s.label_counts.empty()) continue;
    chart.categories.push_back(name);
    double total = 0;
    for (uint64_t c : s.label_counts) total += static_cast<double>(c);
    for (size_t label = 0; label < classes; ++label) {
      const double c = label < s.label_counts.size() ? double(s.label_counts[label]) : 0;
      chart.stacks[label].values.push_back(total > 0 ? 100 * c / total : 0);
    }
  }
  chart.empty_text =
      "No client shared its label counts (they are opt-in: cohort client "
      "--share-label-counts; every client of cohort simulate shares them).";
  chart.note = std::to_string(shared) + " of " + std::to_string(clients.size()) +
               " clients shared their label counts (opt-in: cohort client --share-label-counts; "
               "every client of cohort simulate).";
  return chart;
}

std::string ClientCharts(const std::map<std::string, ClientSummary>& clients, size_t index) {
  BarChart samples{"client-samples", static_cast<int>(index), "Samples per client", "client",
                   "samples"};
  BarChart bytes{"client-bytes", static_cast<int>(index),
                 "Bytes per client over the run (at the coordinator)", "client", "bytes"};
  bytes.unit = Unit::kBytes;
  samples.stacks = {{"samples", "training samples (latest reported)", {}}};
  bytes.stacks = {{"upload", "received from the client", {}}, {"download", "sent to it", {}}};
  for (const auto& [name, s] : clients) {
    samples.categories.push_back(name);
    bytes.categories.push_back(name);
    samples.stacks[0].values.push_back(static_cast<double>(s.samples));
    bytes.stacks[0].values.push_back(static_cast<double>(s.upload));
    bytes.stacks[1].values.push_back(static_cast<double>(s.download));
  }
  samples.empty_text = "No client reported a sample count.";
  samples.note = Spread(clients);
  bytes.empty_text = "No per-client byte counts in this store (older stores did not record them).";
  return RenderBarChart(samples) + RenderBarChart(LabelSkewChart(clients, index)) +
         RenderBarChart(bytes);
}

std::string ClientTable(const std::map<std::string, ClientSummary>& clients) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& [name, s] : clients) {
    if (rows.size() == kMaxClientRows) break;
    rows.push_back({name, std::to_string(s.samples),
                    s.data_sha256.empty() ? "(not reported)"
                                          : s.data_sha256 + (s.sha_changed ? " (changed)" : ""),
                    std::to_string(s.rounds), std::to_string(s.ok), std::to_string(s.dropped),
                    std::to_string(s.misbehaved), FormatValue(double(s.upload), Unit::kBytes),
                    FormatValue(double(s.download), Unit::kBytes)});
  }
  std::string cut;
  if (clients.size() > rows.size()) {
    cut = "<p class=\"note\">The first " + std::to_string(rows.size()) + " of " +
          std::to_string(clients.size()) + " clients, by name.</p>\n";
  }
  return Table({"client", "samples", "shard SHA-256", "rounds selected", "ok", "dropped",
                "misbehaved", "upload", "download"},
               rows) +
         cut;
}

std::string ClientsPart(const RunData& run, size_t index) {
  const auto clients = Summarize(run);
  std::string s = "<h3>Clients</h3>\n";
  if (clients.empty()) {
    return s + "<p class=\"nodata\">No per-client records in this run" +
           (IsDataParallel(run) ? ": a data-parallel run's ranks are below." : ".") + "</p>\n";
  }
  return s + ClientCharts(clients, index) + ClientTable(clients);
}

}  // namespace

std::string Table(const std::vector<std::string>& head,
                  const std::vector<std::vector<std::string>>& rows) {
  std::string s = "<table><tr>";
  for (const auto& h : head) s += "<th>" + EscapeHtml(h) + "</th>";
  s += "</tr>\n";
  for (const auto& row : rows) {
    s += "<tr>";
    for (const auto& cell : row) {
      // A long word (a checksum, a path) may break anywhere; names stay whole.
      const bool wrap = cell.size() > 32 && cell.find(' ') == std::string::npos;
      s += (wrap ? "<td class=\"wrap\">" : "<td>") + EscapeHtml(cell) + "</td>";
    }
    s += "</tr>\n";
  }
  return s + "</table>\n";
}

std::string Format(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string RunLabel(size_t index) { return "run " + std::to_string(index + 1); }

std::string RunSection(const RunData& run, size_t index) {
  std::string s = "<section class=\"run\" id=\"run-" + std::to_string(index + 1) + "\"><h2>" +
                  EscapeHtml(RunLabel(index) + ": " + run.dir) + "</h2>\n";
  if (run.rounds.empty()) s += "<p class=\"nodata\">The run has committed no round yet.</p>\n";
  const BarChart dropouts = DropoutChart(run, index);
  s += RenderBarChart(dropouts) + DropoutTable(run, dropouts) + AbortedRounds(run);
  s += RenderBarChart(StageTimeChart(run, index));
  s += ClientsPart(run, index);
  if (IsDataParallel(run) || std::any_of(run.rounds.begin(), run.rounds.end(),
                                         [](const auto& r) { return !r.ranks.empty(); })) {
    s += RanksPart(run, index);
  }
  return s + "</section>\n";
}

}  // namespace cohort::report::internal
