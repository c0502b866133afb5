// The clipped sum of central differential privacy (DP-FedAvg, McMahan et al.
// 2018; coordinator/strategy_dp.h adds the noise): every update is scaled
// down to L2 norm at most `clip_norm`, the clipped updates are summed with
// equal weights (the sample counts the engine passes are ignored: with
// weights, one client's share of the sum would not be bounded by the clip),
// and the sum is divided by the fixed `denominator` (the round's cohort
// size) however many updates arrive. So one client moves the result by at
// most clip_norm / denominator in L2, whatever it sends.
#ifndef COHORT_AGGREGATION_CLIPPED_SUM_H_
#define COHORT_AGGREGATION_CLIPPED_SUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "aggregation/aggregator.h"

namespace cohort::aggregation {

// The sum is NewStreamingFedAvg's exact one (order-independent, bit for bit),
// so a replayed round gives the same result. An update longer than
// clip_norm x (1 - 2^-20) is scaled to that length, so float rounding never
// takes it past the clip; a shorter one is summed as it is.
// No update is refused for its length (server.max_update_norm does not
// apply): a refusal that left a round short would abort it, and whether a
// round commits would then hinge on one client's update, which the released
// models show. kInvalidArgument for a clip_norm that is not finite and > 0,
// a denominator of 0 or no parameters.
StatusOr<std::unique_ptr<Aggregator>> NewClippedSum(size_t num_params, double clip_norm,
                                                    uint32_t denominator);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_CLIPPED_SUM_H_
