// Byzantine-robust aggregation for plain rounds (server.robust in the
// config): the round's aggregate is a rule over every client's update
// instead of their weighted mean. Each rule needs the updates themselves,
// not a running sum, so the hub keeps them all until the round closes
// (cohort x model floats), and none can run under secure aggregation, where
// the hub sees only the sum: the config validator refuses that mix.
//
// The rules are plain functions over spans (robust_test.cc checks each
// against a hand computation); NewRobustAggregator buffers a round's
// updates behind the Aggregator interface and applies one when the round
// closes. Every rule is deterministic in the set of updates: the aggregator
// orders them by participant index, never by arrival.
#ifndef COHORT_AGGREGATION_ROBUST_H_
#define COHORT_AGGREGATION_ROBUST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "aggregation/aggregator.h"
#include "common/status.h"

namespace cohort::aggregation {

enum class RobustRule { kMedian, kTrimmedMean, kKrum, kMultiKrum, kBulyan };
// The config's name of `rule` (MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM,
// BULYAN).
const char* RobustRuleName(RobustRule rule);

struct RobustOptions {
  RobustRule rule = RobustRule::kMedian;
  float trim_fraction = 0;    // kTrimmedMean: cut from each end, in [0, 0.5).
  uint32_t byzantine = 0;     // f: kKrum, kMultiKrum, kBulyan.
  uint32_t multi_krum_m = 0;  // kMultiKrum: updates averaged; 0: n - f.
};

// The updates of a round, each of the same size as the rule's `out`.
using Updates = std::span<const std::span<const float>>;

// The coordinate-wise median (of an even count, the mean of the middle two),
// unweighted. `updates` is not empty.
void CoordinateMedian(Updates updates, std::span<float> out);
// Per coordinate, the unweighted mean after cutting k = floor(trim_fraction
// x n) values from each end, trim_fraction as the config wrote it
// (common/decimal.h; k < n / 2 always). `updates` is not empty.
void TrimmedMean(Updates updates, float trim_fraction, std::span<float> out);

// Krum's score of each update (Blanchard et al. 2017): the sum of its
// squared L2 distances to its max(1, n - f - 2) nearest other updates (all
// of them, when there are fewer).
std::vector<double> KrumScores(Updates updates, uint32_t f);
// The indices of the `m` updates with the lowest Krum scores, lowest first
// (ties: the lower index). Krum is m = 1; Multi-Krum averages them,
// unweighted (Blanchard et al.): a selected update's claimed sample count
// would otherwise let it outweigh the rest.
std::vector<size_t> KrumSelect(Updates updates, uint32_t f, size_t m);
// Bulyan's selection (El Mhamdi et al. 2018): theta = n - 2f updates picked
// one at a time, each Krum's choice among those not yet picked (scored
// within them), in the order picked.
std::vector<size_t> BulyanSelect(Updates updates, uint32_t f);
// Bulyan's aggregation of the `selected` updates (theta of them): per
// coordinate, the mean of the beta = theta - 2f values nearest the
// coordinate's median (ties: the earlier update). beta >= 1.
void BulyanTrimmedMean(Updates selected, uint32_t f, std::span<float> out);

// The fewest updates `options` takes: 1 for MEDIAN and TRIMMED_MEAN,
// 2f + 3 for KRUM and MULTI_KRUM, 4f + 3 for BULYAN.
size_t RobustMinUpdates(const RobustOptions& options);
// options.rule over `updates` into `out`. Every rule is unweighted: the
// sample counts clients claim never move a robust aggregate.
// kFailedPrecondition, saying why, for fewer updates than RobustMinUpdates
// or a Multi-Krum m above n - f.
Status ApplyRobustRule(const RobustOptions& options, Updates updates, std::span<float> out);

// A plain round's Aggregator that keeps every accepted update and applies
// options.rule at Finalize. Accept refuses what NewStreamingFedAvg refuses
// (a wrong length, a weight outside [1, 2^40] although no rule uses it, NaN or Inf, an L2 norm
// above `max_norm` when it is > 0, a second update), with the same messages; Finalize fails
// (kFailedPrecondition, the reason) when the rule cannot run on the accepted updates: the round
// engine then aborts the round with it.
StatusOr<std::unique_ptr<Aggregator>> NewRobustAggregator(const RobustOptions& options,
                                                          size_t num_params, double max_norm = 0);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_ROBUST_H_
