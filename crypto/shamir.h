// Shamir secret sharing of 32-byte secrets over the prime field
// GF(2^61 - 1). A secret is cut into five 56-bit limbs (the last holds 32
// bits); each limb is shared with its own random polynomial of degree t-1.
// A share is 44 bytes: x (uint32 LE) then five field elements (uint64 LE).
#ifndef COHORT_CRYPTO_SHAMIR_H_
#define COHORT_CRYPTO_SHAMIR_H_

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::crypto {

inline constexpr size_t kShamirSecretBytes = 32;
inline constexpr size_t kShamirShareBytes = 44;

// One share per x in `xs` (each x >= 1, all distinct); any `threshold` of
// them rebuild the secret, fewer reveal nothing about it.
[[nodiscard]] StatusOr<std::vector<SecretBytes>> ShamirSplit(const SecretBytes& secret,
                                                             uint32_t threshold,
                                                             std::span<const uint32_t> xs);

// x-coordinate of a share; 0 for a malformed share.
uint32_t ShamirShareX(const SecretBytes& share);

// Rebuilds secrets from shares. Keeps the Lagrange denominators of each set
// of x-coordinates it has seen (the same sets recur within a round, and
// Consistent reuses those of the Combine before it). Not thread-safe.
class ShamirCombiner {
 public:
  // Uses the first `threshold` shares. kInvalidArgument when fewer are given,
  // when a share is malformed, x repeats, or the result is not a valid secret
  // encoding (shares from different secrets).
  [[nodiscard]] StatusOr<SecretBytes> Combine(std::span<const SecretBytes* const> shares,
                                              uint32_t threshold);
  // Whether `candidate` lies on the polynomials through `basis` (the shares
  // that rebuilt a secret, distinct x). Lets a caller that verified the
  // secret by other means name each share that does not belong to it.
  // kInvalidArgument on a malformed share or a repeated x in `basis`.
  [[nodiscard]] StatusOr<bool> Consistent(std::span<const SecretBytes* const> basis,
                                          const SecretBytes& candidate);

  static constexpr int kLimbCount = 5;  // Field elements per share.

 private:
  // 1 / prod_{m != i} (x_i - x_m), per set of x-coordinates.
  StatusOr<const std::vector<uint64_t>*> InverseDenominators(
      std::span<const SecretBytes* const> basis);
  // The polynomials through `basis`, evaluated at x, into `value` (the
  // caller's memory, which it wipes; zeroed here on error).
  Status Evaluate(std::span<const SecretBytes* const> basis, uint64_t x,
                  std::span<uint64_t, kLimbCount> value);

  std::map<std::vector<uint32_t>, std::vector<uint64_t>> denominators_;
};

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_SHAMIR_H_
