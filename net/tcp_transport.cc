#include "net/tcp_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "common/bytes.h"
#include "net/tcp_handshake.h"

namespace cohort::net {
namespace {

void SetSocketOptions(int fd, size_t window) {
  const int one = 1, bytes = static_cast<int>(window);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

// "tcp://HOST:PORT" (HOST may be [IPv6]) -> host, port.
bool SplitEndpoint(const std::string& endpoint, std::string* host, std::string* port) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return false;
  *host = rest.substr(0, colon);
  *port = rest.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return true;
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

}  // namespace

struct TcpTransport::Peer {
  int fd = -1;
  // The message being received: its length prefix, then its bytes.
  uint8_t prefix[4] = {};
  size_t prefix_got = 0;
  std::shared_ptr<std::vector<uint8_t>> buffer;
  size_t want = 0, got = 0;
  // What the socket has not taken yet, in order.
  std::deque<std::vector<uint8_t>> queue;
  size_t queue_offset = 0;  // Into queue.front().
  // Not OK once the stream broke (closed, reset, or a message it could not
  // be): every later call about this peer returns it.
  Status error;
};

// Receive buffers go back here when their Message is destroyed.
struct TcpTransport::Pool {
  std::vector<std::vector<uint8_t>*> free;
  ~Pool() {
    for (auto* b : free) delete b;
  }
};

TcpTransport::TcpTransport(int rank, int size, const TcpTransportOptions& options)
    : rank_(rank), size_(size), options_(options), pool_(std::make_shared<Pool>()) {
  for (int r = 0; r < size; ++r) peers_.push_back(std::make_unique<Peer>());
}

TcpTransport::~TcpTransport() {
  if (listen_fd_ >= 0) close(listen_fd_);
  for (auto& p : peers_) {
    if (p->fd >= 0) close(p->fd);
  }
}

StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Listen(int rank, int size,
                                                             const std::string& host,
                                                             const TcpTransportOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("tcp transport: rank " + std::to_string(rank) + " of " +
                                std::to_string(size));
  }
  std::unique_ptr<TcpTransport> t(new TcpTransport(rank, size, options));
  AddrInfo ai;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host.c_str(), "0", &hints, &ai.list) != 0 || ai.list == nullptr) {
    return InvalidArgumentError("tcp transport: cannot resolve host \"" + host + "\"");
  }
  const int fd = socket(ai.list->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  t->listen_fd_ = fd;
  // Accepted sockets inherit the receive buffer (window scaling is agreed
  // in the SYN).
  SetSocketOptions(fd, options.window_bytes);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  // The longest backlog the kernel allows (net.core.somaxconn): the
  // acceptor takes everything in it, and a full one would drop a real
  // rank's SYN for a second.
  if (fd < 0 || bind(fd, ai.list->ai_addr, ai.list->ai_addrlen) != 0 ||
      listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return UnavailableError("tcp transport: cannot listen on " + host + ": " +
                            std::strerror(errno));
  }
  const int port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  const bool v6 = host.find(':') != std::string::npos;
  t->endpoint_ = "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  return t;
}

