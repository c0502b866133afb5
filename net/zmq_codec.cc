#include "net/zmq_codec.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string_view>

#include "net/parse_cost.h"

namespace cohort::net {

namespace {

std::vector<zmq::message_t> HeaderFrame(const wire::Header& header) {
  std::vector<zmq::message_t> frames;
  std::string bytes = header.SerializeAsString();
  frames.emplace_back(bytes.data(), bytes.size());
  return frames;
}

void AppendChunks(std::span<const std::byte> payload, std::vector<zmq::message_t>& frames) {
  for (size_t offset = 0; offset < payload.size(); offset += kPayloadChunkBytes) {
    frames.emplace_back(payload.data() + offset,
                        std::min(kPayloadChunkBytes, payload.size() - offset));
  }
}

}  // namespace

std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const float> payload) {
  std::vector<zmq::message_t> frames = HeaderFrame(header);
  AppendChunks(std::as_bytes(payload), frames);
  return frames;
}

std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const uint32_t> payload) {
  std::vector<zmq::message_t> frames = HeaderFrame(header);
  AppendChunks(std::as_bytes(payload), frames);
  return frames;
}

std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::shared_ptr<const std::vector<float>> payload) {
  std::vector<zmq::message_t> frames = HeaderFrame(header);
  if (!payload) return frames;
  const std::span<const std::byte> bytes = std::as_bytes(std::span<const float>(*payload));
  using Owner = std::shared_ptr<const std::vector<float>>;
  // Called by ZeroMQ (possibly on its I/O thread) once a frame is sent; each
  // frame holds its own reference.
  auto release = [](void*, void* hint) { delete static_cast<Owner*>(hint); };
  for (size_t offset = 0; offset < bytes.size(); offset += kPayloadChunkBytes) {
    auto* owner = new Owner(payload);
    frames.emplace_back(const_cast<std::byte*>(bytes.data() + offset),
                        std::min(kPayloadChunkBytes, bytes.size() - offset), release, owner);
  }
  return frames;
}

StatusOr<Envelope> DecodeEnvelope(std::span<const zmq::message_t> frames, const Limits& limits) {
  if (frames.empty()) return InvalidArgumentError("empty message");
  const size_t payload_frames = frames.size() - 1;
  if (payload_frames > 0 && limits.max_payload_frames == 0) {
    return InvalidArgumentError(std::to_string(frames.size()) +
                                " frames, but this message may not carry a payload");
  }
  const zmq::message_t& head = frames[0];
  if (head.size() > limits.max_header_bytes) {
    return ResourceExhaustedError("header frame of " + std::to_string(head.size()) +
                                  " bytes exceeds the limit of " +
                                  std::to_string(limits.max_header_bytes));
  }
  // Every size is checked before anything is allocated or copied.
  size_t total = 0;
  for (size_t i = 1; i < frames.size(); ++i) total += frames[i].size();
  if (total / sizeof(float) > limits.max_payload_floats ||
      (total > 0 && limits.max_payload_floats == 0)) {
    return ResourceExhaustedError("payload of " + std::to_string(total) + " bytes in " +
                                  std::to_string(payload_frames) + " frames exceeds the limit of " +
                                  std::to_string(limits.max_payload_floats * sizeof(float)));
  }
  for (size_t i = 1; i < frames.size(); ++i) {
    const size_t size = frames[i].size();
    const bool last = i + 1 == frames.size();
    if (size % sizeof(float) != 0) {
      return InvalidArgumentError("payload frame " + std::to_string(i - 1) + " has " +
                                  std::to_string(size) + " bytes, not a multiple of 4");
    }
    if (last ? (size == 0 || size > kPayloadChunkBytes) : size != kPayloadChunkBytes) {
      return InvalidArgumentError("payload frame " + std::to_string(i - 1) + " of " +
                                  std::to_string(payload_frames) + " has " + std::to_string(size) +
                                  " bytes; every frame but the last must have " +
                                  std::to_string(kPayloadChunkBytes) + ", the last 4 to " +
                                  std::to_string(kPayloadChunkBytes));
    }
  }
  // What the header would take once parsed, before protobuf allocates it.
  const uint64_t budget = ParsedBytesBudget(limits.max_header_bytes);
  StatusOr<uint64_t> cost = ParseCost(*wire::Header::descriptor(),
                                      std::string_view(head.data<char>(), head.size()), budget);
  if (!cost.ok()) {
    return InvalidArgumentError("malformed header frame (" + std::to_string(head.size()) +
                                " bytes: " + std::string(cost.status().message()) + ")");
  }
  if (*cost > budget) {
    return ResourceExhaustedError("header frame of " + std::to_string(head.size()) +
                                  " bytes would take more than " + std::to_string(budget) +
                                  " bytes of memory once parsed: too many entries for its size");
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
  if (payload_frames > 0) {
    // Copy out: received frames may sit at any alignment in ZeroMQ's buffer.
    std::vector<float> values(total / sizeof(float));
    auto* out = reinterpret_cast<std::byte*>(values.data());
    for (size_t i = 1; i < frames.size(); ++i) {
      std::memcpy(out, frames[i].data(), frames[i].size());
      out += frames[i].size();
    }
    env.payloads.push_back(std::move(values));
  }
  return env;
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
  out.source_fd = -1;
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
        out.source_fd = zmq_msg_get(msg.handle(), ZMQ_SRCFD);
      }
      out.frames.push_back(std::move(msg));
    }
    first = false;
    if (!more) return true;
  }
}

std::string LastEndpoint(zmq::socket_t& socket) { return socket.get(zmq::sockopt::last_endpoint); }

}  // namespace cohort::net
