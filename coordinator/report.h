// How a committed round is shown: the line the coordinator (and the
// simulator) prints per round, and the JSON object of `cohort status --json`
// (and `cohort simulate --json`).
#ifndef COHORT_COORDINATOR_REPORT_H_
#define COHORT_COORDINATOR_REPORT_H_

#include <string>
#include <vector>

#include "store/run_store.h"

namespace cohort::coordinator {

// "round   3/10  clients 10/10  dropped 0  train_loss ...", on stdout.
void PrintRound(const store::RoundRecord& r, uint32_t total);

// One JSON object: the record, and from its clients' records who dropped,
// at which secure-aggregation stage, and who was caught misbehaving.
std::string RoundJson(const store::RoundRecord& r,
                      const std::vector<store::ClientRoundRecord>& clients);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_REPORT_H_