Status TcpTransport::Connect(const std::vector<std::string>& endpoints,
                             std::vector<SecretBytes> pair_keys, TimeMs deadline) {
  if (endpoints.size() != static_cast<size_t>(size_)) {
    return InvalidArgumentError("tcp transport: " + std::to_string(endpoints.size()) +
                                " endpoints for " + std::to_string(size_) + " ranks");
  }
  if (!pair_keys.empty()) {
    if (pair_keys.size() != static_cast<size_t>(size_)) {
      return InvalidArgumentError("tcp transport: keys for " + std::to_string(pair_keys.size()) +
                                  " ranks, not " + std::to_string(size_));
    }
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && pair_keys[r].size() != 32) {
        return InvalidArgumentError("tcp transport: the key shared with rank " + std::to_string(r) +
                                    " is not 32 bytes");
      }
    }
  }
  keys_ = std::move(pair_keys);
  if (keys_.empty()) keys_.resize(size_);  // Empty keys: unkeyed tags.
  // Lower ranks connect to higher ones: the highest rank only accepts, so
  // the waits cannot form a cycle.
  for (int r = rank_ + 1; r < size_; ++r) {
    COHORT_RETURN_IF_ERROR(ConnectTo(r, endpoints[r], deadline));
  }
  HandshakeAcceptor acceptor(
      listen_fd_,
      {.rank = rank_, .size = size_, .keys = &keys_, .timeout_ms = options_.handshake_timeout_ms});
  auto unconnected = [&](int r) { return peers_[r]->fd < 0; };
  for (std::string missing = Missing(); !missing.empty(); missing = Missing()) {
    auto a = acceptor.Next(deadline, unconnected);
    if (!a.ok() && a.status().code() == StatusCode::kDeadlineExceeded) {
      refused_ = acceptor.refused();
      return DeadlineExceededError("tcp transport: rank(s) " + missing +
                                   " did not connect to rank " + std::to_string(rank_));
    }
    COHORT_RETURN_IF_ERROR(a.status());
    SetSocketOptions(a->fd, options_.window_bytes);
    peers_[a->from]->fd = a->fd;
  }
  refused_ = acceptor.refused();
  close(listen_fd_);  // Every peer is here: nobody else may connect.
  listen_fd_ = -1;
  for (SecretBytes& k : keys_) k.Reset();  // Only the handshakes needed them.
  keys_.clear();
  return OkStatus();
}

std::string TcpTransport::Missing() const {
  std::string list;
  for (int r = 0; r < rank_; ++r) {
    if (peers_[r]->fd < 0) list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  return list;
}

// Connects and runs the handshake, again while the peer does not answer in
// time (it may be busy connecting to the ranks above it) until `deadline`.
Status TcpTransport::ConnectTo(int peer, const std::string& endpoint, TimeMs deadline) {
  const std::string who = "rank " + std::to_string(peer) + " at " + endpoint;
  std::string host, port;
  if (!SplitEndpoint(endpoint, &host, &port)) {
    return InvalidArgumentError("tcp transport: " + who + ": expected tcp://HOST:PORT");
  }
  AddrInfo ai;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &ai.list) != 0 || ai.list == nullptr) {
    return UnavailableError("tcp transport: cannot resolve " + who);
  }
  TimeMs backoff = 20;
  for (;;) {
    const int fd = socket(ai.list->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return UnavailableError(std::string("tcp transport: socket: ") + std::strerror(errno));
    SetSocketOptions(fd, options_.window_bytes);
    const TimeMs attempt = std::min(deadline, SteadyNowMs() + options_.handshake_timeout_ms);
    bool retry = true;
    Status st = OkStatus();
    if (connect(fd, ai.list->ai_addr, ai.list->ai_addrlen) != 0 && errno != EINPROGRESS) {
      st = UnavailableError(std::string("cannot connect: ") + std::strerror(errno));
    } else {
      st = ConnectorHandshake(fd, size_, rank_, peer, keys_[peer], attempt, &retry);
    }
    if (st.ok()) {
      peers_[peer]->fd = fd;
      return OkStatus();
    }
    close(fd);
    if (!retry || SteadyNowMs() >= deadline) {
      return UnavailableError("tcp transport: " + who + " " + std::string(st.message()));
    }
    // Failed before its time (refused, reset): back off, doubling to 1 s.
    if (SteadyNowMs() < attempt) poll(nullptr, 0, int(backoff));
    backoff = std::min<TimeMs>(backoff * 2, 1000);
  }
}

