#include "client/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "net/metrics_endpoint.h"

namespace cohort::client {
namespace {

using net::NewCounter;
using net::NewGauge;

// Local training: well under a second (a small shard) to an hour.
const std::vector<double> kTrainBuckets = {0.01, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                           5,    10,   30,  60,   300, 900, 3600};

}  // namespace

ClientMetrics::ClientMetrics(prometheus::Registry& registry)
    : rounds_(NewCounter(registry, "cohort_rounds_trained_total",
                         "Rounds whose task this client trained to the end")),
      last_round_(NewGauge(registry, "cohort_last_trained_round", "The last round trained")),
      train_seconds_(&prometheus::BuildHistogram()
                          .Name("cohort_train_duration_seconds")
                          .Help("Seconds of one round's local training")
                          .Register(registry)
                          .Add({}, kTrainBuckets)),
      samples_(NewCounter(registry, "cohort_trained_samples_total",
                          "Samples trained on (local epochs x shard samples, per round)")),
      samples_per_second_(NewGauge(registry, "cohort_samples_per_second",
                                   "The last round's training samples per second")),
      received_(NewCounter(registry, "cohort_received_bytes_total",
                           "Bytes of the messages received from the coordinator (headers and "
                           "payloads)")),
      sent_(NewCounter(registry, "cohort_sent_bytes_total",
                       "Bytes of the messages sent to the coordinator (headers and payloads)")) {}

void ClientMetrics::RecordTraining(uint32_t round, const train::TrainResult& result) {
  rounds_->Increment();
  last_round_->Set(round);
  train_seconds_->Observe(result.seconds);
  samples_->Increment(static_cast<double>(result.samples));
  if (result.seconds > 0) samples_per_second_->Set(result.samples / result.seconds);
}

void ClientMetrics::AddReceived(uint64_t bytes) {
  received_->Increment(static_cast<double>(bytes));
}

void ClientMetrics::AddSent(uint64_t bytes) { sent_->Increment(static_cast<double>(bytes)); }

}  // namespace cohort::client
