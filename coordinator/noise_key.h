// The run secret that keys central DP's noise (coordinator/strategy_dp.h):
// RUN_DIR/privacy_noise.key, "cohort-dp-noise-key <64 hex chars>\n", mode
// 0600, beside the run's store and never inside it. The store is what
// `cohort status`, `report` and `export` read and what gets copied for
// analysis; whoever holds the key can recompute every round's noise and
// subtract it from the models, so the key is kept like an identity key.
// A resumed run reads the same key and so adds the same noise, bit for bit.
#ifndef COHORT_COORDINATOR_NOISE_KEY_H_
#define COHORT_COORDINATOR_NOISE_KEY_H_

#include <string>

#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::coordinator {

inline constexpr char kNoiseKeyFile[] = "privacy_noise.key";

// Reads `path`; when it does not exist and `create`, writes a new random key
// there first (O_EXCL, mode 0600). Errors name the file: kNotFound when it
// is missing and `create` is false (a run whose rounds were noised with
// it cannot be resumed bit for bit without it), kFailedPrecondition when
// group or others may read it, when it is a symbolic link (never followed)
// or when another user owns it, kInvalidArgument when malformed.
StatusOr<SecretBytes> LoadOrCreateNoiseKey(const std::string& path, bool create);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_NOISE_KEY_H_
