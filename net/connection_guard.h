// Limits on connections that have not authenticated yet. Until its handshake
// (CURVE, then the ZAP allowlist) succeeds, any TCP peer can make ZeroMQ
// buffer one frame of up to ZMQ_MAXMSGSIZE bytes per connection; a handshake
// timeout bounds how long, and the guard bounds how many such connections are
// open at once. Past the cap, the newest connection is dropped, and the drops
// are logged, one warning per interval.
#ifndef COHORT_NET_CONNECTION_GUARD_H_
#define COHORT_NET_CONNECTION_GUARD_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/status.h"

namespace cohort::net {

// Defaults for a listening socket (the coordinator's ROUTER).
inline constexpr int kHandshakeTimeoutMs = 5000;
inline constexpr size_t kMaxUnauthenticatedConnections = 64;
inline constexpr TimeMs kDropReportIntervalMs = 10000;

// The bookkeeping, without sockets. Keyed by the connection's file
// descriptor, which stays unique while the connection is open. Not
// thread-safe.
class PendingConnections {
 public:
  // `cap`: connections that may be pending at once. `expire_ms`: a pending
  // entry older than this is forgotten (ZeroMQ's handshake timeout has ended
  // that connection, or it authenticated without being reported).
  PendingConnections(size_t cap, TimeMs expire_ms, TimeMs report_interval_ms);

  // A connection was accepted on `fd`. True: it is pending now. False: `cap`
  // connections are pending already; the caller drops this one.
  bool OnAccepted(int fd, TimeMs now);
  // The connection on `fd` authenticated, or closed: it is no longer pending.
  // Unknown descriptors are ignored.
  void OnAuthenticated(int fd);
  void OnClosed(int fd);

  size_t pending() const { return pending_.size(); }
  uint64_t dropped_total() const { return dropped_total_; }

  struct DropReport {
    uint64_t dropped = 0;  // Since the last report.
    TimeMs span_ms = 0;    // Time since the last report (or since the start).
  };
  // Drops not reported yet, at most once per report interval (`flush`:
  // whenever there are any). dropped == 0: nothing to report now.
  DropReport TakeReport(TimeMs now, bool flush = false);

 private:
  void Expire(TimeMs now);

  size_t cap_;
  TimeMs expire_ms_;
  TimeMs report_interval_ms_;
  std::map<int, TimeMs> pending_;  // fd -> accepted at.
  uint64_t dropped_total_ = 0;
  uint64_t unreported_ = 0;
  std::optional<TimeMs> last_report_;
};

struct GuardOptions {
  size_t max_unauthenticated = kMaxUnauthenticatedConnections;
  // The socket's ZMQ_HANDSHAKE_IVL; entries older than this (plus a second)
  // are forgotten.
  int handshake_timeout_ms = kHandshakeTimeoutMs;
  TimeMs report_interval_ms = kDropReportIntervalMs;
};

// Watches a listening socket through a ZeroMQ socket monitor on a thread of
// its own: each accepted connection is pending until a message arrives on it
// (Authenticated()) or it closes; one accepted while `max_unauthenticated`
// are pending is shut down at once (shutdown(2) on its descriptor, which
// makes ZeroMQ close it; the descriptor stays ZeroMQ's).
//
// libzmq 4.3's monitor names no connection in its handshake events, hence
// "a message arrived" as the sign of authentication (under CURVE none
// arrives before ZAP has admitted the key), and the expiry after the
// handshake timeout for a connection that authenticates and stays silent.
class ConnectionGuard {
 public:
  // Call before `socket` binds. The guard must be destroyed before `socket`
  // and `context`, on the thread that owns `socket`. kUnavailable when the
  // monitor cannot be started.
  static StatusOr<std::unique_ptr<ConnectionGuard>> Watch(zmq::context_t& context,
                                                          zmq::socket_t& socket,
                                                          const GuardOptions& options = {});
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // A message arrived on the connection with descriptor `fd`
  // (RawMessage::source_fd; -1 is ignored). Thread-safe.
  void Authenticated(int fd);

  size_t pending() const;
  uint64_t dropped() const;

 private:
  ConnectionGuard(zmq::context_t& context, zmq::socket_t& socket, const GuardOptions& options);
  void Run();
  void HandleEvent(uint16_t event, uint32_t value);
  void Report(bool flush);

  zmq::socket_t* watched_;
  zmq::socket_t monitor_;
  GuardOptions options_;
  mutable std::mutex mu_;
  PendingConnections connections_;  // Guarded by mu_.
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace cohort::net

#endif  // COHORT_NET_CONNECTION_GUARD_H_
