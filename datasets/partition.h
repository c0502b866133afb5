// Partitioners: split a dataset's sample indices over clients. All seeded;
// the same (labels, spec, seed) gives the same split everywhere.
#ifndef COHORT_DATASETS_PARTITION_H_
#define COHORT_DATASETS_PARTITION_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace cohort::datasets {

struct PartitionSpec {
  enum class Kind { kIid, kDirichlet, kShards, kQuantity };
  Kind kind = Kind::kIid;
  double alpha = 0.5;    // dirichlet, quantity.
  uint32_t classes = 2;  // shards: classes per client.
};

// Parses "iid", "dirichlet:ALPHA", "shards:K", "quantity:ALPHA".
StatusOr<PartitionSpec> ParsePartitionSpec(std::string_view text);

// Returns one sorted index list per client. Every sample goes to at most one
// client. kInvalidArgument when the split is impossible (more clients than
// samples; fewer than 10 per client for dirichlet/quantity after 1000 draws).
//
//  iid:       random permutation cut into equal parts.
//  dirichlet: per class, proportions ~ Dir(alpha) over clients; a client
//             holding >= N/K stops receiving; redrawn until each has >= 10
//             (Hsu et al. 2019, NIID-Bench).
//  shards:K:  each client holds K distinct classes (client i gets class
//             i mod C, then random others); each class is split evenly among
//             its holders (NIID-Bench "#C=k").
//  quantity:  sizes ~ Dir(alpha) over clients, redrawn until each has >= 10.
StatusOr<std::vector<std::vector<uint32_t>>> Partition(std::span<const int32_t> labels,
                                                       uint32_t num_classes, uint32_t num_clients,
                                                       const PartitionSpec& spec, uint64_t seed);

// Reads an explicit assignment: one line per client, each a whitespace-
// separated list of sample indices (as another framework's partitioner wrote
// them). Every index must be < num_samples and appear at most once overall;
// errors name the file and line. Lists are returned sorted.
StatusOr<std::vector<std::vector<uint32_t>>> ReadAssignment(const std::string& path,
                                                            size_t num_samples);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_PARTITION_H_
