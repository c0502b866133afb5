// A data-parallel rank's Prometheus metrics (cohort worker --metrics-addr):
// its epochs, steps and speed, and where its time went. RunWorker records
// each epoch as this rank saw it (a store::RankRecord); every rank serves
// its own.
//
// Families:
//   cohort_epochs_total                    counter
//   cohort_last_epoch                      gauge
//   cohort_steps_total                     counter: this rank's optimizer steps
//   cohort_trained_samples_total           counter: this rank's samples
//   cohort_samples_per_second              gauge: the last epoch's, this rank's
//   cohort_epoch_duration_seconds          histogram
//   cohort_compute_seconds_total,          counter: forward, backward, step;
//   cohort_communication_seconds_total              waiting in collectives
//       (exposed once an epoch has measured them: RankRecord's figures)
#ifndef COHORT_WORKER_METRICS_H_
#define COHORT_WORKER_METRICS_H_

#include <cstdint>

#include "store/run_store.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace cohort::worker {

// Not thread-safe (the rank's thread calls it); the endpoint's threads read
// the registry meanwhile, which prometheus-cpp allows.
class WorkerMetrics {
 public:
  // Registers the families in `registry` (not owned; must outlive this).
  explicit WorkerMetrics(prometheus::Registry& registry);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // The epoch the run resumes after.
  void SetLastEpoch(uint32_t epoch);
  // Epoch `epoch` as this rank trained it.
  void RecordEpoch(uint32_t epoch, const store::RankRecord& rank);

 private:
  prometheus::Registry& registry_;
  prometheus::Counter* epochs_;
  prometheus::Gauge* last_epoch_;
  prometheus::Counter* steps_;
  prometheus::Counter* samples_;
  prometheus::Gauge* samples_per_second_;
  prometheus::Histogram* epoch_seconds_;
  // Null until an epoch measured them.
  prometheus::Counter* compute_seconds_ = nullptr;
  prometheus::Counter* comm_seconds_ = nullptr;
};

}  // namespace cohort::worker

#endif  // COHORT_WORKER_METRICS_H_
