#include "coordinator/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "aggregation/secagg_stage.h"

namespace cohort::coordinator {
namespace {

constexpr const char* kTrain = "train";
constexpr const char* kAggregate = "aggregate";
constexpr const char* kAborted = "aborted";
constexpr const char* kOther = "other";
constexpr const char* kSecAggProtocol = "secagg_protocol";
constexpr const char* kSampleCount = "sample_count";
constexpr const char* kInvalidUpdate = "invalid_update";
// The engine's reason for a client that changed its sample count
// (RoundEngine::HelloInRound).
constexpr std::string_view kSampleCountReason = "misbehaved: changed its sample count";

// A round takes from a fraction of a second (a small model on loopback) to
// many minutes (a large cohort at its deadline); a stage, milliseconds up.
const std::vector<double> kRoundBuckets = {0.1, 0.25, 0.5, 1,   2.5, 5,   10,
                                           30,  60,   120, 300, 600, 1800};
const std::vector<double> kStageBuckets = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5,
                                           1,     2.5,   5,    10,   30,  60,   300};

// A stored stage name as a label value: only the names the engine writes
// pass; anything else (a newer store's) is "other", so the label set stays
// bounded whatever the store holds.
std::string_view StageLabel(std::string_view stage) {
  if (stage == kTrain || stage == kAggregate) return stage;
  if (auto s = aggregation::ParseSecAggStage(stage)) return aggregation::StageName(*s);
  return kOther;
}

}  // namespace

std::string_view MisbehaviourKind(const store::ClientRoundRecord& client) {
  if (client.misbehaved) {
    return client.reason.rfind(kSampleCountReason, 0) == 0 ? kSampleCount : kSecAggProtocol;
  }
  return client.status == "rejected" ? kInvalidUpdate : "";
}

std::string_view DropoutStage(const store::RoundRecord& round,
                              const store::ClientRoundRecord& client) {
  if (auto s = aggregation::ParseSecAggStage(client.stage)) return aggregation::StageName(*s);
  return round.outcome == kAborted ? kAborted : kTrain;
}

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry, uint32_t local_epochs)
    : local_epochs_(local_epochs) {
  RegisterRounds(registry);
  RegisterClients(registry);
  RegisterTimesAndTraffic(registry);
}

void CoordinatorMetrics::RegisterRounds(prometheus::Registry& registry) {
  auto& rounds = prometheus::BuildCounter()
                     .Name("cohort_rounds_total")
                     .Help(
                         "Rounds this coordinator ended, by outcome (aborted: secure "
                         "aggregation fell below its threshold; the model is unchanged)")
                     .Register(registry);
  committed_ = &rounds.Add({{"outcome", "committed"}});
  aborted_ = &rounds.Add({{"outcome", kAborted}});
  last_round_ = &prometheus::BuildGauge()
                     .Name("cohort_last_round")
                     .Help("The last round committed (or aborted)")
                     .Register(registry)
                     .Add({});
  participants_ = &prometheus::BuildGauge()
                       .Name("cohort_round_participants")
                       .Help("Updates aggregated in the last round")
                       .Register(registry)
                       .Add({});
  selected_ = &prometheus::BuildGauge()
                   .Name("cohort_round_selected")
                   .Help("Clients selected for the last round")
                   .Register(registry)
                   .Add({});
}

void CoordinatorMetrics::RegisterClients(prometheus::Registry& registry) {
  updates_ = &prometheus::BuildCounter()
                  .Name("cohort_updates_aggregated_total")
                  .Help("Client updates aggregated into the model")
                  .Register(registry)
                  .Add({});
  auto& dropouts = prometheus::BuildCounter()
                       .Name("cohort_dropouts_total")
                       .Help(
                           "Selected clients that did not count in their round, by the stage "
                           "they left at (train: a plain round's, or before any stage)")
                       .Register(registry);
  for (aggregation::SecAggStage s : aggregation::kSecAggStages) {
    dropouts_[aggregation::StageName(s)] = &dropouts.Add({{"stage", aggregation::StageName(s)}});
  }
  for (const char* stage : {kTrain, kAborted}) dropouts_[stage] = &dropouts.Add({{"stage", stage}});
  auto& misbehaviour = prometheus::BuildCounter()
                           .Name("cohort_misbehaviour_total")
                           .Help("Clients caught misbehaving or refused in a round, by kind")
                           .Register(registry);
  for (const char* kind : {kSecAggProtocol, kSampleCount, kInvalidUpdate}) {
    misbehaviour_[kind] = &misbehaviour.Add({{"kind", kind}});
  }
}

void CoordinatorMetrics::RegisterTimesAndTraffic(prometheus::Registry& registry) {
  round_seconds_ = &prometheus::BuildHistogram()
                        .Name("cohort_round_duration_seconds")
                        .Help("Round wall time, tasks sent to commit")
                        .Register(registry)
                        .Add({}, kRoundBuckets);
  stage_seconds_ = &prometheus::BuildHistogram()
                        .Name("cohort_stage_duration_seconds")
                        .Help("Seconds of each stage of a round at the coordinator")
                        .Register(registry);
  received_bytes_ = &prometheus::BuildCounter()
                         .Name("cohort_received_bytes_total")
                         .Help(
                             "Bytes of round messages the coordinator received (headers and "
                             "payloads)")
                         .Register(registry)
                         .Add({});
  sent_bytes_ = &prometheus::BuildCounter()
                     .Name("cohort_sent_bytes_total")
                     .Help("Bytes of round messages the coordinator sent (headers and payloads)")
                     .Register(registry)
                     .Add({});
  samples_per_second_ = &prometheus::BuildGauge()
                             .Name("cohort_samples_per_second")
                             .Help(
                                 "The last committed round's training samples (its clients' "
                                 "samples x local epochs) per second of the round")
                             .Register(registry)
                             .Add({});
}

void CoordinatorMetrics::SetLastRound(uint32_t round) { last_round_->Set(round); }

void CoordinatorMetrics::RecordRound(const store::RoundRecord& round,
                                     const std::vector<store::ClientRoundRecord>& clients) {
  const bool committed = round.outcome != kAborted;
  (committed ? committed_ : aborted_)->Increment();
  last_round_->Set(round.round);
  participants_->Set(round.participants);
  selected_->Set(round.selected);
  if (committed) updates_->Increment(round.participants);
  round_seconds_->Observe(round.seconds);
  uint64_t samples = 0;
  for (const store::ClientRoundRecord& c : clients) {
    if (c.status == "ok") {
      samples += c.num_samples;
    } else {
      dropouts_.find(DropoutStage(round, c))->second->Increment();
    }
    const std::string_view kind = MisbehaviourKind(c);
    if (!kind.empty()) misbehaviour_.find(kind)->second->Increment();
  }
  if (committed && round.seconds > 0) {
    samples_per_second_->Set(static_cast<double>(samples) * local_epochs_ / round.seconds);
  }
  RecordStages(round);
}

void CoordinatorMetrics::RecordStages(const store::RoundRecord& round) {
  for (const store::StageRecord& s : round.stages) {
    const std::string_view label = StageLabel(s.stage);
    auto it = stage_histograms_.find(label);
    if (it == stage_histograms_.end()) {
      const std::string name(label);
      it = stage_histograms_.emplace(name, &stage_seconds_->Add({{"stage", name}}, kStageBuckets))
               .first;
    }
    it->second->Observe(s.seconds);
    received_bytes_->Increment(static_cast<double>(s.bytes_in));
    sent_bytes_->Increment(static_cast<double>(s.bytes_out));
  }
}

}  // namespace cohort::coordinator
