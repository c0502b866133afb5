#include "worker/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "net/metrics_endpoint.h"

namespace cohort::worker {
namespace {

using net::NewCounter;
using net::NewGauge;

const std::vector<double> kEpochBuckets = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400};

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : registry_(registry),
      epochs_(NewCounter(registry, "cohort_epochs_total", "Epochs this rank trained")),
      last_epoch_(NewGauge(registry, "cohort_last_epoch", "The last epoch trained")),
      steps_(NewCounter(registry, "cohort_steps_total", "Optimizer steps this rank took")),
      samples_(
          NewCounter(registry, "cohort_trained_samples_total", "Samples this rank trained on")),
      samples_per_second_(NewGauge(registry, "cohort_samples_per_second",
                                   "This rank's samples per second in the last epoch")),
      epoch_seconds_(&prometheus::BuildHistogram()
                          .Name("cohort_epoch_duration_seconds")
                          .Help("Seconds of one epoch on this rank")
                          .Register(registry)
                          .Add({}, kEpochBuckets)) {}

void WorkerMetrics::SetLastEpoch(uint32_t epoch) { last_epoch_->Set(epoch); }

void WorkerMetrics::RecordEpoch(uint32_t epoch, const store::RankRecord& rank) {
  epochs_->Increment();
  last_epoch_->Set(epoch);
  steps_->Increment(static_cast<double>(rank.steps));
  samples_->Increment(static_cast<double>(rank.samples));
  epoch_seconds_->Observe(rank.seconds);
  if (rank.seconds > 0) samples_per_second_->Set(rank.samples / rank.seconds);
  if (compute_seconds_ == nullptr && rank.compute_seconds + rank.comm_seconds > 0) {
    // A zero would read as "no time computing": the series appear only
    // once something measured them.
    compute_seconds_ =
        NewCounter(registry_, "cohort_compute_seconds_total",
                   "Seconds this rank spent in forward, backward and optimizer steps");
    comm_seconds_ = NewCounter(registry_, "cohort_communication_seconds_total",
                               "Seconds this rank waited in collectives (all-reduce, broadcast)");
  }
  if (compute_seconds_ != nullptr) {
    compute_seconds_->Increment(rank.compute_seconds);
    comm_seconds_->Increment(rank.comm_seconds);
  }
}

}  // namespace cohort::worker
