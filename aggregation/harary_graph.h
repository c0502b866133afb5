// The neighbour graph of SecAgg+ (Bell et al., CCS 2020): the k-regular
// Harary graph H(k, n), clients placed on its ring by a keyed permutation.
// Client `index` sits at ring position Position(index) and is adjacent to
// the clients within k/2 positions either side.
//
// The permutation is a small Feistel network over [0, 2^b) with b even and
// 2^b >= n, walked in cycles until it lands in [0, n); its rounds are
// SipHash-2-4 under the key. So one client's neighbours cost O(k)
// evaluations and no party has to build the whole graph to know its own
// place: a client of a cohort of 10,000 holds k numbers, not 10,000 lists.
// With k + 1 >= n the graph is complete and the permutation is not used.
//
// An approximation: Feistel networks on small halves reach only even
// permutations, and six rounds only a part of those, so for small n the
// placement is not uniformly random, as the 2^-20 bound in
// MaxCorruptNeighbours assumes. Next to what grinding the advert root gives
// a coordinator (docs/architecture.md, "try many graph seeds") the bias is
// small; a keyed shuffle for n <= 2^16 would remove it at O(n) a client.
#ifndef COHORT_AGGREGATION_HARARY_GRAPH_H_
#define COHORT_AGGREGATION_HARARY_GRAPH_H_

#include <array>
#include <cstdint>
#include <vector>

namespace cohort::aggregation {

using GraphKey = std::array<uint8_t, 16>;

class HararyGraph {
 public:
  // n >= 1; k even for a sparse graph (k / 2 positions each side).
  HararyGraph(uint32_t n, uint32_t k, const GraphKey& key);

  uint32_t n() const { return n_; }
  uint32_t k() const { return k_; }
  bool complete() const { return k_ + 1 >= n_; }
  // The ring position of client `index` < n, and the client at `position`
  // < n (either out of range aborts: callers check untrusted indices).
  uint32_t Position(uint32_t index) const;
  uint32_t At(uint32_t position) const;
  // Client `index`'s neighbours, sorted.
  std::vector<uint32_t> Neighbours(uint32_t index) const;
  // Whether clients a and b (both < n) are neighbours.
  bool Adjacent(uint32_t a, uint32_t b) const;
  // Whether the clients at ring positions p and q are neighbours.
  bool AdjacentPositions(uint32_t p, uint32_t q) const;

 private:
  uint64_t Round(uint32_t round, uint64_t half) const;
  uint64_t Forward(uint64_t x) const;
  uint64_t Inverse(uint64_t x) const;

  uint32_t n_, k_;
  uint32_t half_bits_ = 1;
  GraphKey key_;
};

// Every client's neighbour list (what the server needs): O(n k).
std::vector<std::vector<uint32_t>> HararyNeighbours(const HararyGraph& graph);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_HARARY_GRAPH_H_
