#include "report/html_report.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <set>

#include "report/sections.h"
#include "report/svg.h"

namespace cohort::report {
namespace {

using internal::Format;
using internal::RunLabel;
using internal::Table;

// No fetch of any kind: the page is whole as it is (styles inline, no
// script, no image or font).
constexpr char kHead[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
    "style-src 'unsafe-inline'\">\n"
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";

constexpr char kStyle[] =
    "<style>\n"
    "body{font:14px/1.4 sans-serif;margin:24px auto;max-width:920px;color:#222}\n"
    "h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;margin-top:32px}\n"
    "h3{font-size:15px}figure{margin:16px 0}figcaption{font-weight:bold;margin-bottom:4px}\n"
    "svg.plot{display:block;max-width:100%;height:auto}\n"
    ".axis line{stroke:#ddd}.axis text{fill:#555;font-size:11px;stroke:none}\n"
    ".legend{list-style:none;padding:0;margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 16px}\n"
    ".legend svg{vertical-align:middle;margin-right:4px}\n"
    ".swatch{display:inline-block;width:12px;height:12px;margin-right:4px;"
    "vertical-align:middle}\n"
    ".nodata{color:#666;font-style:italic;border:1px dashed #bbb;padding:12px}\n"
    ".note{color:#555;font-size:13px}\n"
    "table{border-collapse:collapse;margin:8px 0;font-size:13px}\n"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\n"
    "td.wrap{word-break:break-all}pre{background:#f6f6f6;padding:8px;overflow-x:auto}\n"
    "</style></head>\n";

// "round", or "epoch" when every run is data-parallel.
std::string XLabel(const std::vector<RunData>& runs) {
  size_t dp = 0;
  for (const auto& run : runs) dp += IsDataParallel(run) ? 1 : 0;
  if (dp == runs.size()) return "epoch";
  return dp == 0 ? "round" : "round (epoch for data-parallel runs)";
}

// A series of run `run`: with one run, series differ by colour; with
// several, a run has one colour and its series differ by dash.
LineSeries Series(const std::vector<RunData>& runs, size_t run, int k, const std::string& id,
                  const std::string& name) {
  LineSeries s;
  s.id = id;
  s.name = runs.size() > 1 ? RunLabel(run) + ": " + name : name;
  s.run = static_cast<int>(run);
  s.color = runs.size() > 1 ? static_cast<int>(run) : k;
  s.dash = runs.size() > 1 ? k : 0;
  return s;
}

// The clients' own training accuracy in a plain round, weighted by their
// samples (secure rounds reveal no client's; data-parallel epochs have no
// client rows). -1: none.
double ClientsTrainAccuracy(const RunData& run, const store::RoundRecord& r) {
  if (r.aggregation != "plain" || r.outcome != "committed") return -1;
  auto it = run.clients.find(r.round);
  if (it == run.clients.end()) return -1;
  double weighted = 0, samples = 0;
  for (const auto& c : it->second) {
    if (c.status != "ok" || c.num_samples == 0) continue;
    weighted += c.train_accuracy * c.num_samples;
    samples += c.num_samples;
  }
  return samples > 0 ? weighted / samples : -1;
}

LineChart AccuracyChart(const std::vector<RunData>& runs) {
  LineChart chart{"accuracy", "Accuracy per round", XLabel(runs), "accuracy"};
  for (size_t i = 0; i < runs.size(); ++i) {
    LineSeries test = Series(runs, i, 0, "test_accuracy", "test (central evaluation)");
    LineSeries fed = Series(runs, i, 1, "federated_eval_accuracy", "test (federated evaluation)");
    LineSeries train = Series(runs, i, 2, "train_accuracy", "train (clients' own, plain rounds)");
    for (const auto& r : runs[i].rounds) {
      if (r.test_accuracy >= 0) test.points.push_back({r.round, r.test_accuracy});
      // Round r's record holds the federated evaluation of round r - 1's model.
      if (r.federated_eval_samples > 0)
        fed.points.push_back({r.round - 1.0, r.federated_eval_accuracy});
      const double acc = ClientsTrainAccuracy(runs[i], r);
      if (acc >= 0) train.points.push_back({r.round, acc});
    }
    chart.series.insert(chart.series.end(), {test, fed, train});
  }
  chart.empty_text =
      "No accuracy recorded: no round was evaluated (no test shard, no federated evaluation) and "
      "no plain round has the clients' own training accuracy.";
  chart.note =
      "x: the model after that round (0: the initial model). Federated evaluation is the "
      "clients' test-sample-weighted mean; training accuracy the clients' sample-weighted mean.";
  return chart;
}

LineChart LossChart(const std::vector<RunData>& runs) {
  LineChart chart{"loss", "Loss per round", XLabel(runs), "loss"};
  for (size_t i = 0; i < runs.size(); ++i) {
    LineSeries train = Series(runs, i, 0, "train_loss", "train");
    LineSeries test = Series(runs, i, 1, "test_loss", "test (central evaluation)");
    LineSeries fed = Series(runs, i, 2, "federated_eval_loss", "test (federated evaluation)");
    for (const auto& r : runs[i].rounds) {
      if (r.outcome == "committed" && r.train_loss >= 0) {
        train.points.push_back({r.round, r.train_loss});
      }
      if (r.test_loss >= 0) test.points.push_back({r.round, r.test_loss});
      if (r.federated_eval_samples > 0)
        fed.points.push_back({r.round - 1.0, r.federated_eval_loss});
    }
    chart.series.insert(chart.series.end(), {train, test, fed});
  }
  chart.empty_text =
      "No loss recorded: no round has committed, or (under distributed DP, where the "
      "coordinator does not learn the training loss) none was evaluated centrally.";
  chart.note =
      "Training loss of committed rounds (aborted rounds have none, nor do rounds under "
      "distributed DP: the clients do not report it).";
  return chart;
}

LineChart ParticipationChart(const std::vector<RunData>& runs) {
  LineChart chart{"participation", "Participation per round", XLabel(runs), "clients"};
  for (size_t i = 0; i < runs.size(); ++i) {
    LineSeries selected = Series(runs, i, 0, "selected", "selected");
    LineSeries in = Series(runs, i, 1, "participants", "aggregated (participants)");
    LineSeries dropped = Series(runs, i, 2, "dropped", "dropped (missing or rejected)");
    for (const auto& r : runs[i].rounds) {
      selected.points.push_back({r.round, double(r.selected)});
      in.points.push_back({r.round, double(r.participants)});
      dropped.points.push_back({r.round, double(r.dropped)});
    }
    chart.series.insert(chart.series.end(), {selected, in, dropped});
  }
  chart.empty_text = "No round recorded yet.";
  chart.note =
      "A data-parallel run's participants are its workers. Dropouts by stage: each run's section.";
  return chart;
}

LineChart RoundTimeChart(const std::vector<RunData>& runs) {
  LineChart chart{"round-time", "Round time", XLabel(runs), "seconds"};
  chart.unit = Unit::kSeconds;
  for (size_t i = 0; i < runs.size(); ++i) {
    LineSeries wall = Series(runs, i, 0, "seconds", "wall time");
    LineSeries clock =
        Series(runs, i, 1, "clock_seconds", "protocol clock (virtual when simulated)");
    LineSeries coord = Series(runs, i, 2, "coordinator_seconds", "aggregate, evaluate, commit");
    for (const auto& r : runs[i].rounds) {
      wall.points.push_back({r.round, r.seconds});
      if (r.clock_seconds > 0) clock.points.push_back({r.round, r.clock_seconds});
      if (r.coordinator_seconds > 0) coord.points.push_back({r.round, r.coordinator_seconds});
    }
    chart.series.insert(chart.series.end(), {wall, clock, coord});
  }
  chart.empty_text = "No round recorded yet.";
  chart.note = "The split of each round by stage: each run's section.";
  return chart;
}

LineChart BytesChart(const std::vector<RunData>& runs) {
  LineChart chart{"bytes", "Bytes moved per round (at the coordinator)", XLabel(runs), "bytes"};
  chart.unit = Unit::kBytes;
  for (size_t i = 0; i < runs.size(); ++i) {
    LineSeries in = Series(runs, i, 0, "bytes_in", "received");
    LineSeries out = Series(runs, i, 1, "bytes_out", "sent");
    for (const auto& r : runs[i].rounds) {
      if (r.stages.empty()) continue;
      double received = 0, sent = 0;
      for (const auto& s : r.stages) received += s.bytes_in, sent += s.bytes_out;
      in.points.push_back({r.round, received});
      out.points.push_back({r.round, sent});
    }
    chart.series.insert(chart.series.end(), {in, out});
  }
  chart.empty_text =
      "No byte counts in these stores: no round has stage records (a data-parallel run's "
      "epochs, or a store older than them).";
  chart.note = "Messages' encoded sizes (headers and payloads), summed over the round's stages.";
  return chart;
}

// "2026-12-05 12:41:01 UTC" of a commit's Unix milliseconds.
std::string UtcTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string Or(const std::string& s, const char* fallback) { return s.empty() ? fallback : s; }

std::vector<std::string> LineageColumn(const RunData& run) {
  size_t aborted = 0;
  for (const auto& r : run.rounds) aborted += r.outcome == "committed" ? 0 : 1;
  const store::RunInfo& info = run.info;
  return {run.dir,
          IsDataParallel(run) ? "data-parallel" : "federated",
          Or(info.code_version, "(not recorded)"),
          Or(info.config_sha256, "(not recorded: an older store)"),
          std::to_string(info.seed),
          info.world_size > 0 ? std::to_string(info.world_size) : "(not recorded)",
          Or(info.devices, "(not recorded)"),
          std::to_string(info.last_round),
          std::to_string(run.rounds.size()) + " (" + std::to_string(aborted) + " aborted)",
          run.rounds.empty() ? "-" : UtcTime(run.rounds.front().committed_unix_ms),
          run.rounds.empty() ? "-" : UtcTime(run.rounds.back().committed_unix_ms)};
}

// A row per lineage field, a column per run.
std::string LineageSection(const std::vector<RunData>& runs) {
  const std::vector<std::string> fields = {"run directory",
                                           "mode",
                                           "code version",
                                           "config SHA-256",
                                           "seed",
                                           "world size",
                                           "devices",
                                           "last committed round",
                                           "records (rounds or epochs)",
                                           "first commit",
                                           "last commit"};
  std::vector<std::vector<std::string>> columns;
  for (const auto& run : runs) columns.push_back(LineageColumn(run));
  std::vector<std::string> head = {""};
  for (size_t i = 0; i < runs.size(); ++i) head.push_back(RunLabel(i));
  std::vector<std::vector<std::string>> rows;
  for (size_t f = 0; f < fields.size(); ++f) {
    rows.push_back({fields[f]});
    for (const auto& column : columns) rows.back().push_back(column[f]);
  }
  return "<section id=\"lineage\"><h2>Lineage</h2>\n" + Table(head, rows) +
         "<p class=\"note\">Per client: its shard's SHA-256 and samples, in each run's "
         "clients table.</p></section>\n";
}

// The fields whose values differ between the runs' configs.
std::string ConfigDiff(const std::vector<RunData>& runs) {
  std::vector<std::string> keys;
  std::vector<std::map<std::string, std::string>> values(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    for (auto& [key, value] : FlattenConfig(runs[i].info.config_text)) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      values[i][key] = value;
    }
  }
  std::vector<std::string> head = {"field"};
  for (size_t i = 0; i < runs.size(); ++i) head.push_back(RunLabel(i));
  std::vector<std::vector<std::string>> rows;
  for (const auto& key : keys) {
    std::set<std::string> seen;
    std::vector<std::string> row = {key};
    for (const auto& v : values) {
      auto it = v.find(key);
      row.push_back(it == v.end() ? "(unset: default)" : it->second);
      seen.insert(row.back());
    }
    if (seen.size() > 1) rows.push_back(std::move(row));
  }
  if (rows.empty()) return "<p>The runs' configs are the same, field for field.</p>\n";
  return "<p>The fields whose values differ (" + std::to_string(rows.size()) + " of " +
         std::to_string(keys.size()) + "):</p>\n" + Table(head, rows);
}

std::string ConfigSection(const std::vector<RunData>& runs) {
  std::string s = "<section id=\"config\"><h2>Configuration</h2>\n";
  if (runs.size() > 1) s += ConfigDiff(runs);
  for (size_t i = 0; i < runs.size(); ++i) {
    s += "<details><summary>" + EscapeHtml(RunLabel(i) + "'s config (" + runs[i].dir + ")") +
         "</summary><pre>" + EscapeHtml(runs[i].info.config_text) + "</pre></details>\n";
  }
  return s + "</section>\n";
}

std::string Header(const std::vector<RunData>& runs) {
  std::string title = "Cohort report:";
  for (const auto& run : runs) title += " " + run.dir;
  std::string s = "<title>" + EscapeHtml(title) + "</title>\n" + kStyle +
                  "<body>\n<h1>Cohort run report</h1>\n<ul class=\"legend runs\">";
  for (size_t i = 0; i < runs.size(); ++i) {
    s += "<li><span class=\"swatch\" style=\"background:" +
         PaletteColor(runs.size() > 1 ? static_cast<int>(i) : 0) + "\"></span>" +
         EscapeHtml(RunLabel(i) + ": " + runs[i].dir + " (" +
                    (IsDataParallel(runs[i]) ? "data-parallel" : "federated") + ", " +
                    std::to_string(runs[i].rounds.size()) + " records)") +
         "</li>";
  }
  return s + "</ul>\n";
}

}  // namespace

bool IsDataParallel(const RunData& run) {
  if (!run.rounds.empty()) return run.rounds.front().aggregation.rfind("all-reduce", 0) == 0;
  for (const auto& [key, value] : FlattenConfig(run.info.config_text)) {
    if (key == "mode") return value == "DATA_PARALLEL";
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> FlattenConfig(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> path;  // The open blocks' names, "[i]" included.
  std::map<std::string, int> seen;
  // `name` under the open blocks, "[i]" added from its second occurrence.
  auto component = [&](const std::string& name) {
    std::string prefix;
    for (const auto& p : path) prefix += p + ".";
    const int n = seen[prefix + name]++;
    return n == 0 ? name : name + "[" + std::to_string(n) + "]";
  };
  auto joined = [&](const std::string& last) {
    std::string key;
    for (const auto& p : path) key += p + ".";
    return key + last;
  };
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    line.erase(0, std::min(line.size(), line.find_first_not_of(" \t")));
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (line == "}" || line == ">") {
      if (!path.empty()) path.pop_back();
    } else if (line.back() == '{' || line.back() == '<') {
      std::string name = line.substr(0, line.size() - 1);
      while (!name.empty() && (name.back() == ' ' || name.back() == ':')) name.pop_back();
      path.push_back(component(name));
    } else if (size_t colon = line.find(':'); colon != std::string::npos) {
      const size_t v = line.find_first_not_of(' ', colon + 1);
      const std::string name = component(line.substr(0, colon));
      out.push_back({joined(name), v == std::string::npos ? "" : line.substr(v)});
    }
  }
  return out;
}

std::pair<std::string, std::string> ParticipationCategory(const store::ClientRoundRecord& c) {
  if (!c.stage.empty()) return {"left at " + c.stage, "stage:" + c.stage};
  if (c.status == "ok") return {"completed", "completed"};
  return {c.status, "status:" + c.status};
}

std::string RenderHtmlReport(const std::vector<RunData>& runs) {
  std::string page = kHead + Header(runs);
  page += LineageSection(runs) + ConfigSection(runs);
  page += "<section id=\"metrics\"><h2>Accuracy and loss</h2>\n" +
          RenderLineChart(AccuracyChart(runs)) + RenderLineChart(LossChart(runs)) + "</section>\n";
  page += "<section id=\"participation\"><h2>Participation</h2>\n" +
          RenderLineChart(ParticipationChart(runs)) + "</section>\n";
  page += "<section id=\"time\"><h2>Time and bytes</h2>\n" + RenderLineChart(RoundTimeChart(runs)) +
          RenderLineChart(BytesChart(runs)) + "</section>\n";
  for (size_t i = 0; i < runs.size(); ++i) page += internal::RunSection(runs[i], i);
  return page + "</body></html>\n";
}

}  // namespace cohort::report
