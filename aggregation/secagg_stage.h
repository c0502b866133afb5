// The stages of one secure-aggregation round (aggregation/secagg.h), in
// protocol order, and their names: the one place a stage is named. The
// round engine, the client session's fault injection, the simulator, the
// store's dropped-at column and the run summary all use these.
#ifndef COHORT_AGGREGATION_SECAGG_STAGE_H_
#define COHORT_AGGREGATION_SECAGG_STAGE_H_

#include <array>
#include <optional>
#include <string_view>

namespace cohort::aggregation {

enum class SecAggStage {
  kNone = 0,  // No secure round in progress (or none answered yet).
  kCommitSeed,
  kAdvertiseKeys,
  kShareKeys,
  kCheckShares,
  kConfirmChecked,
  kMaskedInput,
  kConsistency,
  kUnmasking,
};

// Every stage of a round, in order (kNone excluded).
inline constexpr std::array<SecAggStage, 8> kSecAggStages = {
    SecAggStage::kCommitSeed,  SecAggStage::kAdvertiseKeys,  SecAggStage::kShareKeys,
    SecAggStage::kCheckShares, SecAggStage::kConfirmChecked, SecAggStage::kMaskedInput,
    SecAggStage::kConsistency, SecAggStage::kUnmasking};

// The stage's name as logs, the store and --fault-stage write it; "" for kNone.
constexpr const char* StageName(SecAggStage stage) {
  switch (stage) {
    case SecAggStage::kNone:
      return "";
    case SecAggStage::kCommitSeed:
      return "commit_seed";
    case SecAggStage::kAdvertiseKeys:
      return "advertise_keys";
    case SecAggStage::kShareKeys:
      return "share_keys";
    case SecAggStage::kCheckShares:
      return "check_shares";
    case SecAggStage::kConfirmChecked:
      return "confirm_checked";
    case SecAggStage::kMaskedInput:
      return "masked_input";
    case SecAggStage::kConsistency:
      return "consistency";
    case SecAggStage::kUnmasking:
      return "unmasking";
  }
  return "";
}

// The stage named `name`; nullopt for any other string (kNone has no name).
constexpr std::optional<SecAggStage> ParseSecAggStage(std::string_view name) {
  for (SecAggStage s : kSecAggStages) {
    if (std::string_view(StageName(s)) == name) return s;
  }
  return std::nullopt;
}

// The stage after `stage` (kUnmasking has none: itself).
constexpr SecAggStage NextStage(SecAggStage stage) {
  return stage == SecAggStage::kUnmasking ? stage
                                          : static_cast<SecAggStage>(static_cast<int>(stage) + 1);
}
// The stage before `stage` (kNone before the first).
constexpr SecAggStage PreviousStage(SecAggStage stage) {
  return stage == SecAggStage::kNone ? stage
                                     : static_cast<SecAggStage>(static_cast<int>(stage) - 1);
}

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_STAGE_H_
