// The coordinator's Prometheus metrics (--metrics-addr), derived from each
// round's records as the store keeps them: the daemon hands every round the
// engine commits (RoundEngine::TakeCommitted) and its clients' records
// (RunStore::ClientRounds) to RecordRound. The engine itself never sees a
// metric. Counters count this process's rounds (they start at 0 in a
// resumed coordinator, as Prometheus expects of a restart).
//
// Families (labels take only the fixed values listed):
//   cohort_rounds_total{outcome="committed"|"aborted"}      counter
//   cohort_last_round                                        gauge
//   cohort_round_participants, cohort_round_selected         gauge (last round)
//   cohort_updates_aggregated_total                          counter
//   cohort_dropouts_total{stage}                             counter
//       stage: a secure-aggregation stage (aggregation/secagg_stage.h),
//       "train" (a plain round, or before any stage), "aborted" (still in
//       when the round was aborted)
//   cohort_misbehaviour_total{kind}                          counter
//       kind: "secagg_protocol" (proved by secure aggregation: a forged
//       share, a false complaint, a bad signature), "sample_count" (changed
//       its sample count during a round), "invalid_update" (an update or
//       message refused: wrong size, not finite, malformed)
//   cohort_round_duration_seconds                            histogram
//   cohort_stage_duration_seconds{stage}                     histogram
//       stage: a secure-aggregation stage, "train", "aggregate", "other"
//   cohort_received_bytes_total, cohort_sent_bytes_total     counter
//   cohort_samples_per_second                                gauge (last
//       committed round: its clients' samples x local epochs / its seconds)
#ifndef COHORT_COORDINATOR_METRICS_H_
#define COHORT_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "store/run_store.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace cohort::coordinator {

// The cohort_misbehaviour_total kind of a client's round record, or ""
// when it shows none. Every kind is one of the three above.
std::string_view MisbehaviourKind(const store::ClientRoundRecord& client);
// The cohort_dropouts_total stage of a record that did not count in its
// round (status "dropped" or "rejected").
std::string_view DropoutStage(const store::RoundRecord& round,
                              const store::ClientRoundRecord& client);

// Not thread-safe (one daemon thread calls it); the endpoint's threads
// read the registry meanwhile, which prometheus-cpp allows.
class CoordinatorMetrics {
 public:
  // Registers the families in `registry` (not owned; must outlive this),
  // every fixed label value at 0. `local_epochs` is train.local_epochs.
  CoordinatorMetrics(prometheus::Registry& registry, uint32_t local_epochs);
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // The last committed round before this process's first (a resumed run).
  void SetLastRound(uint32_t round);
  // One round as committed (or aborted), with its clients' records.
  void RecordRound(const store::RoundRecord& round,
                   const std::vector<store::ClientRoundRecord>& clients);

 private:
  // The constructor's families: rounds, clients, and times and bytes.
  void RegisterRounds(prometheus::Registry& registry);
  void RegisterClients(prometheus::Registry& registry);
  void RegisterTimesAndTraffic(prometheus::Registry& registry);
  void RecordStages(const store::RoundRecord& round);

  uint32_t local_epochs_;
  prometheus::Counter* committed_;
  prometheus::Counter* aborted_;
  prometheus::Gauge* last_round_;
  prometheus::Gauge* participants_;
  prometheus::Gauge* selected_;
  prometheus::Counter* updates_;
  std::map<std::string, prometheus::Counter*, std::less<>> dropouts_;
  std::map<std::string, prometheus::Counter*, std::less<>> misbehaviour_;
  prometheus::Histogram* round_seconds_;
  prometheus::Family<prometheus::Histogram>* stage_seconds_;
  std::map<std::string, prometheus::Histogram*, std::less<>> stage_histograms_;
  prometheus::Counter* received_bytes_;
  prometheus::Counter* sent_bytes_;
  prometheus::Gauge* samples_per_second_;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_METRICS_H_
