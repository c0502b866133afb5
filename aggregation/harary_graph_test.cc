#include "aggregation/harary_graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

namespace cohort::aggregation {
namespace {

GraphKey Key(uint8_t b) {
  GraphKey k;
  k.fill(b);
  return k;
}

TEST(HararyGraphTest, PlacesEveryClientOnceAndFindsTheSameNeighboursPointwise) {
  // Up to 2^16 a shuffle places the clients, above it a Feistel network.
  for (uint32_t n : {3u, 10u, 31u, 100u, 1000u, 4097u, 70001u}) {
    const uint32_t k = n > 40 ? 38 : (n - 1) / 2 * 2;
    const HararyGraph g(n, k, Key(static_cast<uint8_t>(n)));
    std::vector<bool> placed(n, false);
    for (uint32_t p = 0; p < n; ++p) {
      const uint32_t i = g.At(p);
      ASSERT_LT(i, n);
      ASSERT_FALSE(placed[i]) << "n=" << n << ": client " << i << " placed twice";
      placed[i] = true;
      ASSERT_EQ(g.Position(i), p);
    }
    const auto all = HararyNeighbours(g);
    const uint32_t stride = n > HararyGraph::kShuffledUpTo ? 97 : 1;
    for (uint32_t i = 0; i < n; i += stride) {
      const auto nb = g.Neighbours(i);
      ASSERT_EQ(nb, all[i]) << "n=" << n << " client " << i;
      ASSERT_EQ(nb.size(), g.complete() ? n - 1 : k);
      for (uint32_t j : nb) {
        ASSERT_TRUE(g.Adjacent(i, j));
        ASSERT_TRUE(std::binary_search(all[j].begin(), all[j].end(), i));  // Symmetric.
      }
      ASSERT_FALSE(g.Adjacent(i, i));
    }
  }
}

TEST(HararyGraphTest, ASmallCohortsPlacesAreUniform) {
  // Which two clients sit at positions 0 and 1 of a ring of 20, over 20,000
  // keys: chi-square over the 380 ordered pairs (379 degrees of freedom:
  // mean 379, sd 27.5). A biased shuffle (a swap with any place) fails it.
  constexpr uint32_t kN = 20, kKeys = 20000;
  std::vector<double> bins(kN * kN, 0);
  for (uint32_t key = 0; key < kKeys; ++key) {
    GraphKey k{};
    std::memcpy(k.data(), &key, sizeof(key));
    const HararyGraph g(kN, 4, k);
    bins[g.At(0) * kN + g.At(1)] += 1;
  }
  const double expect = double(kKeys) / (kN * (kN - 1));
  double chi2 = 0;
  for (uint32_t a = 0; a < kN; ++a) {
    for (uint32_t b = 0; b < kN; ++b) {
      if (a != b) chi2 += (bins[a * kN + b] - expect) * (bins[a * kN + b] - expect) / expect;
    }
  }
  EXPECT_LT(chi2, 379 + 5 * 27.5);
}

TEST(HararyGraphTest, TheKeyDecidesThePlaces) {
  const HararyGraph a(1000, 38, Key(1)), b(1000, 38, Key(2));
  uint32_t same = 0;
  for (uint32_t p = 0; p < 1000; ++p) same += a.At(p) == b.At(p) ? 1 : 0;
  EXPECT_LT(same, 10u);  // About 1 expected by chance.
  EXPECT_NE(a.Neighbours(0), b.Neighbours(0));
  // Not the identity, nor a rotation of it.
  uint32_t in_order = 0;
  for (uint32_t p = 0; p + 1 < 1000; ++p) in_order += a.At(p + 1) == a.At(p) + 1 ? 1 : 0;
  EXPECT_LT(in_order, 10u);
}

}  // namespace
}  // namespace cohort::aggregation
