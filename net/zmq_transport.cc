#include "net/zmq_transport.h"

#include <cstring>

#include "net/curve.h"

namespace cohort::net {

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
  out_.clear();
  for (int r = 0; r < size_; ++r) {
    out_.emplace_back(context_, zmq::socket_type::push);
    if (r == rank_) continue;
    try {
      out_[r].set(zmq::sockopt::sndtimeo, options_.send_timeout_ms);
      out_[r].set(zmq::sockopt::linger, 1000);
      if (!peers.empty()) {
        COHORT_RETURN_IF_ERROR(SetUpCurveClient(out_[r], *options_.curve, peers[r].key));
      }
      out_[r].connect(endpoints[r]);
    } catch (const zmq::error_t& e) {
      return UnavailableError("cannot connect to rank " + std::to_string(r) + " at " +
                              endpoints[r] + ": " + e.what());
    }
  }
  return OkStatus();
}

Status ZmqTransport::Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) {
  if (peer < 0 || peer >= size_ || peer == rank_ || out_.empty()) {
    return InvalidArgumentError("send to rank " + std::to_string(peer) + " from rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
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

StatusOr<aggregation::Message> ZmqTransport::Receive(int peer, TimeMs deadline) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return InvalidArgumentError("receive from rank " + std::to_string(peer) + " on rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  for (;;) {
    if (!pending_[peer].empty()) {
      aggregation::Message m = std::move(pending_[peer].front());
      pending_[peer].pop_front();
      return m;
    }
    const TimeMs now = SteadyNowMs();
    if (now >= deadline) {
      return DeadlineExceededError("nothing from rank " + std::to_string(peer) + " in time");
    }
    zmq::pollitem_t item{inbox_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(deadline - now)) == 0) continue;
      zmq::message_t from, body;
      if (!inbox_.recv(from, zmq::recv_flags::dontwait)) continue;
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
        continue;
      }
      if (pending_[sender].size() >= static_cast<size_t>(options_.receive_queue)) {
        ++dropped_;  // A flood from one sender: no collective sends this many ahead.
        continue;
      }
      // The message itself owns the bytes: no copy.
      auto owned = std::make_shared<zmq::message_t>(std::move(body));
      const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(owned->data()),
                                           owned->size());
      pending_[sender].emplace_back(std::move(owned), bytes);
    } catch (const zmq::error_t& e) {
      return UnavailableError("receive on rank " + std::to_string(rank_) + ": " + e.what());
    }
  }
}

}  // namespace cohort::net
