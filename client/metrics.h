// The client daemon's Prometheus metrics (--metrics-addr): its own rounds,
// the bytes it exchanged with the coordinator and its training speed. The
// daemon records them; the session (sans-I/O) never sees a metric.
//
// Families:
//   cohort_rounds_trained_total       counter: tasks trained to the end
//   cohort_last_trained_round         gauge
//   cohort_train_duration_seconds     histogram: one local training job
//   cohort_trained_samples_total      counter: samples seen (epochs x shard)
//   cohort_samples_per_second         gauge: the last job's
//   cohort_received_bytes_total,      counter: every message from / to the
//   cohort_sent_bytes_total                    coordinator, headers and payloads
#ifndef COHORT_CLIENT_METRICS_H_
#define COHORT_CLIENT_METRICS_H_

#include <cstdint>

#include "train/trainer.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace cohort::client {

// Not thread-safe (the daemon's loop calls it); the endpoint's threads read
// the registry meanwhile, which prometheus-cpp allows.
class ClientMetrics {
 public:
  // Registers the families in `registry` (not owned; must outlive this).
  explicit ClientMetrics(prometheus::Registry& registry);
  ClientMetrics(const ClientMetrics&) = delete;
  ClientMetrics& operator=(const ClientMetrics&) = delete;

  // Round `round`'s training job finished with `result`.
  void RecordTraining(uint32_t round, const train::TrainResult& result);
  void AddReceived(uint64_t bytes);
  void AddSent(uint64_t bytes);

 private:
  prometheus::Counter* rounds_;
  prometheus::Gauge* last_round_;
  prometheus::Histogram* train_seconds_;
  prometheus::Counter* samples_;
  prometheus::Gauge* samples_per_second_;
  prometheus::Counter* received_;
  prometheus::Counter* sent_;
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_METRICS_H_
