#include "net/zmq_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "net/curve.h"

namespace cohort::net {
namespace {

// Monitor endpoints are per context: a counter keeps every one unique.
std::atomic<uint64_t> monitor_count{0};

}  // namespace

ZmqTransport::ZmqTransport(zmq::context_t& context, int rank, int size,
                           const ZmqTransportOptions& options)
    : context_(context),
      rank_(rank),
      size_(size),
      options_(options),
      inbox_(context, zmq::socket_type::pull),
      pending_(size) {}

StatusOr<std::unique_ptr<ZmqTransport>> ZmqTransport::Bind(zmq::context_t& context, int rank,
                                                           int size, const std::string& bind,
                                                           const ZmqTransportOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of a group of " +
                                std::to_string(size));
  }
  std::unique_ptr<ZmqTransport> t(new ZmqTransport(context, rank, size, options));
  try {
    t->inbox_.set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
    t->inbox_.set(zmq::sockopt::rcvhwm, options.receive_queue);
    t->inbox_.set(zmq::sockopt::linger, 0);
    if (options.curve != nullptr)
      COHORT_RETURN_IF_ERROR(SetUpCurveServer(t->inbox_, *options.curve));
    t->inbox_.bind(bind);
    t->endpoint_ = t->inbox_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return UnavailableError("rank " + std::to_string(rank) + ": cannot bind " + bind + ": " +
                            e.what());
  }
  return t;
}

Status ZmqTransport::Connect(const std::vector<std::string>& endpoints,
                             const std::vector<CurvePeer>& peers) {
  if (endpoints.size() != static_cast<size_t>(size_)) {
    return InvalidArgumentError(std::to_string(endpoints.size()) + " endpoints for a group of " +
                                std::to_string(size_));
  }
  if ((options_.curve != nullptr) != !peers.empty() ||
      (!peers.empty() && peers.size() != static_cast<size_t>(size_))) {
    return InvalidArgumentError("CURVE needs this rank's keys and every rank's key and name");
  }
  names_.clear();
  for (const CurvePeer& p : peers) names_.push_back(p.name);
  StopMonitors();
  out_.clear();
  links_.assign(size_, Link{});
  for (int r = 0; r < size_; ++r) {
    out_.emplace_back(context_, zmq::socket_type::push);
    monitors_.emplace_back(context_, zmq::socket_type::pair);
    if (r == rank_) continue;
    try {
      out_[r].set(zmq::sockopt::sndtimeo, options_.send_timeout_ms);
      out_[r].set(zmq::sockopt::linger, 1000);
      out_[r].set(zmq::sockopt::heartbeat_ivl, options_.heartbeat_interval_ms);
      out_[r].set(zmq::sockopt::heartbeat_timeout, options_.heartbeat_timeout_ms);
      out_[r].set(zmq::sockopt::heartbeat_ttl, options_.heartbeat_timeout_ms);
      if (!peers.empty()) {
        COHORT_RETURN_IF_ERROR(SetUpCurveClient(out_[r], *options_.curve, peers[r].key));
      }
      // The connection to the peer's inbox stands for the peer: its
      // handshake says the peer is there, its close that it went away.
      const std::string monitor =
          "inproc://cohort-zmq-transport-monitor-" + std::to_string(monitor_count++);
      if (zmq_socket_monitor(out_[r].handle(), monitor.c_str(),
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0) {
        throw zmq::error_t();
      }
      monitors_[r].connect(monitor);
      out_[r].connect(endpoints[r]);
    } catch (const zmq::error_t& e) {
      return UnavailableError("cannot connect to rank " + std::to_string(r) + " at " +
                              endpoints[r] + ": " + e.what());
    }
  }
  return OkStatus();
}

void ZmqTransport::StopMonitors() {
  for (size_t r = 0; r < out_.size() && r < monitors_.size(); ++r) {
    if (static_cast<int>(r) == rank_ || !out_[r] || !monitors_[r]) continue;
    zmq_socket_monitor(out_[r].handle(), nullptr, 0);
    ReadMonitor(static_cast<int>(r));  // What it queued before it stopped.
  }
  for (auto& m : monitors_) {
    if (!m) continue;
    m.set(zmq::sockopt::linger, 0);
    m.close();
  }
  monitors_.clear();
}

void ZmqTransport::ReadMonitor(int peer) {
  Link& link = links_[peer];
  // Each event is two frames: 2 bytes of event and 4 of value, then the
  // endpoint.
  zmq::message_t event, endpoint;
  while (monitors_[peer].recv(event, zmq::recv_flags::dontwait)) {
    while (event.more() && monitors_[peer].recv(endpoint, zmq::recv_flags::dontwait) &&
           endpoint.more()) {
    }
    if (event.size() < sizeof(uint16_t)) continue;
    uint16_t id;
    std::memcpy(&id, event.data(), sizeof(id));
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      link.up = true;
      link.closed = false;
    } else if (id == ZMQ_EVENT_DISCONNECTED && link.up) {
      link.up = false;
      link.closed = true;
      link.quiet_since = SteadyNowMs();
    }
  }
}

