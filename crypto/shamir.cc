#include "crypto/shamir.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "crypto/keys.h"

namespace cohort::crypto {
namespace {

constexpr uint64_t kP = (uint64_t{1} << 61) - 1;
constexpr int kLimbs = ShamirCombiner::kLimbCount;
constexpr int kLimbBytes = 7;

uint64_t Reduce(unsigned __int128 x) {
  // 2^61 = 1 (mod p): fold the high bits down twice.
  uint64_t r = static_cast<uint64_t>(x & kP) + static_cast<uint64_t>(x >> 61);
  r = (r & kP) + (r >> 61);
  return r >= kP ? r - kP : r;
}
uint64_t Add(uint64_t a, uint64_t b) {
  const uint64_t r = a + b;
  return r >= kP ? r - kP : r;
}
uint64_t Sub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kP - b; }
uint64_t Mul(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) * b); }
uint64_t Pow(uint64_t a, uint64_t e) {
  uint64_t r = 1;
  while (e > 0) {
    if (e & 1) r = Mul(r, a);
    a = Mul(a, a);
    e >>= 1;
  }
  return r;
}
uint64_t Inverse(uint64_t a) { return Pow(a, kP - 2); }

// Uniform in [0, p) by rejection from 61 random bits.
uint64_t RandomElement() {
  for (;;) {
    uint64_t v;
    randombytes_buf(&v, sizeof(v));
    v &= kP;
    if (v < kP) return v;
  }
}

}  // namespace

StatusOr<std::vector<SecretBytes>> ShamirSplit(const SecretBytes& secret, uint32_t threshold,
                                               std::span<const uint32_t> xs) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (secret.size() != kShamirSecretBytes) {
    return InvalidArgumentError("shamir: secret must have 32 bytes");
  }
  if (threshold == 0 || threshold > xs.size()) {
    return InvalidArgumentError("shamir: threshold " + std::to_string(threshold) + " with " +
                                std::to_string(xs.size()) + " shares");
  }
  std::vector<uint32_t> sorted(xs.begin(), xs.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() == 0 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      sorted.back() >= kP) {
    return InvalidArgumentError("shamir: x-coordinates must be distinct and >= 1");
  }
  // coefficients[limb][k]; k = 0 is the secret limb. Kept in SecretBytes.
  SecretBytes coefficients(sizeof(uint64_t) * kLimbs * threshold);
  auto* c = reinterpret_cast<uint64_t*>(coefficients.bytes().data());
  const uint8_t* s = secret.bytes().data();
  for (int l = 0; l < kLimbs; ++l) {
    uint64_t limb = 0;
    const int bytes = std::min(kLimbBytes, static_cast<int>(kShamirSecretBytes) - l * kLimbBytes);
    std::memcpy(&limb, s + l * kLimbBytes, bytes);
    c[l * threshold] = limb;
    for (uint32_t k = 1; k < threshold; ++k) c[l * threshold + k] = RandomElement();
  }
  std::vector<SecretBytes> shares;
  shares.reserve(xs.size());
  for (uint32_t x : xs) {
    SecretBytes share(kShamirShareBytes);
    uint8_t* out = share.bytes().data();
    std::memcpy(out, &x, 4);
    for (int l = 0; l < kLimbs; ++l) {
      // Horner's rule from the highest coefficient.
      uint64_t y = 0;
      for (uint32_t k = threshold; k-- > 0;) y = Add(Mul(y, x), c[l * threshold + k]);
      std::memcpy(out + 4 + 8 * l, &y, 8);
    }
    shares.push_back(std::move(share));
  }
  return shares;
}

uint32_t ShamirShareX(const SecretBytes& share) {
  if (share.size() != kShamirShareBytes) return 0;
  uint32_t x;
  std::memcpy(&x, share.bytes().data(), 4);
  return x;
}

