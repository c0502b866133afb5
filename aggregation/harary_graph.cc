#include "aggregation/harary_graph.h"

#include <sodium.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace cohort::aggregation {
namespace {

constexpr uint32_t kRounds = 6;

// SipHash's input and output as bytes, the same on every machine.
void PutLittleEndian(uint64_t v, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLittleEndian(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}

}  // namespace

HararyGraph::HararyGraph(uint32_t n, uint32_t k, const GraphKey& key) : n_(n), k_(k), key_(key) {
  uint32_t bits = 2;
  while (bits < 32 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  if (!complete() && n_ <= kShuffledUpTo) Shuffle();
}

void HararyGraph::Shuffle() {
  ring_.resize(n_);
  for (uint32_t p = 0; p < n_; ++p) ring_[p] = p;
  // Draws from SipHash(key, counter), with a tag the Feistel rounds never use.
  uint64_t counter = 0;
  auto draw = [&] {
    uint8_t in[12] = {0xff, 0xff, 0xff, 0xff}, out[crypto_shorthash_siphash24_BYTES];
    PutLittleEndian(counter++, in + 4);
    crypto_shorthash_siphash24(out, in, sizeof(in), key_.data());
    return GetLittleEndian(out);
  };
  for (uint32_t i = n_ - 1; i > 0; --i) {
    // Uniform in [0, i]: reject the top of the range that does not divide.
    const uint64_t m = uint64_t{i} + 1, limit = UINT64_MAX - UINT64_MAX % m;
    uint64_t h = draw();
    while (h >= limit) h = draw();
    std::swap(ring_[i], ring_[h % m]);
  }
  position_.resize(n_);
  for (uint32_t p = 0; p < n_; ++p) position_[ring_[p]] = p;
}

uint64_t HararyGraph::Round(uint32_t round, uint64_t half) const {
  static_assert(crypto_shorthash_siphash24_KEYBYTES == sizeof(GraphKey));
  uint8_t in[8], out[crypto_shorthash_siphash24_BYTES];
  PutLittleEndian((uint64_t{round} << 32) | half, in);
  crypto_shorthash_siphash24(out, in, sizeof(in), key_.data());
  return GetLittleEndian(out) & ((uint64_t{1} << half_bits_) - 1);
}

uint64_t HararyGraph::Forward(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (uint32_t r = 0; r < kRounds; ++r) {
    const uint64_t next = left ^ Round(r, right);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t HararyGraph::Inverse(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (uint32_t r = kRounds; r-- > 0;) {
    const uint64_t prev = right ^ Round(r, left);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

uint32_t HararyGraph::At(uint32_t position) const {
  // A caller's bug: from outside [0, n) the walk may never come back.
  if (position >= n_) std::abort();
  if (complete()) return position;
  if (!ring_.empty()) return ring_[position];
  uint64_t x = Forward(position);
  while (x >= n_) x = Forward(x);  // Cycle walking: ends, as x < n started the cycle.
  return static_cast<uint32_t>(x);
}

uint32_t HararyGraph::Position(uint32_t index) const {
  if (index >= n_) std::abort();  // As in At.
  if (complete()) return index;
  if (!position_.empty()) return position_[index];
  uint64_t x = Inverse(index);
  while (x >= n_) x = Inverse(x);
  return static_cast<uint32_t>(x);
}

bool HararyGraph::AdjacentPositions(uint32_t p, uint32_t q) const {
  if (p == q) return false;
  if (complete()) return true;
  uint32_t d = p > q ? p - q : q - p;
  d = std::min(d, n_ - d);
  return d <= k_ / 2;
}

bool HararyGraph::Adjacent(uint32_t a, uint32_t b) const {
  return AdjacentPositions(Position(a), Position(b));
}

std::vector<uint32_t> HararyGraph::Neighbours(uint32_t index) const {
  std::vector<uint32_t> out;
  if (complete()) {
    for (uint32_t j = 0; j < n_; ++j) {
      if (j != index) out.push_back(j);
    }
    return out;
  }
  const uint32_t pos = Position(index);
  for (uint32_t d = 1; d <= k_ / 2; ++d) {
    out.push_back(At((pos + d) % n_));
    out.push_back(At((pos + n_ - d) % n_));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::vector<uint32_t>> HararyNeighbours(const HararyGraph& graph) {
  const uint32_t n = graph.n();
  std::vector<std::vector<uint32_t>> out(n);
  if (graph.complete()) {
    for (uint32_t i = 0; i < n; ++i) out[i] = graph.Neighbours(i);
    return out;
  }
  std::vector<uint32_t> ring(n);
  for (uint32_t p = 0; p < n; ++p) ring[p] = graph.At(p);
  for (uint32_t p = 0; p < n; ++p) {
    for (uint32_t d = 1; d <= graph.k() / 2; ++d) {
      out[ring[p]].push_back(ring[(p + d) % n]);
      out[ring[p]].push_back(ring[(p + n - d) % n]);
    }
  }
  for (auto& list : out) {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  return out;
}

}  // namespace cohort::aggregation
