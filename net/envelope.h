// Envelopes: one protobuf header frame plus raw little-endian float32
// payload frames. Decoding treats every byte as untrusted.
#ifndef COHORT_NET_ENVELOPE_H_
#define COHORT_NET_ENVELOPE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "proto/wire.pb.h"

namespace cohort::net {

struct Limits {
  size_t max_header_bytes = 65536;
  size_t max_payload_floats = 0;  // Per frame; 0 = no payload allowed.
  size_t max_payload_frames = 1;
};

struct Envelope {
  wire::Header header;
  std::vector<std::vector<float>> payloads;
};

// A received multipart message; `peer` is the ROUTER routing id (empty on a
// DEALER).
struct RawMessage {
  std::string peer;
  std::vector<zmq::message_t> frames;
  // The ZAP user id of the connection (the allowlist name under CURVE);
  // empty when there is none.
  std::string user_id;
};

// Builds the frames of a message: header, then `payload` (if not empty).
std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const float> payload = {});
// Same, with 32-bit words (a masked update) as the payload frame.
std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const uint32_t> payload);
// Same, without copying the payload: the frame references `*payload` and
// keeps it alive until ZeroMQ has sent it. Null: no payload frame.
std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::shared_ptr<const std::vector<float>> payload);

// Checks frame count and sizes against `limits`, parses the header (version
// must be VERSION_1, the body must be set) and copies the payloads out.
// kInvalidArgument / kResourceExhausted with a message that says what was
// wrong; never aborts.
StatusOr<Envelope> DecodeEnvelope(std::span<const zmq::message_t> frames, const Limits& limits);

// Name of the header's body ("update", "hello", ...) for logs.
std::string BodyName(const wire::Header& header);

// Sends `frames`, prefixed by `peer` when it is not empty (ROUTER). Returns
// false when the message could not be queued (peer gone or queue full); the
// caller treats that like a dropped peer, never as fatal.
bool SendFrames(zmq::socket_t& socket, const std::string& peer, std::vector<zmq::message_t> frames);

// Receives one multipart message without blocking; false when none is ready.
// `router`: the first frame is the peer's routing id.
bool TryReceive(zmq::socket_t& socket, bool router, RawMessage& out);

// The endpoint a socket actually bound (resolves port 0).
std::string LastEndpoint(zmq::socket_t& socket);

}  // namespace cohort::net

#endif  // COHORT_NET_ENVELOPE_H_
