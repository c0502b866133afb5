#include "crypto/merkle.h"

#include <gtest/gtest.h>

namespace cohort::crypto {
namespace {

std::vector<Digest> Leaves(uint32_t n) {
  std::vector<Digest> leaves(n);
  for (uint32_t i = 0; i < n; ++i) {
    leaves[i].fill(static_cast<uint8_t>(i * 7 + 1));
    leaves[i][0] = static_cast<uint8_t>(i >> 8);
  }
  return leaves;
}

TEST(MerkleTest, EveryLeafProvesItsPlaceAndNoOther) {
  for (uint32_t n : {1u, 2u, 3u, 5u, 8u, 13u, 100u}) {
    const auto leaves = Leaves(n);
    MerkleTree tree(leaves);
    for (uint32_t i = 0; i < n; ++i) {
      const MerkleProof proof = tree.Proof(i);
      EXPECT_EQ(proof.size(), MerkleDepth(n));
      EXPECT_TRUE(VerifyMerkleProof(tree.root(), n, i, leaves[i], proof)) << n << " " << i;
      // Another position, another leaf, another n or a padded position.
      if (n > 1) {
        EXPECT_FALSE(VerifyMerkleProof(tree.root(), n, (i + 1) % n, leaves[i], proof));
        EXPECT_FALSE(VerifyMerkleProof(tree.root(), n, i, leaves[(i + 1) % n], proof));
      }
      EXPECT_FALSE(VerifyMerkleProof(tree.root(), n, n, leaves[i], proof));
      EXPECT_FALSE(VerifyMerkleProof(tree.root(), 2 * n + 1, i, leaves[i], proof));
    }
  }
}

TEST(MerkleTest, AChangedLeafOrSiblingChangesTheRoot) {
  auto leaves = Leaves(10);
  MerkleTree tree(leaves);
  MerkleProof proof = tree.Proof(6);
  proof[1][3] ^= 1;
  EXPECT_FALSE(VerifyMerkleProof(tree.root(), 10, 6, leaves[6], proof));
  proof.pop_back();
  EXPECT_FALSE(VerifyMerkleProof(tree.root(), 10, 6, leaves[6], proof));
  leaves[9][31] ^= 1;
  EXPECT_NE(MerkleTree(leaves).root(), tree.root());
}

}  // namespace
}  // namespace cohort::crypto
