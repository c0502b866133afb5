#include "crypto/key_files.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace cohort::crypto {
namespace {

constexpr char kSecretTag[] = "cohort-ed25519-secret";
constexpr char kPublicTag[] = "cohort-ed25519-public";

// A key file is one short line (87 bytes for a secret key); anything much
// larger is not one.
constexpr size_t kMaxKeyFileBytes = 1024;

// Closes a file descriptor on every return path.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Taken into a local right after the failing call: building the message
// may allocate, and the operands of `+` are evaluated in no fixed order.
std::string Errno() { return std::strerror(errno); }

// Reads the whole of a key file. read(2) straight into SecretBytes rather
// than through an ifstream, whose buffer (and the strings read from it)
// would be freed with the secret still in them. `secret`: refuse a file that
// group or others may read, checked on the open descriptor (like ssh).
StatusOr<SecretBytes> ReadKeyFile(const std::string& path, bool secret) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const std::string why = Errno();
    return NotFoundError(path + ": cannot open key file: " + why);
  }
  struct stat st = {};
  if (::fstat(fd.get(), &st) != 0) {
    const std::string why = Errno();
    return NotFoundError(path + ": cannot stat key file: " + why);
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + ": not a regular file");
  if (secret && (st.st_mode & 077) != 0) {
    return FailedPreconditionError(path +
                                   ": secret key is readable by group or others; chmod 600 it");
  }
  SecretBytes buffer(kMaxKeyFileBytes + 1);
  size_t size = 0;
  while (size < buffer.size()) {
    const ssize_t n = ::read(fd.get(), buffer.bytes().data() + size, buffer.size() - size);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = Errno();
      return UnavailableError(path + ": cannot read key file: " + why);
    }
    size += static_cast<size_t>(n);
  }
  if (size > kMaxKeyFileBytes) {
    return InvalidArgumentError(path + ": larger than " + std::to_string(kMaxKeyFileBytes) +
                                " bytes, not a key file");
  }
  SecretBytes text(size);
  std::copy_n(buffer.bytes().data(), size, text.bytes().data());
  return text;  // `buffer` is wiped here.
}