Status TcpTransport::Break(int peer, Status why) {
  Peer& p = *peers_[peer];
  if (p.fd >= 0) close(p.fd);
  p.fd = -1;
  if (!p.queue.empty()) --queued_peers_;
  p.queue.clear();
  p.queue_offset = 0;
  p.buffer.reset();
  p.prefix_got = 0;
  p.error = why;
  return why;
}

Status TcpTransport::PeerError(int peer, const char* what, int err) const {
  if (err == ECONNRESET || err == EPIPE) {
    return UnavailableError("tcp transport: rank " + std::to_string(peer) +
                            " closed its connection (its process is gone?)");
  }
  return UnavailableError("tcp transport: " + std::string(what) + " rank " + std::to_string(peer) +
                          ": " + std::strerror(err));
}

Status TcpTransport::Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) {
  if (peer >= 0 && peer < size_ && !peers_[peer]->error.ok()) return peers_[peer]->error;
  if (peer < 0 || peer >= size_ || peer == rank_ || peers_[peer]->fd < 0) {
    return InvalidArgumentError("send to rank " + std::to_string(peer) + " from rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  const size_t total = head.size() + body.size();
  if (total == 0 || total > options_.max_message_bytes) {
    return InvalidArgumentError("tcp transport: a message of " + std::to_string(total) +
                                " bytes (1 to " + std::to_string(options_.max_message_bytes) + ")");
  }
  Peer& p = *peers_[peer];
  uint8_t prefix[4];
  const uint32_t length = static_cast<uint32_t>(total);
  std::memcpy(prefix, &length, 4);
  const std::span<const uint8_t> parts[3] = {{prefix, 4}, head, body};
  size_t sent = 0;
  if (p.queue.empty()) {
    iovec iov[3];
    for (int i = 0; i < 3; ++i) iov[i] = {const_cast<uint8_t*>(parts[i].data()), parts[i].size()};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 3;
    const ssize_t n = sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return Break(peer, PeerError(peer, "send to", errno));
    }
    sent = n > 0 ? size_t(n) : 0;
    if (sent == total + 4) return OkStatus();
  }
  // The rest waits in the queue (one copy), written by later calls.
  std::vector<uint8_t> rest;
  rest.reserve(total + 4 - sent);
  size_t skip = sent;
  for (const auto& part : parts) {
    const size_t from = std::min(skip, part.size());
    rest.insert(rest.end(), part.begin() + from, part.end());
    skip -= from;
  }
  if (p.queue.empty()) ++queued_peers_;
  p.queue.push_back(std::move(rest));
  return WriteQueued(peer);
}

Status TcpTransport::WriteQueued(int peer) {
  Peer& p = *peers_[peer];
  while (!p.queue.empty()) {
    const std::vector<uint8_t>& front = p.queue.front();
    const ssize_t n = send(p.fd, front.data() + p.queue_offset, front.size() - p.queue_offset,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return OkStatus();
      return Break(peer, PeerError(peer, "send to", errno));
    }
    p.queue_offset += size_t(n);
    if (p.queue_offset == front.size()) {
      p.queue.pop_front();
      p.queue_offset = 0;
      if (p.queue.empty()) --queued_peers_;
    }
  }
  return OkStatus();
}

Status TcpTransport::Wait(int peer, TimeMs deadline) {
  std::vector<pollfd> fds;
  std::vector<int> ranks;
  if (peer >= 0) {
    fds.push_back({peers_[peer]->fd, POLLIN, 0});
    ranks.push_back(peer);
  }
  for (int r = 0; r < size_; ++r) {
    if (peers_[r]->queue.empty() || peers_[r]->fd < 0) continue;
    if (r == peer) {
      fds[0].events |= POLLOUT;
    } else {
      fds.push_back({peers_[r]->fd, POLLOUT, 0});
      ranks.push_back(r);
    }
  }
  const TimeMs left = deadline - SteadyNowMs();
  if (left <= 0 || fds.empty()) return OkStatus();
  const int n = poll(fds.data(), fds.size(), static_cast<int>(std::min<TimeMs>(left, 1000)));
  if (n < 0 && errno != EINTR)
    return UnavailableError(std::string("poll: ") + std::strerror(errno));
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLOUT | POLLERR | POLLHUP)) != 0 && !peers_[ranks[i]]->queue.empty()) {
      // A failure breaks that peer; it is reported when someone waits on it.
      (void)WriteQueued(ranks[i]);
    }
  }
  return OkStatus();
}

