#include "crypto/digest.h"

#include <sodium.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace cohort::crypto {
namespace {

std::string Hex(const std::array<unsigned char, crypto_hash_sha256_BYTES>& digest) {
  std::string hex(2 * digest.size() + 1, '\0');
  sodium_bin2hex(hex.data(), hex.size(), digest.data(), digest.size());
  hex.pop_back();
  return hex;
}

}  // namespace

std::string Sha256Hex(std::string_view bytes) {
  std::array<unsigned char, crypto_hash_sha256_BYTES> digest;
  crypto_hash_sha256(digest.data(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size());
  return Hex(digest);
}

StatusOr<std::string> FileSha256Hex(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    const std::string why = std::strerror(errno);
    return errno == ENOENT ? NotFoundError(path + ": " + why) : UnavailableError(path + ": " + why);
  }
  crypto_hash_sha256_state state;
  crypto_hash_sha256_init(&state);
  std::array<unsigned char, 1 << 16> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f.get())) > 0) {
    crypto_hash_sha256_update(&state, buffer.data(), n);
  }
  if (std::ferror(f.get())) return UnavailableError(path + ": read error");
  std::array<unsigned char, crypto_hash_sha256_BYTES> digest;
  crypto_hash_sha256_final(&state, digest.data());
  return Hex(digest);
}

}  // namespace cohort::crypto
