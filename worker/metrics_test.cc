#include "worker/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace cohort::worker {
namespace {

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

store::RankRecord Epoch(double compute, double comm) {
  store::RankRecord rank;
  rank.rank = 1;
  rank.steps = 19;
  rank.samples = 150;
  rank.seconds = 0.5;
  rank.compute_seconds = compute;
  rank.comm_seconds = comm;
  return rank;
}

TEST(WorkerMetricsTest, EpochsAddUpAndTheLastSetsTheRate) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  metrics.SetLastEpoch(2);
  metrics.RecordEpoch(3, Epoch(0, 0));
  store::RankRecord slower = Epoch(0, 0);
  slower.seconds = 1.5;
  metrics.RecordEpoch(4, slower);
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("\ncohort_epochs_total 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ncohort_last_epoch 4\n"), std::string::npos);
  EXPECT_NE(text.find("\ncohort_steps_total 38\n"), std::string::npos);
  EXPECT_NE(text.find("\ncohort_trained_samples_total 300\n"), std::string::npos);
  EXPECT_NE(text.find("\ncohort_samples_per_second 100\n"), std::string::npos);
  EXPECT_NE(text.find("\ncohort_epoch_duration_seconds_sum 2\n"), std::string::npos);
}

TEST(WorkerMetricsTest, ComputeAndCommunicationAppearOnlyOnceMeasured) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  metrics.RecordEpoch(1, Epoch(0, 0));
  // Nothing measured them: no series that would read "no time at all".
  EXPECT_EQ(Scrape(registry).find("cohort_compute_seconds_total"), std::string::npos);
  metrics.RecordEpoch(2, Epoch(0.375, 0.125));
  metrics.RecordEpoch(3, Epoch(0.25, 0.25));
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("\ncohort_compute_seconds_total 0.625\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ncohort_communication_seconds_total 0.375\n"), std::string::npos);
}

}  // namespace
}  // namespace cohort::worker
