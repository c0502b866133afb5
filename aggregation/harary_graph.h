// The neighbour graph of SecAgg+ (Bell et al., CCS 2020): the k-regular
// Harary graph H(k, n), clients placed on its ring by a keyed permutation.
// Client `index` sits at ring position Position(index) and is adjacent to
// the clients within k/2 positions either side.
//
// The permutation, keyed (SipHash-2-4 under the key):
// - up to kShuffledUpTo clients, a Fisher-Yates shuffle: uniformly random,
//   as the 2^-20 bound of MaxCorruptNeighbours assumes, at O(n) to build
//   (65,536 clients: about 2 ms and 512 KiB, dropped once a
//   client has its neighbours);
// - above, a Feistel network over [0, 2^b) with b even and 2^b >= n, walked
//   in cycles until it lands in [0, n): one client's neighbours cost O(k)
//   evaluations, and no party builds the whole graph to know its place.
//   Feistel networks on small halves reach only part of the permutations
//   (an independent review of this code pointed it out; simple statistics
//   do not show it), which is why the shuffle takes the small cohorts; from
//   2^17 the halves have 9 bits.
// With k + 1 >= n the graph is complete and the permutation is not used.
#ifndef COHORT_AGGREGATION_HARARY_GRAPH_H_
#define COHORT_AGGREGATION_HARARY_GRAPH_H_

#include <array>
#include <cstdint>
#include <vector>

namespace cohort::aggregation {

using GraphKey = std::array<uint8_t, 16>;

class HararyGraph {
 public:
  static constexpr uint32_t kShuffledUpTo = uint32_t{1} << 16;

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
  void Shuffle();
  uint64_t Forward(uint64_t x) const;
  uint64_t Inverse(uint64_t x) const;

  uint32_t n_, k_;
  uint32_t half_bits_ = 1;
  GraphKey key_;
  // The shuffled ring (n <= kShuffledUpTo, sparse graphs): the client at
  // each position, and the position of each client.
  std::vector<uint32_t> ring_, position_;
};

// Every client's neighbour list (what the server needs): O(n k).
std::vector<std::vector<uint32_t>> HararyNeighbours(const HararyGraph& graph);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_HARARY_GRAPH_H_
