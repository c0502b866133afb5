#include "net/envelope.h"

#include <cstring>

namespace cohort::net {

std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const float> payload) {
  std::vector<zmq::message_t> frames;
  std::string bytes = header.SerializeAsString();
  frames.emplace_back(bytes.data(), bytes.size());
  if (!payload.empty()) frames.emplace_back(payload.data(), payload.size_bytes());
  return frames;
}

std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const uint32_t> payload) {
  std::vector<zmq::message_t> frames = EncodeEnvelope(header, std::span<const float>());
  if (!payload.empty()) frames.emplace_back(payload.data(), payload.size_bytes());
  return frames;
}

std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::shared_ptr<const std::vector<float>> payload) {
  std::vector<zmq::message_t> frames = EncodeEnvelope(header, std::span<const float>());
  if (payload && !payload->empty()) {
    using Owner = std::shared_ptr<const std::vector<float>>;
    auto* owner = new Owner(std::move(payload));
    // Called by ZeroMQ (possibly on its I/O thread) once the frame is sent.
    auto release = [](void*, void* hint) { delete static_cast<Owner*>(hint); };
    frames.emplace_back(const_cast<float*>((*owner)->data()), (*owner)->size() * sizeof(float),
                        release, owner);
  }
  return frames;
}

StatusOr<Envelope> DecodeEnvelope(std::span<const zmq::message_t> frames, const Limits& limits) {
  if (frames.empty()) return InvalidArgumentError("empty message");
  if (frames.size() - 1 > limits.max_payload_frames) {
    return InvalidArgumentError(std::to_string(frames.size()) + " frames, at most " +
                                std::to_string(limits.max_payload_frames + 1) + " allowed");
  }
  const zmq::message_t& head = frames[0];
  if (head.size() > limits.max_header_bytes) {
    return ResourceExhaustedError("header frame of " + std::to_string(head.size()) +
                                  " bytes exceeds the limit of " +
                                  std::to_string(limits.max_header_bytes));
  }
  Envelope env;
  if (!env.header.ParseFromArray(head.data(), static_cast<int>(head.size()))) {
    return InvalidArgumentError("malformed header frame (" + std::to_string(head.size()) +
                                " bytes are not a wire.Header)");
  }
  if (env.header.version() != wire::VERSION_1) {
    return InvalidArgumentError("unsupported protocol version " +
                                std::to_string(env.header.version()) + ", expected 1");
  }
  if (env.header.body_case() == wire::Header::BODY_NOT_SET) {
    return InvalidArgumentError("unknown or missing message type");
  }
  for (size_t i = 1; i < frames.size(); ++i) {
    const size_t size = frames[i].size();
    if (size % sizeof(float) != 0) {
      return InvalidArgumentError("payload frame " + std::to_string(i - 1) + " has " +
                                  std::to_string(size) + " bytes, not a multiple of 4");
    }
    if (size / sizeof(float) > limits.max_payload_floats) {
      return ResourceExhaustedError("payload frame " + std::to_string(i - 1) + " of " +
                                    std::to_string(size) + " bytes exceeds the limit of " +
                                    std::to_string(limits.max_payload_floats * 4));
    }
    // Copy out: received frames may sit at any alignment in ZeroMQ's buffer.
    std::vector<float> values(size / sizeof(float));
    std::memcpy(values.data(), frames[i].data(), size);
    env.payloads.push_back(std::move(values));
  }
  return env;
}

std::string BodyName(const wire::Header& header) {
  const auto* field = header.GetDescriptor()->FindFieldByNumber(header.body_case());
  return field != nullptr ? field->name() : "unknown";
}

bool SendFrames(zmq::socket_t& socket, const std::string& peer,
                std::vector<zmq::message_t> frames) {
  try {
    if (!peer.empty()) {
      if (!socket.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return false;
      }
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto flags =
          (i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none) |
          zmq::send_flags::dontwait;
      if (!socket.send(frames[i], flags)) return false;
    }
    return true;
  } catch (const zmq::error_t&) {
    // EHOSTUNREACH with ZMQ_ROUTER_MANDATORY: the peer is gone.
    return false;
  }
}

bool TryReceive(zmq::socket_t& socket, bool router, RawMessage& out) {
  out.peer.clear();
  out.frames.clear();
  out.user_id.clear();
  bool first = true;
  for (;;) {
    zmq::message_t msg;
    auto got = socket.recv(msg, first ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!got) return false;
    const bool more = msg.more();
    if (first && router) {
      out.peer.assign(static_cast<const char*>(msg.data()), msg.size());
    } else {
      // Frames that came off the wire carry the connection's metadata (the
      // routing-id frame a ROUTER makes up does not).
      if (out.frames.empty()) {
        if (const char* user = zmq_msg_gets(msg.handle(), "User-Id")) out.user_id = user;
      }
      out.frames.push_back(std::move(msg));
    }
    first = false;
    if (!more) return true;
  }
}

std::string LastEndpoint(zmq::socket_t& socket) { return socket.get(zmq::sockopt::last_endpoint); }

}  // namespace cohort::net
