// SHA-256 digests for lineage (libsodium's crypto_hash_sha256): a run's
// config and a client's training shard, as 64 lowercase hex digits.
#ifndef COHORT_CRYPTO_DIGEST_H_
#define COHORT_CRYPTO_DIGEST_H_

#include <string>
#include <string_view>

#include "common/status.h"

namespace cohort::crypto {

std::string Sha256Hex(std::string_view bytes);
// The file's digest, read in chunks; kNotFound / kUnavailable naming the file.
StatusOr<std::string> FileSha256Hex(const std::string& path);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_DIGEST_H_
