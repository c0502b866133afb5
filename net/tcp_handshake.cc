#include "net/tcp_handshake.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sodium.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "common/bytes.h"
#include "crypto/keys.h"

namespace cohort::net {
namespace {

constexpr char kMagic[8] = {'c', 'o', 'h', 'o', 'r', 't', '-', 't'};
constexpr uint32_t kVersion = 1;
constexpr size_t kNonceBytes = 32, kTagBytes = 32;
// magic, version, world size, from rank, to rank, the connector's nonce.
constexpr size_t kHelloBytes = sizeof(kMagic) + 4 * 4 + kNonceBytes;
constexpr size_t kReplyBytes = kNonceBytes + kTagBytes;
constexpr uint8_t kAcceptorLabel[] = "cohort tcp transport: acceptor";
constexpr uint8_t kConnectorLabel[] = "cohort tcp transport: connector";

struct Hello {
  std::array<uint8_t, kHelloBytes> bytes{};
  uint32_t field(int i) const { return GetU32(&bytes[sizeof(kMagic) + 4 * i]); }
  uint32_t version() const { return field(0); }
  uint32_t size() const { return field(1); }
  uint32_t from() const { return field(2); }
  uint32_t to() const { return field(3); }
  bool magic_ok() const { return std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0; }
};

Hello MakeHello(int size, int from, int to) {
  Hello h;
  std::memcpy(h.bytes.data(), kMagic, sizeof(kMagic));
  const uint32_t fields[4] = {kVersion, uint32_t(size), uint32_t(from), uint32_t(to)};
  std::memcpy(&h.bytes[sizeof(kMagic)], fields, sizeof(fields));
  randombytes_buf(&h.bytes[sizeof(kMagic) + sizeof(fields)], kNonceBytes);
  return h;
}

std::array<uint8_t, kTagBytes> Tag(std::span<const uint8_t> label, const Hello& hello,
                                   std::span<const uint8_t> nonce, const SecretBytes& key) {
  return crypto::Hash256({label, hello.bytes, nonce}, key.bytes());
}

// Waits until `fd` has `events` or `deadline` passes (false).
bool PollOne(int fd, short events, TimeMs deadline) {
  for (;;) {
    const TimeMs left = deadline - SteadyNowMs();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<TimeMs>(left, 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// Reads or writes exactly `n` bytes on a non-blocking socket by `deadline`.
bool ReadExact(int fd, uint8_t* p, size_t n, TimeMs deadline) {
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= size_t(got);
    } else if (got == 0 || (errno != EAGAIN && errno != EINTR) || !PollOne(fd, POLLIN, deadline)) {
      return false;
    }
  }
  return true;
}
bool WriteExact(int fd, const uint8_t* p, size_t n, TimeMs deadline) {
  while (n > 0) {
    const ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
    if (put > 0) {
      p += put;
      n -= size_t(put);
    } else if (put == 0 || (errno != EAGAIN && errno != EINTR) || !PollOne(fd, POLLOUT, deadline)) {
      return false;
    }
  }
  return true;
}

std::string AddressOf(const sockaddr_storage& a, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return std::string(host) + ":" + port;
}

}  // namespace

Status ConnectorHandshake(int fd, int size, int from, int to, const SecretBytes& key,
                          TimeMs deadline, bool* retry) {
  *retry = true;
  const Hello hello = MakeHello(size, from, to);
  std::array<uint8_t, kReplyBytes> reply;
  if (!WriteExact(fd, hello.bytes.data(), hello.bytes.size(), deadline) ||
      !ReadExact(fd, reply.data(), reply.size(), deadline)) {
    return UnavailableError("did not answer the handshake");
  }
  const std::span<const uint8_t> nonce(reply.data(), kNonceBytes);
  const auto expected = Tag(kAcceptorLabel, hello, nonce, key);
  if (crypto_verify_32(expected.data(), reply.data() + kNonceBytes) != 0) {
    *retry = false;
    return UnavailableError("did not prove the key of the pair (a stranger, or another key)");
  }
  const auto tag = Tag(kConnectorLabel, hello, nonce, key);
  if (!WriteExact(fd, tag.data(), tag.size(), deadline)) {
    return UnavailableError("closed the handshake");
  }
  return OkStatus();
}

struct HandshakeAcceptor::Pending {
  int fd = -1;
  std::string address;
  TimeMs deadline = 0;
  enum class Stage { kHello, kReply, kProof } stage = Stage::kHello;
  Hello hello;
  std::array<uint8_t, kReplyBytes> reply{};
  std::array<uint8_t, kTagBytes> proof{};
  size_t done = 0;  // Bytes of the current stage moved so far.
};

HandshakeAcceptor::HandshakeAcceptor(int listen_fd, const Options& options)
    : listen_fd_(listen_fd), options_(options) {}

HandshakeAcceptor::~HandshakeAcceptor() {
  for (auto& p : pending_) close(p->fd);
}

void HandshakeAcceptor::Refuse(Pending& p, const std::string& why) {
  spdlog::warn("tcp transport: rank {} refused a connection from {}: {}", options_.rank, p.address,
               why);
  close(p.fd);
  p.fd = -1;
  ++refused_;
}

Status HandshakeAcceptor::AcceptNew(TimeMs now) {
  // Everything that is waiting is accepted: a full set of pending handshakes
  // makes room by evicting its oldest, so strangers that connect and say
  // nothing, however many, cannot keep a real rank in the listen backlog.
  // At most max_pending per call, so that each connection accepted here is
  // read at least once (a real rank's hello is there by then) before a
  // newer one can evict it.
  for (size_t fresh = 0; fresh < options_.max_pending; ++fresh) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Linux hands pending network errors of the new connection to
      // accept(); like EAGAIN, they are the next connection's business.
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED || errno == EPROTO ||
          errno == ENETDOWN || errno == ENOPROTOOPT || errno == EHOSTDOWN || errno == ENONET ||
          errno == EHOSTUNREACH || errno == EOPNOTSUPP || errno == ENETUNREACH) {
        return OkStatus();
      }
      return UnavailableError(std::string("tcp transport: cannot accept: ") + std::strerror(errno));
    }
    if (pending_.size() >= options_.max_pending) EvictOldest(pending_.size() - fresh);
    auto p = std::make_unique<Pending>();
    p->fd = fd;
    p->address = AddressOf(addr, len);
    p->deadline = now + options_.timeout_ms;
    pending_.push_back(std::move(p));
  }
  return OkStatus();
}

