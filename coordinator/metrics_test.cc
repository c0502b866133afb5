#include "coordinator/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>

namespace cohort::coordinator {
namespace {

// The registry as a scraper reads it (the text exposition format).
std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// The value of `series` ("name{label=\"v\"}" as exposed) in `text`; NaN
// when the series is not there.
double Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nan("");
}

store::ClientRoundRecord Client(std::string name, std::string status, uint64_t samples,
                                std::string stage = "", std::string reason = "",
                                bool misbehaved = false) {
  store::ClientRoundRecord c;
  c.client = std::move(name);
  c.status = std::move(status);
  c.num_samples = samples;
  c.stage = std::move(stage);
  c.reason = std::move(reason);
  c.misbehaved = misbehaved;
  return c;
}

store::RoundRecord SecureRound() {
  store::RoundRecord r;
  r.round = 4;
  r.aggregation = "secagg+";
  r.participants = 3;
  r.selected = 5;
  r.dropped = 2;
  r.seconds = 2.0;
  r.stages = {{"advertise_keys", 0.25, 1000, 5000},
              {"masked_input", 1.5, 80000, 200},
              {"aggregate", 0.004, 0, 0}};
  return r;
}

std::vector<store::ClientRoundRecord> SecureClients() {
  return {Client("a", "ok", 100), Client("b", "ok", 300),
          // Left after its masked input: counts, no dropout.
          Client("c", "ok", 200, "consistency", "left during consistency: gone"),
          Client("d", "dropped", 50, "share_keys", "timed out"),
          Client("e", "rejected", 70, "check_shares", "misbehaved: filed a false complaint", true)};
}

TEST(CoordinatorMetricsTest, ASecureRoundsRecordsBecomeItsSeries) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry, /*local_epochs=*/2);
  metrics.SetLastRound(3);
  EXPECT_EQ(Value(Scrape(registry), "cohort_last_round"), 3);
  metrics.RecordRound(SecureRound(), SecureClients());
  const std::string text = Scrape(registry);
  EXPECT_EQ(Value(text, "cohort_rounds_total{outcome=\"committed\"}"), 1) << text;
  EXPECT_EQ(Value(text, "cohort_rounds_total{outcome=\"aborted\"}"), 0);
  EXPECT_EQ(Value(text, "cohort_last_round"), 4);
  EXPECT_EQ(Value(text, "cohort_round_participants"), 3);
  EXPECT_EQ(Value(text, "cohort_round_selected"), 5);
  EXPECT_EQ(Value(text, "cohort_updates_aggregated_total"), 3);
  // Every stage's series is there from the start, 0 where nobody left.
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"share_keys\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"check_shares\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"consistency\"}"), 0);
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"train\"}"), 0);
  EXPECT_EQ(Value(text, "cohort_misbehaviour_total{kind=\"secagg_protocol\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_misbehaviour_total{kind=\"invalid_update\"}"), 0);
  EXPECT_EQ(Value(text, "cohort_round_duration_seconds_count"), 1);
  EXPECT_EQ(Value(text, "cohort_round_duration_seconds_sum"), 2.0);
  EXPECT_EQ(Value(text, "cohort_round_duration_seconds_bucket{le=\"1\"}"), 0);
  EXPECT_EQ(Value(text, "cohort_round_duration_seconds_bucket{le=\"2.5\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_stage_duration_seconds_sum{stage=\"masked_input\"}"), 1.5);
  EXPECT_EQ(Value(text, "cohort_stage_duration_seconds_count{stage=\"advertise_keys\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_stage_duration_seconds_count{stage=\"aggregate\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_received_bytes_total"), 81000);
  EXPECT_EQ(Value(text, "cohort_sent_bytes_total"), 5200);
  // (100 + 300 + 200) samples x 2 epochs in 2 s.
  EXPECT_EQ(Value(text, "cohort_samples_per_second"), 600);
  EXPECT_NE(text.find("# TYPE cohort_stage_duration_seconds histogram"), std::string::npos);
}

TEST(CoordinatorMetricsTest, AnAbortedRoundCountsItsClientsAsDroppedAtTheAbort) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry, 1);
  metrics.RecordRound(SecureRound(), SecureClients());
  store::RoundRecord aborted = SecureRound();
  aborted.round = 5;
  aborted.outcome = "aborted";
  aborted.outcome_reason = "too few clients at unmasking";
  aborted.participants = 0;
  aborted.stages.clear();
  metrics.RecordRound(aborted, {Client("a", "dropped", 100, "", "round aborted: too few"),
                                Client("d", "dropped", 50, "unmasking", "timed out")});
  const std::string text = Scrape(registry);
  EXPECT_EQ(Value(text, "cohort_rounds_total{outcome=\"committed\"}"), 1) << text;
  EXPECT_EQ(Value(text, "cohort_rounds_total{outcome=\"aborted\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_last_round"), 5);
  EXPECT_EQ(Value(text, "cohort_round_participants"), 0);
  EXPECT_EQ(Value(text, "cohort_updates_aggregated_total"), 3);  // Round 4's only.
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"aborted\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"unmasking\"}"), 1);
  // An aborted round trained nothing into the model: the last committed
  // round's rate stays.
  EXPECT_EQ(Value(text, "cohort_samples_per_second"), 300);
}

TEST(CoordinatorMetricsTest, PlainRoundsDropAtTrainAndNameEachKindOfMisbehaviour) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry, 1);
  store::RoundRecord r;
  r.round = 1;
  r.participants = 1;
  r.selected = 4;
  r.seconds = 0.5;
  r.stages = {{"train", 0.4, 700, 900}, {"a stage from a newer store", 0.1, 1, 2}};
  metrics.RecordRound(
      r, {Client("a", "ok", 10), Client("b", "dropped", 10, "", "no update before the deadline"),
          Client("c", "rejected", 10, "", "update has 7 values, expected 9"),
          Client("d", "rejected", 10, "",
                 "misbehaved: changed its sample count from 10 to 1000 during the round", true)});
  const std::string text = Scrape(registry);
  EXPECT_EQ(Value(text, "cohort_dropouts_total{stage=\"train\"}"), 3) << text;
  EXPECT_EQ(Value(text, "cohort_misbehaviour_total{kind=\"invalid_update\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_misbehaviour_total{kind=\"sample_count\"}"), 1);
  EXPECT_EQ(Value(text, "cohort_misbehaviour_total{kind=\"secagg_protocol\"}"), 0);
  EXPECT_EQ(Value(text, "cohort_stage_duration_seconds_count{stage=\"train\"}"), 1);
  // A stage name the engine does not write never becomes a label value.
  EXPECT_EQ(Value(text, "cohort_stage_duration_seconds_count{stage=\"other\"}"), 1);
  EXPECT_EQ(text.find("newer store"), std::string::npos);
  EXPECT_EQ(Value(text, "cohort_received_bytes_total"), 701);
  EXPECT_EQ(Value(text, "cohort_samples_per_second"), 20);
}

TEST(CoordinatorMetricsTest, LabelsNeverCarryClientNamesOrReasons) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry, 1);
  metrics.RecordRound(SecureRound(), SecureClients());
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find("false complaint"), std::string::npos);
  EXPECT_EQ(text.find("client=\""), std::string::npos);
  // 8 secure-aggregation stages, train and aborted.
  size_t series = 0;
  for (size_t at = 0; (at = text.find("\ncohort_dropouts_total{", at)) != std::string::npos; ++at) {
    ++series;
  }
  EXPECT_EQ(series, 10u);
}

}  // namespace
}  // namespace cohort::coordinator
