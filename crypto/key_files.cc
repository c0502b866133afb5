#include "crypto/key_files.h"

#include <sodium.h>
#include <sys/stat.h>
#include <zmq.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cohort::crypto {
namespace {

constexpr char kSecretTag[] = "cohort-ed25519-secret";
constexpr char kPublicTag[] = "cohort-ed25519-public";

std::string Hex(std::span<const uint8_t> bytes) {
  std::string out(bytes.size() * 2 + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), bytes.data(), bytes.size());
  out.pop_back();
  return out;
}

// Reads "TAG <hex>" with exactly `size` bytes of hex payload into `out`.
Status ParseTagged(const std::string& path, const char* tag, std::span<uint8_t> out) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open key file");
  std::string word, hex;
  in >> word >> hex;
  if (word != tag) {
    return InvalidArgumentError(path + ": not a " + std::string(tag) + " file");
  }
  size_t len = 0;
  if (hex.size() != out.size() * 2 ||
      sodium_hex2bin(out.data(), out.size(), hex.data(), hex.size(), nullptr, &len, nullptr) != 0 ||
      len != out.size()) {
    return InvalidArgumentError(path + ": key must be " + std::to_string(out.size() * 2) +
                                " hex characters");
  }
  return OkStatus();
}

}  // namespace

Status WriteIdentity(const std::string& dir, const std::string& name) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError(dir + ": " + ec.message());
  const std::string key_path = dir + "/" + name + ".key";
  if (std::filesystem::exists(key_path)) return AlreadyExistsError(key_path + " already exists");
  SecretBytes seed = RandomSecret(crypto_sign_SEEDBYTES);
  Ed25519Public pk{};
  SecretBytes sk(crypto_sign_SECRETKEYBYTES);
  if (crypto_sign_seed_keypair(pk.data(), sk.bytes().data(), seed.bytes().data()) != 0) {
    return InternalError("crypto_sign_seed_keypair failed");
  }
  {
    // Created 0600 before any secret is written to it.
    const mode_t old = umask(077);
    std::ofstream out(key_path, std::ios::trunc);
    umask(old);
    SecretBytes hex(seed.size() * 2 + 1);
    sodium_bin2hex(reinterpret_cast<char*>(hex.bytes().data()), hex.size(), seed.bytes().data(),
                   seed.size());
    out << kSecretTag << " " << reinterpret_cast<const char*>(hex.bytes().data()) << "\n";
    if (!out) return UnavailableError(key_path + ": write failed");
  }
  std::ofstream pub(dir + "/" + name + ".pub", std::ios::trunc);
  pub << kPublicTag << " " << Hex(pk) << "\n";
  if (!pub) return UnavailableError(dir + "/" + name + ".pub: write failed");
  return OkStatus();
}

StatusOr<Ed25519KeyPair> LoadIdentity(const std::string& key_path) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  struct stat st;
  if (stat(key_path.c_str(), &st) != 0) return NotFoundError(key_path + ": cannot open key file");
  if ((st.st_mode & 077) != 0) {
    return FailedPreconditionError(key_path +
                                   ": secret key is readable by group or others; chmod 600 it");
  }
  SecretBytes seed(crypto_sign_SEEDBYTES);
  COHORT_RETURN_IF_ERROR(ParseTagged(key_path, kSecretTag, seed.bytes()));
  Ed25519KeyPair pair;
  pair.secret_key = SecretBytes(crypto_sign_SECRETKEYBYTES);
  if (crypto_sign_seed_keypair(pair.public_key.data(), pair.secret_key.bytes().data(),
                               seed.bytes().data()) != 0) {
    return InternalError("crypto_sign_seed_keypair failed");
  }
  return pair;
}

StatusOr<Ed25519Public> LoadPublicKey(const std::string& pub_path) {
  Ed25519Public pk{};
  COHORT_RETURN_IF_ERROR(ParseTagged(pub_path, kPublicTag, pk));
  return pk;
}

StatusOr<std::vector<AllowedKey>> LoadAllowlist(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return NotFoundError(dir + ": cannot read allowlist directory: " + ec.message());
  std::vector<AllowedKey> out;
  for (const auto& entry : it) {
    if (entry.path().extension() != ".pub") continue;
    COHORT_ASSIGN_OR_RETURN(Ed25519Public pk, LoadPublicKey(entry.path().string()));
    out.push_back({entry.path().stem().string(), pk});
  }
  return out;
}

StatusOr<X25519Public> CurvePublicFor(const Ed25519Public& key) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  X25519Public out{};
  if (crypto_sign_ed25519_pk_to_curve25519(out.data(), key.data()) != 0) {
    return InvalidArgumentError("not a valid Ed25519 public key");
  }
  return out;
}

std::string Z85(const X25519Public& key) {
  char buf[41];
  zmq_z85_encode(buf, key.data(), key.size());
  return buf;
}

StatusOr<CurveKeys> CurveKeysFor(const Ed25519KeyPair& identity) {
  COHORT_ASSIGN_OR_RETURN(X25519Public pk, CurvePublicFor(identity.public_key));
  SecretBytes sk(32);
  if (crypto_sign_ed25519_sk_to_curve25519(sk.bytes().data(), identity.secret_key.bytes().data()) !=
      0) {
    return InternalError("ed25519 -> curve25519 conversion failed");
  }
  CurveKeys keys;
  keys.public_z85 = Z85(pk);
  keys.secret_z85 = SecretBytes(41);
  zmq_z85_encode(reinterpret_cast<char*>(keys.secret_z85.bytes().data()), sk.bytes().data(), 32);
  return keys;
}

}  // namespace cohort::crypto
