// A Merkle tree over a fixed number of 32-byte leaves, for messages that
// must show a few entries of a long list (a roster of identity keys, a
// round's key adverts) without carrying it: the list is fixed by its root,
// and one entry travels with the ceil(log2 n) sibling hashes that lead from
// it to the root.
//
// Leaves are hashed by their owners with a label of their own; inner nodes
// are BLAKE2b-256 over a node label and the two children. The tree is padded
// to a power of two with zero leaves, which no proof can be asked for: a
// proof names its position, which must be below n, and has exactly the
// depth's length, so a leaf cannot pass for an inner node or the other way.
// That holds only for a verifier that knows n itself (secure aggregation
// binds it into the session context): a tree read with a smaller n would
// take inner nodes for leaves.
#ifndef COHORT_CRYPTO_MERKLE_H_
#define COHORT_CRYPTO_MERKLE_H_

#include <array>
#include <cstdint>
#include <vector>

namespace cohort::crypto {

using Digest = std::array<uint8_t, 32>;
using MerkleProof = std::vector<Digest>;  // Siblings, from the leaf up.

// The number of siblings in a proof for a tree of n leaves.
uint32_t MerkleDepth(uint32_t n);

class MerkleTree {
 public:
  // n = leaves.size() >= 1.
  explicit MerkleTree(std::vector<Digest> leaves);

  const Digest& root() const { return levels_.back()[0]; }
  uint32_t size() const { return n_; }
  // For index < size().
  MerkleProof Proof(uint32_t index) const;

 private:
  uint32_t n_;
  std::vector<std::vector<Digest>> levels_;  // Leaves (padded) first, root last.
};

// Whether `leaf` sits at `index` of the n-leaf tree with this root.
bool VerifyMerkleProof(const Digest& root, uint32_t n, uint32_t index, const Digest& leaf,
                       const MerkleProof& proof);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_MERKLE_H_