StatusOr<const std::vector<uint64_t>*> ShamirCombiner::InverseDenominators(
    std::span<const SecretBytes* const> basis) {
  std::vector<uint32_t> xs(basis.size());
  for (size_t i = 0; i < basis.size(); ++i) {
    xs[i] = ShamirShareX(*basis[i]);
    if (xs[i] == 0) return InvalidArgumentError("shamir: malformed share");
  }
  auto [it, inserted] = denominators_.try_emplace(xs);
  if (!inserted) return &it->second;
  // d_i = prod_{m != i} (x_i - x_m): O(t^2) multiplications, then one
  // inversion for all t (Montgomery's trick) instead of t inversions.
  const size_t t = xs.size();
  std::vector<uint64_t> d(t), prefix(t);
  uint64_t running = 1;
  for (size_t i = 0; i < t; ++i) {
    uint64_t den = 1;
    for (size_t m = 0; m < t; ++m) {
      if (m != i) den = Mul(den, Sub(xs[i], xs[m]));
    }
    if (den == 0) {
      denominators_.erase(it);
      return InvalidArgumentError("shamir: repeated x-coordinate");
    }
    d[i] = den;
    prefix[i] = running;  // d_0 ... d_{i-1}
    running = Mul(running, den);
  }
  std::vector<uint64_t>& inverse = it->second;
  inverse.resize(t);
  uint64_t inv = Inverse(running);  // 1 / (d_0 ... d_{t-1})
  for (size_t i = t; i-- > 0;) {
    inverse[i] = Mul(inv, prefix[i]);
    inv = Mul(inv, d[i]);
  }
  return &it->second;
}

Status ShamirCombiner::Evaluate(std::span<const SecretBytes* const> basis, uint64_t x,
                                std::span<uint64_t, kLimbCount> value) {
  COHORT_ASSIGN_OR_RETURN(const std::vector<uint64_t>* inverse, InverseDenominators(basis));
  // l_i(x) = prod_{m != i} (x - x_m) / d_i; the numerators from prefix and
  // suffix products, so no inversion here.
  const size_t t = basis.size();
  std::vector<uint64_t> weight(t);
  uint64_t prefix = 1;
  for (size_t i = 0; i < t; ++i) {
    weight[i] = prefix;
    prefix = Mul(prefix, Sub(x, ShamirShareX(*basis[i])));
  }
  uint64_t suffix = 1;
  for (size_t i = t; i-- > 0;) {
    weight[i] = Mul(Mul(weight[i], suffix), (*inverse)[i]);
    suffix = Mul(suffix, Sub(x, ShamirShareX(*basis[i])));
  }
  for (int l = 0; l < kLimbs; ++l) {
    uint64_t acc = 0;
    for (size_t i = 0; i < t; ++i) {
      uint64_t y;
      std::memcpy(&y, basis[i]->bytes().data() + 4 + 8 * l, 8);
      if (y >= kP) {
        sodium_memzero(value.data(), value.size_bytes());
        return InvalidArgumentError("shamir: share value outside the field");
      }
      acc = Add(acc, Mul(weight[i], y));
    }
    value[l] = acc;
  }
  return OkStatus();
}

StatusOr<SecretBytes> ShamirCombiner::Combine(std::span<const SecretBytes* const> shares,
                                              uint32_t threshold) {
  if (threshold == 0 || shares.size() < threshold) {
    return InvalidArgumentError("shamir: " + std::to_string(shares.size()) + " shares, need " +
                                std::to_string(threshold));
  }
  // The secret's limbs: wiped on every path.
  SecretBytes limb_bytes(sizeof(uint64_t) * kLimbs);
  std::span<uint64_t, kLimbCount> limbs(reinterpret_cast<uint64_t*>(limb_bytes.bytes().data()),
                                        kLimbCount);
  COHORT_RETURN_IF_ERROR(Evaluate(shares.first(threshold), 0, limbs));
  SecretBytes secret(kShamirSecretBytes);
  uint8_t* out = secret.bytes().data();
  for (int l = 0; l < kLimbs; ++l) {
    const int bytes = std::min(kLimbBytes, static_cast<int>(kShamirSecretBytes) - l * kLimbBytes);
    if (limbs[l] >> (8 * bytes) != 0) {
      return InvalidArgumentError("shamir: shares do not belong to one secret");
    }
    std::memcpy(out + l * kLimbBytes, &limbs[l], bytes);
  }
  return secret;
}

StatusOr<bool> ShamirCombiner::Consistent(std::span<const SecretBytes* const> basis,
                                          const SecretBytes& candidate) {
  const uint32_t x = ShamirShareX(candidate);
  if (basis.empty() || x == 0) return InvalidArgumentError("shamir: malformed share");
  SecretBytes limb_bytes(sizeof(uint64_t) * kLimbs);  // Wiped on every path.
  std::span<uint64_t, kLimbCount> limbs(reinterpret_cast<uint64_t*>(limb_bytes.bytes().data()),
                                        kLimbCount);
  COHORT_RETURN_IF_ERROR(Evaluate(basis, x, limbs));
  bool same = true;
  for (int l = 0; l < kLimbs; ++l) {
    uint64_t expected;
    std::memcpy(&expected, candidate.bytes().data() + 4 + 8 * l, 8);
    same = same && limbs[l] == expected;
  }
  return same;
}

}  // namespace cohort::crypto