StatusOr<bool> ZmqTransport::ReadInbox() {
  try {
    zmq::message_t from, body;
    if (!inbox_.recv(from, zmq::recv_flags::dontwait)) return false;
    const bool two = from.more() && inbox_.recv(body, zmq::recv_flags::dontwait) && !body.more();
    uint32_t sender = 0;
    if (two && from.size() == sizeof(sender)) std::memcpy(&sender, from.data(), sizeof(sender));
    // With CURVE the claimed rank must be the one whose key sent it.
    const char* user = names_.empty() ? nullptr : zmq_msg_gets(from.handle(), "User-Id");
    if (!two || from.size() != sizeof(sender) || sender >= static_cast<uint32_t>(size_) ||
        sender == static_cast<uint32_t>(rank_) ||
        (!names_.empty() && (user == nullptr || names_[sender] != user))) {
      // Drain what is left of a malformed message and drop it.
      while (inbox_.get(zmq::sockopt::rcvmore)) (void)inbox_.recv(body, zmq::recv_flags::none);
      ++dropped_;
      return true;
    }
    if (pending_[sender].size() >= static_cast<size_t>(options_.receive_queue)) {
      ++dropped_;  // A flood from one sender: no collective sends this many ahead.
      return true;
    }
    // A peer whose connection closed is still delivering what it sent.
    if (!links_.empty() && links_[sender].closed) links_[sender].quiet_since = SteadyNowMs();
    // The message itself owns the bytes: no copy.
    auto owned = std::make_shared<zmq::message_t>(std::move(body));
    const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(owned->data()), owned->size());
    pending_[sender].emplace_back(std::move(owned), bytes);
    return true;
  } catch (const zmq::error_t& e) {
    return UnavailableError("receive on rank " + std::to_string(rank_) + ": " + e.what());
  }
}

Status ZmqTransport::Gone(int peer) {
  if (links_.empty()) return OkStatus();  // Not connected yet.
  Link& link = links_[peer];
  if (!link.gone.ok()) return link.gone;
  try {
    ReadMonitor(peer);
  } catch (const zmq::error_t& e) {
    return UnavailableError("zmq transport: rank " + std::to_string(rank_) +
                            ": its connection monitor failed: " + e.what());
  }
  if (!link.closed || SteadyNowMs() < link.quiet_since + options_.gone_grace_ms) {
    return OkStatus();
  }
  // Whatever it sent before it went has arrived by now: take it first.
  for (;;) {
    COHORT_ASSIGN_OR_RETURN(const bool got, ReadInbox());
    if (!got) break;
  }
  if (!pending_[peer].empty() || SteadyNowMs() < link.quiet_since + options_.gone_grace_ms) {
    return OkStatus();
  }
  link.gone = UnavailableError(
      "zmq transport: rank " + std::to_string(peer) +
      " is gone (its connection closed: its process ended, or it answered no heartbeat for " +
      std::to_string(options_.heartbeat_timeout_ms) + " ms)");
  return link.gone;
}

Status ZmqTransport::Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) {
  if (peer < 0 || peer >= size_ || peer == rank_ || out_.empty()) {
    return InvalidArgumentError("send to rank " + std::to_string(peer) + " from rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  COHORT_RETURN_IF_ERROR(Gone(peer));  // Nothing more reaches it.
  const uint32_t from = static_cast<uint32_t>(rank_);
  // One copy, into the message ZeroMQ will own.
  zmq::message_t m(head.size() + body.size());
  if (!head.empty()) std::memcpy(m.data(), head.data(), head.size());
  if (!body.empty()) {
    std::memcpy(static_cast<uint8_t*>(m.data()) + head.size(), body.data(), body.size());
  }
  try {
    if (!out_[peer].send(zmq::buffer(&from, sizeof(from)), zmq::send_flags::sndmore) ||
        !out_[peer].send(std::move(m), zmq::send_flags::none)) {
      return UnavailableError("rank " + std::to_string(peer) + " took nothing for " +
                              std::to_string(options_.send_timeout_ms) + " ms");
    }
  } catch (const zmq::error_t& e) {
    return UnavailableError("send to rank " + std::to_string(peer) + ": " + e.what());
  }
  return OkStatus();
}

StatusOr<collective::Message> ZmqTransport::Receive(int peer, TimeMs deadline) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return InvalidArgumentError("receive from rank " + std::to_string(peer) + " on rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  for (;;) {
    if (!pending_[peer].empty()) {
      collective::Message m = std::move(pending_[peer].front());
      pending_[peer].pop_front();
      return m;
    }
    COHORT_RETURN_IF_ERROR(Gone(peer));  // Once what it sent has been taken.
    const TimeMs now = SteadyNowMs();
    if (now >= deadline) {
      return DeadlineExceededError("nothing from rank " + std::to_string(peer) + " in time");
    }
    // Wakes for a message, for news of the peer's connection, or when a
    // closed one's grace is over.
    TimeMs wake = deadline;
    zmq::pollitem_t items[2] = {{inbox_.handle(), 0, ZMQ_POLLIN, 0}, {}};
    size_t count = 1;
    if (!links_.empty()) {
      items[count++] = {monitors_[peer].handle(), 0, ZMQ_POLLIN, 0};
      if (links_[peer].closed) {
        wake = std::min<TimeMs>(wake, links_[peer].quiet_since + options_.gone_grace_ms);
      }
    }
    try {
      if (zmq::poll(items, count, std::chrono::milliseconds(std::max<TimeMs>(wake - now, 0))) ==
          0) {
        continue;
      }
    } catch (const zmq::error_t& e) {
      return UnavailableError("receive on rank " + std::to_string(rank_) + ": " + e.what());
    }
    COHORT_RETURN_IF_ERROR(ReadInbox().status());
  }
}

}  // namespace cohort::net
