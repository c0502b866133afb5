#include "net/link_monitor.h"

#include <atomic>
#include <cstring>
#include <string>

namespace cohort::net {

void ApplyLinkEvent(LinkEvents& e, uint16_t event, uint32_t value, TimeMs now) {
  switch (event) {
    case ZMQ_EVENT_CONNECTED:
      e.connected = now;
      break;
    case ZMQ_EVENT_CONNECT_RETRIED:
      e.retried = now;
      break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
      e.handshaken = now;
      e.failure = HandshakeFailure::kNone;
      break;
    case ZMQ_EVENT_DISCONNECTED:
      e.disconnected = now;
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
      HandshakeFailure f = HandshakeFailure::kNoDetail;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) f = HandshakeFailure::kRefused;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        f = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? HandshakeFailure::kMechanism
                                                                : HandshakeFailure::kProtocol;
      }
      // A refusal or a mismatch says more than the closes that follow it,
      // until a handshake passes.
      if (f == HandshakeFailure::kNoDetail &&
          (e.failure == HandshakeFailure::kRefused || e.failure == HandshakeFailure::kMechanism)) {
        break;
      }
      e.failure = f;
      e.failure_code = value;
      e.failed = now;
      ++e.failures;
      break;
    }
    default:
      break;
  }
}

namespace {

std::string MonitorEndpoint() {
  static std::atomic<uint64_t> counter{0};
  return "inproc://cohort.link-monitor." + std::to_string(counter.fetch_add(1));
}

constexpr int kEvents = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED |
                        ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;

}  // namespace

LinkMonitor::LinkMonitor(zmq::context_t& context, zmq::socket_t& socket, TimeMs now)
    : watched_(&socket), monitor_(context, zmq::socket_type::pair) {
  events_.since = now;
}

StatusOr<std::unique_ptr<LinkMonitor>> LinkMonitor::Watch(zmq::context_t& context,
                                                          zmq::socket_t& socket, TimeMs now) {
  std::unique_ptr<LinkMonitor> m(new LinkMonitor(context, socket, now));
  const std::string endpoint = MonitorEndpoint();
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), kEvents) != 0) {
    return UnavailableError(std::string("cannot monitor the connection: ") +
                            zmq_strerror(zmq_errno()));
  }
  try {
    m->monitor_.set(zmq::sockopt::linger, 0);
    // Connected before any event: libzmq's end of the monitor would block
    // its I/O thread on an event sent while no one is connected.
    m->monitor_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(socket.handle(), nullptr, 0);
    return UnavailableError(std::string("cannot connect the connection monitor: ") + e.what());
  }
  return m;
}

LinkMonitor::~LinkMonitor() { zmq_socket_monitor(watched_->handle(), nullptr, 0); }

std::optional<MonitorEvent> ReceiveMonitorEvent(zmq::socket_t& monitor) {
  zmq::message_t head;
  if (!monitor.recv(head, zmq::recv_flags::dontwait)) return std::nullopt;
  bool more = head.more();
  while (more) {
    zmq::message_t rest;
    if (!monitor.recv(rest, zmq::recv_flags::none)) break;
    more = rest.more();
  }
  MonitorEvent e;
  if (head.size() != sizeof(e.event) + sizeof(e.value)) return e;
  std::memcpy(&e.event, head.data(), sizeof(e.event));
  std::memcpy(&e.value, static_cast<const char*>(head.data()) + sizeof(e.event), sizeof(e.value));
  return e;
}

void LinkMonitor::Poll(TimeMs now) {
  for (int budget = 0; budget < 1000; ++budget) {
    std::optional<MonitorEvent> e = ReceiveMonitorEvent(monitor_);
    if (!e) return;
    ApplyLinkEvent(events_, e->event, e->value, now);
  }
}

}  // namespace cohort::net
