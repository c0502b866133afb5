// The handshake that opens each connection of a TcpTransport and binds it
// to one rank. The connecting (lower) rank sends a hello: magic, version,
// world size, its rank, the rank it wants, a fresh nonce. The accepting rank
// answers with a nonce of its own and its proof, keyed BLAKE2b over the
// hello and its nonce under the acceptor's label; the connector checks it
// and sends its proof under the connector's label. The key is the pair's
// (empty: unkeyed, which checks only the numbers). Both nonces are fresh, so
// a recorded handshake cannot be replayed, and the labels differ, so one
// side's proof cannot be reflected as the other's.
#ifndef COHORT_NET_TCP_HANDSHAKE_H_
#define COHORT_NET_TCP_HANDSHAKE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/secret_bytes.h"
#include "common/status.h"

namespace cohort::net {

// The connector's side on a connected non-blocking socket, by `deadline`.
// kUnavailable with *retry true when the peer did not answer in time or
// closed (a new connection may succeed), false when it answered with a
// proof of another key (it never will).
Status ConnectorHandshake(int fd, int size, int from, int to, const SecretBytes& key,
                          TimeMs deadline, bool* retry);

// The acceptor's side: every connection to one listening socket, their
// handshakes run side by side in one poll loop, each with its own timeout
// and at most `max_pending` at once; a newer connection beyond that evicts
// the oldest (first those that have not sent a whole hello), so strangers
// that connect and say nothing, however many, delay no one. A refused or
// evicted connection is closed, logged with its address and counted.
class HandshakeAcceptor {
 public:
  struct Options {
    int rank = 0, size = 1;
    const std::vector<SecretBytes>* keys = nullptr;  // keys[r]: the pair's key with rank r.
    int timeout_ms = 5000;                           // Per connection.
    size_t max_pending = 64;
  };
  HandshakeAcceptor(int listen_fd, const Options& options);
  ~HandshakeAcceptor();  // Closes connections whose handshake did not finish.
  HandshakeAcceptor(const HandshakeAcceptor&) = delete;
  HandshakeAcceptor& operator=(const HandshakeAcceptor&) = delete;

  struct Accepted {
    int from = -1;  // The lower rank that proved the pair's key.
    int fd = -1;    // Its connection, now the caller's.
  };
  // Waits until a lower rank for which `wanted(rank)` holds has finished its
  // handshake; kDeadlineExceeded at `deadline`; kUnavailable when the
  // socket cannot accept (out of file descriptors).
  StatusOr<Accepted> Next(TimeMs deadline, const std::function<bool(int)>& wanted);
  uint64_t refused() const { return refused_; }

  struct Pending;  // One handshake in progress (tcp_handshake.cc).

 private:
  enum class Step { kMore, kAccepted, kRefused };
  Step Advance(Pending& p, const std::function<bool(int)>& wanted, std::string* why);
  Status AcceptNew(TimeMs now);
  // Refuses and drops one of the `among` oldest pending handshakes.
  void EvictOldest(size_t among);
  void Refuse(Pending& p, const std::string& why);

  int listen_fd_;
  Options options_;
  std::vector<std::unique_ptr<Pending>> pending_;
  uint64_t refused_ = 0;
};

}  // namespace cohort::net

#endif  // COHORT_NET_TCP_HANDSHAKE_H_
