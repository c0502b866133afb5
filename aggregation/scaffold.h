// SCAFFOLD's control-variate arithmetic (Karimireddy et al. 2020,
// "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
// Algorithm 1 with option II), with NIID-Bench's conventions
// (experiments.py, train_net_scaffold) where the paper leaves a choice:
//   client i, K local steps of learning rate lr from the global model x to y,
//   each step the optimizer's followed by y <- y - lr (c - c_i):
//     c_i+ = c_i - c + (x - y) / (K lr)       Δc_i = c_i+ - c_i
//   server, after a round of the clients S among N:
//     c <- c + (1 / N) Σ_{i in S} Δc_i
// (the paper's (|S| / N) · mean(Δc), unweighted). The model's half, y - x,
// is averaged by sample count like any update (coordinator/
// strategy_scaffold.h).
#ifndef COHORT_AGGREGATION_SCAFFOLD_H_
#define COHORT_AGGREGATION_SCAFFOLD_H_

#include <cstdint>
#include <memory>
#include <span>

#include "aggregation/aggregator.h"
#include "common/status.h"

namespace cohort::aggregation {

// The client's half: `ci_plus` = c_i+ and `delta_c` = c_i+ - c_i, each
// computed in double from `global` (x), `local` (y), `c` and `ci` and
// rounded to float once. All six spans have one size. kInvalidArgument
// when `steps` is 0 or `learning_rate` is not > 0, or when a result is not
// finite (the outputs are then written but must not be kept).
Status ScaffoldClientVariate(std::span<const float> global, std::span<const float> local,
                             std::span<const float> c, std::span<const float> ci, uint64_t steps,
                             double learning_rate, std::span<float> ci_plus,
                             std::span<float> delta_c);

// The server's half: `c_new` = c + `sum_delta_c` / `population` (N), in
// double, rounded once. kInvalidArgument when `population` is 0 or a
// result is not finite.
Status ScaffoldServerVariate(std::span<const float> c, std::span<const double> sum_delta_c,
                             uint64_t population, std::span<float> c_new);

// A plain round's sum of SCAFFOLD updates [y - x | Δc_i] (2 num_params
// values): the first half into a sample-weighted mean as
// NewStreamingFedAvg makes it (bounded by `max_norm`, 0: none), the second
// into an unweighted sum. Finalize's delta is [weighted mean of y - x |
// Σ Δc_i]; like NewStreamingFedAvg's, it depends on the set of updates,
// never their order. Accept refuses a variate half with NaN, Inf or a
// value beyond ±kStreamingMaxValue, naming it, and leaves both sums as
// they were.
StatusOr<std::unique_ptr<Aggregator>> NewScaffoldFedAvg(size_t num_params, double max_norm);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SCAFFOLD_H_
