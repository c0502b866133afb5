// The ranks of a data-parallel run, from RoundRecord::ranks.
#include <map>

#include "report/sections.h"
#include "report/svg.h"

namespace cohort::report::internal {
namespace {

// One rank's records summed over the epochs.
struct RankTotals {
  std::string device;
  uint64_t steps = 0, samples = 0;
  double compute = 0, comm = 0, seconds = 0;
  double Other() const { return seconds - compute - comm > 0 ? seconds - compute - comm : 0; }
};

std::map<uint32_t, RankTotals> Totals(const RunData& run) {
  std::map<uint32_t, RankTotals> out;
  for (const auto& r : run.rounds) {
    for (const auto& k : r.ranks) {
      RankTotals& t = out[k.rank];
      if (!k.device.empty()) t.device = k.device;
      t.steps += k.steps;
      t.samples += k.samples;
      t.compute += k.compute_seconds;
      t.comm += k.comm_seconds;
      t.seconds += k.seconds;
    }
  }
  return out;
}

LineChart ThroughputChart(const RunData& run, size_t index) {
  LineChart chart{"rank-throughput", "Samples per second, per rank", "epoch", "samples/s"};
  chart.unit = Unit::kPerSecond;
  std::map<uint32_t, LineSeries> series;
  for (const auto& r : run.rounds) {
    for (const auto& k : r.ranks) {
      LineSeries& s = series[k.rank];
      if (s.id.empty()) {
        s.id = "rank-" + std::to_string(k.rank);
        s.name = "rank " + std::to_string(k.rank);
        s.run = static_cast<int>(index);
        s.color = static_cast<int>(k.rank);
      }
      if (k.seconds > 0) s.points.push_back({r.round, k.samples / k.seconds});
    }
  }
  for (auto& [rank, s] : series) chart.series.push_back(std::move(s));
  chart.empty_text = "No per-rank timings in this store (older stores did not record them).";
  chart.note = "A rank's samples over its whole epoch's seconds.";
  return chart;
}

BarChart SplitChart(const std::map<uint32_t, RankTotals>& totals, size_t index) {
  BarChart chart{"rank-time", static_cast<int>(index),
                 "Compute against communication, per rank (all epochs)", "rank", "seconds"};
  chart.unit = Unit::kSeconds;
  chart.stacks = {{"compute", "compute (forward, backward, optimizer step)", {}},
                  {"comm", "communication (waiting in collectives)", {}},
                  {"other", "other (data, evaluation, the rest of the epoch)", {}}};
  for (const auto& [rank, t] : totals) {
    chart.categories.push_back("rank " + std::to_string(rank));
    chart.stacks[0].values.push_back(t.compute);
    chart.stacks[1].values.push_back(t.comm);
    chart.stacks[2].values.push_back(t.Other());
  }
  chart.empty_text = "No per-rank timings in this store (older stores did not record them).";
  return chart;
}

std::string RankTable(const std::map<uint32_t, RankTotals>& totals) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& [rank, t] : totals) {
    const double busy = t.compute + t.comm;
    rows.push_back({std::to_string(rank), t.device.empty() ? "(not recorded)" : t.device,
                    std::to_string(t.steps), std::to_string(t.samples), Format("%.3f", t.compute),
                    Format("%.3f", t.comm), Format("%.3f", t.seconds),
                    t.seconds > 0 ? Format("%.0f", t.samples / t.seconds) : "-",
                    busy > 0 ? Format("%.1f %%", 100 * t.comm / busy) : "-"});
  }
  if (rows.empty()) return "";
  return Table({"rank", "device", "steps", "samples", "compute s", "communication s", "epoch s",
                "samples/s", "communication share"},
               rows);
}

}  // namespace

std::string RanksPart(const RunData& run, size_t index) {
  const auto totals = Totals(run);
  return "<h3>Ranks</h3>\n" + RenderLineChart(ThroughputChart(run, index)) +
         RenderBarChart(SplitChart(totals, index)) + RankTable(totals);
}

}  // namespace cohort::report::internal
