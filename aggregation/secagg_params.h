// Secure aggregation's parameters: the cohort, the neighbour graph's degree,
// the threshold, and the rules that choose and check them (secagg.h has the
// protocol).
#ifndef COHORT_AGGREGATION_SECAGG_PARAMS_H_
#define COHORT_AGGREGATION_SECAGG_PARAMS_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "crypto/merkle.h"
#include "crypto/prg.h"

namespace cohort::aggregation {

struct SecAggParams {
  uint32_t n = 0;     // Clients in the cohort.
  uint32_t k = 0;     // Neighbours per client (n - 1: complete graph).
  uint32_t t = 0;     // Shamir threshold.
  size_t length = 0;  // Vector length.
  crypto::MaskPrg prg = crypto::MaskPrg::kAes128Ctr;  // The mask generator.
  std::array<uint8_t, 32> context{};                  // Hash of run, round and config.
  // Merkle root over the cohort's identity keys (RosterLeaf, by index): the
  // setup carries it instead of n keys, and the context binds it.
  crypto::Digest roster{};
};

// The most corrupt neighbours of one client the parameters tolerate, for a
// cohort of n with a fraction `corrupt` colluding with the server: complete
// graph (k = n - 1): ceil(corrupt * n); sparse graph: the smallest c with
// n * P[Binomial(k, corrupt) > c] <= 2^-20, and never above ceil(corrupt * n).
uint32_t MaxCorruptNeighbours(uint32_t n, uint32_t k, double corrupt);
// floor((k + MaxCorruptNeighbours) / 2) + 1: the threshold against a
// malicious server.
uint32_t SecureThreshold(uint32_t n, uint32_t k, double corrupt);

// The documented rule for k and t: complete graph when `complete` or
// n <= 16; otherwise the smallest even k with t = SecureThreshold <= k and
// n * P[fewer than t of k neighbours survive] <= 2^-10 (dropout rate
// `dropout`; that event aborts the round); the complete graph when no
// sparse k fits.
StatusOr<SecAggParams> ChooseSecAggParams(uint32_t n, double dropout, double corrupt, bool complete,
                                          size_t length);

// A client's check of the parameters a server sent: kFailedPrecondition,
// naming what is weaker, when t is below SecureThreshold(n, k, corrupt) for
// this client's own `corrupt`, or n, k, t do not describe a graph.
Status CheckSecAggParams(uint32_t n, uint32_t k, uint32_t t, double corrupt);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_PARAMS_H_