bool IsBlank(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Parses "TAG <hex>" (what follows the hex is ignored) with exactly
// `out.size()` bytes of hex payload into `out`. The hex is decoded in place
// from `text`; no copy of it is made. On an error `out` may hold part of the
// key: callers keep secrets in SecretBytes, which wipes it.
Status ParseTagged(const std::string& path, std::span<const uint8_t> text, const char* tag,
                   std::span<uint8_t> out) {
  // The next whitespace-separated word from `pos`.
  size_t pos = 0;
  auto next_word = [&text, &pos]() {
    while (pos < text.size() && IsBlank(text[pos])) ++pos;
    const size_t begin = pos;
    while (pos < text.size() && !IsBlank(text[pos])) ++pos;
    return text.subspan(begin, pos - begin);
  };
  const std::span<const uint8_t> word = next_word();
  const size_t tag_size = std::strlen(tag);
  if (word.size() != tag_size || std::memcmp(word.data(), tag, tag_size) != 0) {
    return InvalidArgumentError(path + ": not a " + std::string(tag) + " file");
  }
  const std::span<const uint8_t> hex = next_word();
  size_t len = 0;
  if (hex.size() != out.size() * 2 ||
      sodium_hex2bin(out.data(), out.size(), reinterpret_cast<const char*>(hex.data()), hex.size(),
                     nullptr, &len, nullptr) != 0 ||
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
  SecretBytes seed = RandomSecret(crypto_sign_SEEDBYTES);
  Ed25519Public pk{};
  SecretBytes sk(crypto_sign_SECRETKEYBYTES);
  if (crypto_sign_seed_keypair(pk.data(), sk.bytes().data(), seed.bytes().data()) != 0) {
    return InternalError("crypto_sign_seed_keypair failed");
  }
  {
    // The whole line is assembled in SecretBytes and written with write(2):
    // an ofstream's buffer would be freed with the secret in it. O_EXCL
    // refuses an existing file atomically; mode 0600 from the start (the
    // umask can only remove bits).
    const size_t tag = std::strlen(kSecretTag);
    SecretBytes line(tag + 1 + seed.size() * 2 + 2);  // TAG ' ' hex '\n' NUL
    std::memcpy(line.bytes().data(), kSecretTag, tag);
    line.bytes()[tag] = ' ';
    sodium_bin2hex(reinterpret_cast<char*>(line.bytes().data() + tag + 1), seed.size() * 2 + 1,
                   seed.bytes().data(), seed.size());
    line.bytes()[line.size() - 2] = '\n';
    const size_t length = line.size() - 1;
    FileDescriptor fd(::open(key_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) {
      if (errno == EEXIST) return AlreadyExistsError(key_path + " already exists");
      const std::string why = Errno();
      return UnavailableError(key_path + ": cannot create: " + why);
    }
    size_t written = 0;
    while (written < length) {
      const ssize_t n = ::write(fd.get(), line.bytes().data() + written, length - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? Errno() : "short write";
        ::unlink(key_path.c_str());
        return UnavailableError(key_path + ": write failed: " + why);
      }
      written += static_cast<size_t>(n);
    }
  }
  std::ofstream pub(dir + "/" + name + ".pub", std::ios::trunc);
  pub << PublicKeyText(pk);
  if (!pub) return UnavailableError(dir + "/" + name + ".pub: write failed");
  return OkStatus();
}

StatusOr<Ed25519KeyPair> LoadIdentity(const std::string& key_path) {
  COHORT_RETURN_IF_ERROR(InitSodium());
  if (std::filesystem::path(key_path).extension() == ".pub") {
    return InvalidArgumentError(
        key_path + ": this is a public key; an identity is the secret key file beside it (" +
        std::filesystem::path(key_path).replace_extension(".key").string() + ")");
  }
  COHORT_ASSIGN_OR_RETURN(SecretBytes text, ReadKeyFile(key_path, /*secret=*/true));
  SecretBytes seed(crypto_sign_SEEDBYTES);
  COHORT_RETURN_IF_ERROR(ParseTagged(key_path, text.bytes(), kSecretTag, seed.bytes()));
  Ed25519KeyPair pair;
  pair.secret_key = SecretBytes(crypto_sign_SECRETKEYBYTES);
  if (crypto_sign_seed_keypair(pair.public_key.data(), pair.secret_key.bytes().data(),
                               seed.bytes().data()) != 0) {
    return InternalError("crypto_sign_seed_keypair failed");
  }
  return pair;
}

std::string PublicKeyText(const Ed25519Public& key) {
  return std::string(kPublicTag) + " " + Hex(key) + "\n";
}

StatusOr<Ed25519Public> LoadPublicKey(const std::string& pub_path) {
  COHORT_ASSIGN_OR_RETURN(SecretBytes text, ReadKeyFile(pub_path, /*secret=*/false));
  Ed25519Public pk{};
  COHORT_RETURN_IF_ERROR(ParseTagged(pub_path, text.bytes(), kPublicTag, pk));
  return pk;
}

StatusOr<std::vector<AllowedKey>> LoadAllowlist(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return NotFoundError(dir + ": cannot read allowlist directory: " + ec.message());
  std::vector<std::filesystem::path> files;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (it->path().extension() == ".pub") files.push_back(it->path());
  }
  if (ec) return UnavailableError(dir + ": cannot read allowlist directory: " + ec.message());
  // Sorted, so the list and any error do not depend on the directory order.
  std::sort(files.begin(), files.end());
  std::vector<AllowedKey> out;
  std::map<Ed25519Public, std::string> file_of_key;
  for (const auto& file : files) {
    COHORT_ASSIGN_OR_RETURN(Ed25519Public pk, LoadPublicKey(file.string()));
    // The coordinator maps a CURVE key to one name: a key under two names
    // would silently be whichever was read last.
    auto [where, inserted] = file_of_key.emplace(pk, file.string());
    if (!inserted) {
      return InvalidArgumentError("allowlist " + dir + ": " + where->second + " and " +
                                  file.string() +
                                  " hold the same key; a key may be listed under one name only");
    }
    out.push_back({file.stem().string(), pk});
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

StatusOr<X25519KeyPair> X25519For(const Ed25519KeyPair& identity) {
  X25519KeyPair pair;
  COHORT_ASSIGN_OR_RETURN(pair.public_key, CurvePublicFor(identity.public_key));
  pair.secret_key = SecretBytes(32);
  if (identity.secret_key.size() != kEd25519SecretBytes ||
      crypto_sign_ed25519_sk_to_curve25519(pair.secret_key.bytes().data(),
                                           identity.secret_key.bytes().data()) != 0) {
    return InternalError("ed25519 -> curve25519 conversion failed");
  }
  return pair;
}

StatusOr<CurveKeys> CurveKeysFor(const Ed25519KeyPair& identity) {
  COHORT_ASSIGN_OR_RETURN(X25519KeyPair pair, X25519For(identity));
  CurveKeys keys;
  keys.public_z85 = Z85(pair.public_key);
  keys.secret_z85 = SecretBytes(41);
  zmq_z85_encode(reinterpret_cast<char*>(keys.secret_z85.bytes().data()),
                 pair.secret_key.bytes().data(), 32);
  return keys;
}

std::string Hex(std::span<const uint8_t> bytes) {
  std::string out(bytes.size() * 2 + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), bytes.data(), bytes.size());
  out.pop_back();
  return out;
}

}  // namespace cohort::crypto