void HandshakeAcceptor::EvictOldest(size_t among) {
  // pending_ is in the order of arrival. The oldest that has not even sent
  // a whole hello goes first (a real rank sends its hello at once); when
  // every one has, the oldest of all.
  auto victim = pending_.begin();
  for (auto it = pending_.begin(); it != pending_.begin() + among; ++it) {
    if ((*it)->stage == Pending::Stage::kHello) {
      victim = it;
      break;
    }
  }
  Refuse(**victim, std::to_string(pending_.size()) +
                       " handshakes were pending, it was the oldest: evicted for a newer one");
  pending_.erase(victim);
}

// Moves one handshake on as far as its socket allows without waiting.
HandshakeAcceptor::Step HandshakeAcceptor::Advance(Pending& p,
                                                   const std::function<bool(int)>& wanted,
                                                   std::string* why) {
  using Stage = Pending::Stage;
  for (;;) {
    const bool writing = p.stage == Stage::kReply;
    uint8_t* at = p.stage == Stage::kHello   ? p.hello.bytes.data()
                  : p.stage == Stage::kReply ? p.reply.data()
                                             : p.proof.data();
    const size_t total = p.stage == Stage::kHello   ? kHelloBytes
                         : p.stage == Stage::kReply ? kReplyBytes
                                                    : kTagBytes;
    const ssize_t n = writing ? send(p.fd, at + p.done, total - p.done, MSG_NOSIGNAL)
                              : recv(p.fd, at + p.done, total - p.done, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Step::kMore;
    if (n <= 0) {
      *why = n == 0 ? "it closed the connection during the handshake" : std::strerror(errno);
      return Step::kRefused;
    }
    p.done += size_t(n);
    if (p.done < total) continue;
    p.done = 0;
    const uint32_t from = p.hello.from();
    if (p.stage == Stage::kHello) {
      if (!p.hello.magic_ok() || p.hello.version() != kVersion) {
        *why = "not a cohort tcp hello";
        return Step::kRefused;
      }
      if (p.hello.size() != uint32_t(options_.size) || p.hello.to() != uint32_t(options_.rank) ||
          from >= uint32_t(options_.rank)) {
        *why = "a hello from rank " + std::to_string(from) + " of " +
               std::to_string(p.hello.size()) + " for rank " + std::to_string(p.hello.to());
        return Step::kRefused;
      }
      randombytes_buf(p.reply.data(), kNonceBytes);
      const auto tag = Tag(kAcceptorLabel, p.hello, std::span(p.reply.data(), kNonceBytes),
                           (*options_.keys)[from]);
      std::memcpy(p.reply.data() + kNonceBytes, tag.data(), kTagBytes);
      p.stage = Stage::kReply;
    } else if (p.stage == Stage::kReply) {
      p.stage = Stage::kProof;
    } else {
      const auto expected = Tag(kConnectorLabel, p.hello, std::span(p.reply.data(), kNonceBytes),
                                (*options_.keys)[from]);
      if (crypto_verify_32(expected.data(), p.proof.data()) != 0) {
        *why = "a connection claiming rank " + std::to_string(from) +
               " did not prove the key of the pair";
        return Step::kRefused;
      }
      if (!wanted(int(from))) {
        *why = "rank " + std::to_string(from) + " is already connected";
        return Step::kRefused;
      }
      return Step::kAccepted;
    }
  }
}

StatusOr<HandshakeAcceptor::Accepted> HandshakeAcceptor::Next(
    TimeMs deadline, const std::function<bool(int)>& wanted) {
  for (;;) {
    const TimeMs now = SteadyNowMs();
    TimeMs wake = deadline;
    std::vector<pollfd> fds;
    for (auto& p : pending_) {
      if (p->fd < 0) continue;
      if (p->deadline <= now) {
        Refuse(*p, "no complete handshake in time");
        continue;
      }
      wake = std::min(wake, p->deadline);
      fds.push_back({p->fd, short(p->stage == Pending::Stage::kReply ? POLLOUT : POLLIN), 0});
    }
    std::erase_if(pending_, [](const auto& p) { return p->fd < 0; });
    if (now >= deadline) return DeadlineExceededError("no connection in time");
    fds.push_back({listen_fd_, POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), int(std::clamp<TimeMs>(wake - now, 0, 1000)));
    if (n < 0 && errno != EINTR)
      return UnavailableError(std::string("poll: ") + std::strerror(errno));
    COHORT_RETURN_IF_ERROR(AcceptNew(SteadyNowMs()));
    for (auto& p : pending_) {
      std::string why;
      switch (Advance(*p, wanted, &why)) {
        case Step::kMore:
          break;
        case Step::kRefused:
          Refuse(*p, why);
          break;
        case Step::kAccepted: {
          Accepted a{int(p->hello.from()), p->fd};
          p->fd = -1;
          std::erase_if(pending_, [](const auto& q) { return q->fd < 0; });
          return a;
        }
      }
    }
  }
}

}  // namespace cohort::net
