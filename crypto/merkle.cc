#include "crypto/merkle.h"

#include <cstdlib>
#include <utility>

#include "crypto/keys.h"

namespace cohort::crypto {
namespace {

constexpr uint8_t kNodeLabel[] = "cohort-merkle-node";

Digest Node(const Digest& left, const Digest& right) {
  return Hash256({{kNodeLabel, sizeof(kNodeLabel)}, left, right});
}

}  // namespace

uint32_t MerkleDepth(uint32_t n) {
  uint32_t depth = 0;
  while (depth < 32 && (uint64_t{1} << depth) < n) ++depth;
  return depth;
}

MerkleTree::MerkleTree(std::vector<Digest> leaves) : n_(static_cast<uint32_t>(leaves.size())) {
  if (leaves.empty()) std::abort();  // A caller's bug: no roster has no root.
  leaves.resize(size_t{1} << MerkleDepth(n_), Digest{});
  levels_.push_back(std::move(leaves));
  while (levels_.back().size() > 1) {
    const std::vector<Digest>& below = levels_.back();
    std::vector<Digest> level(below.size() / 2);
    for (size_t i = 0; i < level.size(); ++i) level[i] = Node(below[2 * i], below[2 * i + 1]);
    levels_.push_back(std::move(level));
  }
}

MerkleProof MerkleTree::Proof(uint32_t index) const {
  if (index >= n_) std::abort();  // A caller's bug.
  MerkleProof proof;
  for (size_t level = 0; level + 1 < levels_.size(); ++level, index /= 2) {
    proof.push_back(levels_[level][index ^ 1]);
  }
  return proof;
}

bool VerifyMerkleProof(const Digest& root, uint32_t n, uint32_t index, const Digest& leaf,
                       const MerkleProof& proof) {
  if (index >= n || proof.size() != MerkleDepth(n)) return false;
  Digest h = leaf;
  for (const Digest& sibling : proof) {
    h = (index & 1) ? Node(sibling, h) : Node(h, sibling);
    index /= 2;
  }
  return h == root;
}

}  // namespace cohort::crypto
