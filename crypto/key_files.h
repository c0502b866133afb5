// Identity key files (`cohort keygen`) and allowlists.
//
//   NAME.key  "cohort-ed25519-secret <64 hex chars: the 32-byte seed>\n",
//             mode 0600; refused when group or others may read it (like ssh).
//   NAME.pub  "cohort-ed25519-public <64 hex chars>\n"
//
// An allowlist is a directory of .pub files (like authorized_keys). The
// Ed25519 identity also yields the X25519 key pair that ZeroMQ CURVE uses, so
// the key a coordinator admits is the key that signs secure-aggregation
// messages.
#ifndef COHORT_CRYPTO_KEY_FILES_H_
#define COHORT_CRYPTO_KEY_FILES_H_

#include <span>
#include <string>
#include <vector>

#include "common/secret_bytes.h"
#include "common/status.h"
#include "crypto/keys.h"

namespace cohort::crypto {

// Writes DIR/NAME.key (created 0600, never over an existing file) and
// DIR/NAME.pub; kAlreadyExists if NAME.key exists.
Status WriteIdentity(const std::string& dir, const std::string& name);
// Errors name the file: unreadable, not a regular file, over 1 KiB, wrong
// permissions (a secret key group or others may read), malformed. Every
// buffer that held the file's text or the decoded secret is wiped before it
// is freed.
StatusOr<Ed25519KeyPair> LoadIdentity(const std::string& key_path);
StatusOr<Ed25519Public> LoadPublicKey(const std::string& pub_path);
// The text of a NAME.pub file for `key` (what WriteIdentity writes).
std::string PublicKeyText(const Ed25519Public& key);

struct AllowedKey {
  std::string name;  // File stem.
  Ed25519Public key{};
};
// Every *.pub file in `dir`, sorted by file name; a malformed one is an error
// naming it, and so is one key in two files (kInvalidArgument naming both):
// a key maps to exactly one client name.
StatusOr<std::vector<AllowedKey>> LoadAllowlist(const std::string& dir);

// The CURVE (X25519) keys of an identity, Z85-encoded as ZeroMQ wants them.
struct CurveKeys {
  std::string public_z85;  // 40 characters.
  SecretBytes secret_z85;  // 40 characters + NUL.
};
StatusOr<CurveKeys> CurveKeysFor(const Ed25519KeyPair& identity);
// The same X25519 key pair, raw (for key agreement with another identity).
StatusOr<X25519KeyPair> X25519For(const Ed25519KeyPair& identity);
// The raw 32-byte CURVE public key for an Ed25519 public key.
StatusOr<X25519Public> CurvePublicFor(const Ed25519Public& key);
std::string Z85(const X25519Public& key);
// Lower-case hex, as .pub files and log lines write keys.
std::string Hex(std::span<const uint8_t> bytes);

}  // namespace cohort::crypto

#endif  // COHORT_CRYPTO_KEY_FILES_H_
