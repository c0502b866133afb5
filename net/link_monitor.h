// What an outgoing ZeroMQ connection has been through, read from its socket
// monitor: whether anything answers at the address, whether the security
// handshake passed or how it failed, and when the connection last closed.
// A daemon that waits on a peer uses it to say why (client/wait_report.h).
#ifndef COHORT_NET_LINK_MONITOR_H_
#define COHORT_NET_LINK_MONITOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/status.h"

namespace cohort::net {

// How the last security handshake failed.
enum class HandshakeFailure {
  kNone,
  kRefused,    // The peer's authenticator refused this side (ZAP status in `failure_code`).
  kMechanism,  // The two sides use different security mechanisms (CURVE vs none).
  kProtocol,   // Another protocol error (ZMQ_PROTOCOL_ERROR_* in `failure_code`).
  kNoDetail,   // The peer closed the connection during the handshake.
};

struct LinkEvents {
  TimeMs since = 0;                    // When watching began.
  std::optional<TimeMs> connected;     // The last TCP connection made.
  std::optional<TimeMs> handshaken;    // The last handshake that passed.
  std::optional<TimeMs> disconnected;  // The last connection that closed.
  std::optional<TimeMs> retried;       // The last connect attempt refused or timed out.
  HandshakeFailure failure = HandshakeFailure::kNone;
  uint32_t failure_code = 0;
  std::optional<TimeMs> failed;  // When `failure` happened.
  uint64_t failures = 0;         // Handshakes failed so far.

  // Handshaken and not closed since.
  bool up() const { return handshaken && (!disconnected || *disconnected < *handshaken); }
};

// One event from a ZeroMQ socket monitor (v1: 2 bytes event, 4 bytes value
// in native order, then a frame with the endpoint).
struct MonitorEvent {
  uint16_t event = 0;  // ZMQ_EVENT_*; 0 for a malformed head (no such event).
  uint32_t value = 0;
};
// The next queued event, without blocking; nullopt when none is queued.
std::optional<MonitorEvent> ReceiveMonitorEvent(zmq::socket_t& monitor);

// Folds one monitor event (ZMQ_EVENT_*, with its value) at `now` into `e`.
void ApplyLinkEvent(LinkEvents& e, uint16_t event, uint32_t value, TimeMs now);

// Watches one connecting socket from the thread that owns it: Poll() reads
// the queued events without blocking.
class LinkMonitor {
 public:
  // Call before `socket` connects. Destroy the monitor before `socket`.
  static StatusOr<std::unique_ptr<LinkMonitor>> Watch(zmq::context_t& context,
                                                      zmq::socket_t& socket, TimeMs now);
  ~LinkMonitor();
  LinkMonitor(const LinkMonitor&) = delete;
  LinkMonitor& operator=(const LinkMonitor&) = delete;

  // Reads every queued event, stamping them `now`.
  void Poll(TimeMs now);
  const LinkEvents& events() const { return events_; }

 private:
  LinkMonitor(zmq::context_t& context, zmq::socket_t& socket, TimeMs now);
  zmq::socket_t* watched_;
  zmq::socket_t monitor_;
  LinkEvents events_;
};

}  // namespace cohort::net

#endif  // COHORT_NET_LINK_MONITOR_H_