StatusOr<collective::Message> TcpTransport::Receive(int peer, TimeMs deadline) {
  if (peer >= 0 && peer < size_ && !peers_[peer]->error.ok()) return peers_[peer]->error;
  if (peer < 0 || peer >= size_ || peer == rank_ || peers_[peer]->fd < 0) {
    return InvalidArgumentError("receive from rank " + std::to_string(peer) + " on rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  Peer& p = *peers_[peer];
  for (;;) {
    // The length prefix, then the bytes, as far as they have come.
    uint8_t* into = p.prefix_got < 4 ? p.prefix + p.prefix_got : p.buffer->data() + p.got;
    const size_t want = p.prefix_got < 4 ? 4 - p.prefix_got : p.want - p.got;
    const ssize_t n = recv(p.fd, into, want, MSG_DONTWAIT);
    if (n == 0) {
      return Break(peer, UnavailableError("tcp transport: rank " + std::to_string(peer) +
                                          " closed its connection (its process is gone?)"));
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) {
        return Break(peer, PeerError(peer, "receive from", errno));
      }
      if (SteadyNowMs() >= deadline) {
        return DeadlineExceededError("nothing from rank " + std::to_string(peer) + " in time");
      }
      COHORT_RETURN_IF_ERROR(Wait(peer, deadline));
      if (!p.error.ok()) return p.error;  // A write to it failed meanwhile.
      continue;
    }
    if (p.prefix_got < 4) {
      p.prefix_got += size_t(n);
      if (p.prefix_got < 4) continue;
      p.want = GetU32(p.prefix);
      if (p.want == 0 || p.want > options_.max_message_bytes) {
        return Break(peer, DataLossError("tcp transport: rank " + std::to_string(peer) +
                                         " sent a message of " + std::to_string(p.want) +
                                         " bytes (at most " +
                                         std::to_string(options_.max_message_bytes) + ")"));
      }
      std::vector<uint8_t>* b = nullptr;
      if (!pool_->free.empty()) {
        b = pool_->free.back();
        pool_->free.pop_back();
      } else {
        b = new std::vector<uint8_t>();
      }
      if (b->size() < p.want) b->resize(p.want);
      std::weak_ptr<Pool> pool = pool_;
      p.buffer.reset(b, [pool](std::vector<uint8_t>* v) {
        auto owner = pool.lock();
        if (owner != nullptr && owner->free.size() < 64) {
          owner->free.push_back(v);
        } else {
          delete v;
        }
      });
      p.got = 0;
      continue;
    }
    p.got += size_t(n);
    if (p.got < p.want) continue;
    collective::Message m(p.buffer, {p.buffer->data(), p.want});
    p.buffer.reset();
    p.prefix_got = 0;
    return m;
  }
}

Status TcpTransport::Flush(TimeMs deadline) {
  for (const auto& p : peers_) {
    if (!p->error.ok()) return p->error;
  }
  while (queued_peers_ > 0) {
    if (SteadyNowMs() >= deadline) {
      for (int r = 0; r < size_; ++r) {
        if (!peers_[r]->queue.empty()) {
          return DeadlineExceededError("tcp transport: rank " + std::to_string(r) +
                                       " took nothing in time");
        }
      }
    }
    COHORT_RETURN_IF_ERROR(Wait(-1, deadline));
    for (const auto& p : peers_) {
      if (!p->error.ok()) return p->error;
    }
  }
  return OkStatus();
}

}  // namespace cohort::net
