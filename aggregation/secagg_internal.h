// Helpers the secure-aggregation files share (secagg_derivations.cc,
// secagg_client.cc, secagg_server.cc); not for use outside aggregation/.
#ifndef COHORT_AGGREGATION_SECAGG_INTERNAL_H_
#define COHORT_AGGREGATION_SECAGG_INTERNAL_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "aggregation/secagg_derivations.h"
#include "aggregation/secagg_messages.h"
#include "common/secret_bytes.h"
#include "common/status.h"
#include "crypto/aead.h"
#include "crypto/keys.h"
#include "crypto/shamir.h"

namespace cohort::aggregation::secagg_internal {

inline constexpr size_t kShare = crypto::kShamirShareBytes;
inline constexpr size_t kSig = crypto::kSignatureBytes;
inline constexpr size_t kSalt = 32;
inline constexpr size_t kCommit = sizeof(Commitment);
// Plaintext of one neighbour's sealed shares: the mask-seed share and the
// salt of its commitment, then the self-mask share and its salt.
inline constexpr size_t kPlainBytes = 2 * (kShare + kSalt);
inline constexpr size_t kBlobBytes = crypto::kAeadNonceBytes + kPlainBytes + crypto::kAeadTagBytes;
// The AEAD blob, the commitments to the mask-seed share and to the self-mask
// share, and the dealer's one signature over the three (DealMessage).
inline constexpr size_t kSealedBytes = kBlobBytes + 2 * kCommit + kSig;

inline void PutU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}
inline void PutBytes(std::string& out, std::span<const uint8_t> b) {
  out.append(reinterpret_cast<const char*>(b.data()), b.size());
}
inline std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
inline std::string Str(uint32_t v) { return std::to_string(v); }

inline bool SortedUnique(const std::vector<uint32_t>& v, uint32_t n) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

inline bool Contains(const std::vector<uint32_t>& sorted, uint32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

// The associated data of the shares `from` seals for `to`.
std::string ShareAd(const std::array<uint8_t, 32>& session, uint32_t from, uint32_t to);
// What a complaint's proof of the shared point is bound to.
std::string ComplaintContext(const std::array<uint8_t, 32>& session, uint32_t dealer,
                             uint32_t holder);
crypto::Signature SignatureAt(std::span<const uint8_t> bytes);

// The pairwise mask key: a hash of the X25519 agreement and the session.
StatusOr<SecretBytes> PairMaskKey(const SecretBytes& my_secret, const crypto::X25519Public& mine,
                                  const crypto::X25519Public& theirs,
                                  const std::array<uint8_t, 32>& session);

// One neighbour's sealed shares as they travel (kSealedBytes long).
struct Sealed {
  std::span<const uint8_t> blob;
  Commitment mask{}, self{};
  crypto::Signature signature{};
};
// Only for bytes of kSealedBytes (every caller has checked the size).
Sealed ParseSealed(std::span<const uint8_t> bytes);

// Whether `dealer` signed these sealed shares for `holder`.
bool DealSigned(const crypto::Ed25519Public& dealer_identity,
                const std::array<uint8_t, 32>& session, uint32_t dealer, uint32_t holder,
                const Sealed& s);

// A neighbour's sealed shares, opened and checked against the signed
// commitments: the AEAD, the share x-coordinates and both commitments. The
// signature is checked apart (DealSigned), and only when this fails.
struct Opened {
  SecretBytes mask_share, self_share;
  std::array<uint8_t, kSalt> mask_salt{}, self_salt{};
};
StatusOr<Opened> OpenSealed(const SecretBytes& key, const Sealed& s,
                            const std::array<uint8_t, 32>& session, uint32_t dealer,
                            uint32_t holder);

}  // namespace cohort::aggregation::secagg_internal

#endif  // COHORT_AGGREGATION_SECAGG_INTERNAL_H_
