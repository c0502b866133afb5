// Envelopes: one protobuf header frame plus, optionally, one payload of raw
// little-endian 32-bit words, sent as frames of at most kPayloadChunkBytes
// (every frame but the last exactly that size). So no frame is larger than
// max(header limit, chunk size), whatever the model size, and a socket's
// ZMQ_MAXMSGSIZE (what a peer may make ZeroMQ buffer before anyone has
// authenticated it) stays small. Decoding treats every byte as untrusted.
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

// Payload frames carry this many bytes (the last one of a payload may carry
// fewer).
inline constexpr size_t kPayloadChunkBytes = size_t{1} << 20;
// Room above the largest frame for transport framing: CURVE adds 33 bytes to
// every message it encrypts.
inline constexpr size_t kFrameSlackBytes = 4096;

struct Limits {
  size_t max_header_bytes = 65536;
  // The whole payload, over all its frames; 0 = no payload allowed.
  size_t max_payload_floats = 0;
  // Payloads per message: 0 = none; an envelope carries at most one, so any
  // value above 1 means 1.
  size_t max_payload_frames = 1;
};

struct Envelope {
  wire::Header header;
  // Empty, or one vector: the whole payload, its frames joined.
  std::vector<std::vector<float>> payloads;
};

// The largest frame an envelope within `max_header_bytes` has on the wire:
// the value for ZMQ_MAXMSGSIZE on a socket that receives envelopes.
int64_t MaxFrameBytes(size_t max_header_bytes);

// A received multipart message; `peer` is the ROUTER routing id (empty on a
// DEALER).
struct RawMessage {
  std::string peer;
  std::vector<zmq::message_t> frames;
  // The ZAP user id of the connection (the allowlist name under CURVE);
  // empty when there is none.
  std::string user_id;
  // The file descriptor of the connection the message came in on (ZeroMQ's
  // ZMQ_SRCFD); -1 when unknown. A message arrives only on a connection whose
  // handshake (and, under CURVE, authentication) has succeeded.
  int source_fd = -1;
};

// Builds the frames of a message: header, then `payload` (if not empty) in
// frames of at most kPayloadChunkBytes.
std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const float> payload = {});
// Same, with 32-bit words (a masked update) as the payload frame.
std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::span<const uint32_t> payload);
// Same, without copying the payload: the frames reference `*payload` and
// keep it alive until ZeroMQ has sent them. Null: no payload.
std::vector<zmq::message_t> EncodeEnvelope(const wire::Header& header,
                                           std::shared_ptr<const std::vector<float>> payload);

// Checks the header size and every payload frame against `limits` before it
// copies anything (frame sizes as EncodeEnvelope makes them, the payload's
// total within max_payload_floats), parses the header (version must be
// VERSION_1, the body must be set) and joins the payload frames into
// payloads[0]. kInvalidArgument / kResourceExhausted with a message that says
// what was wrong; never aborts.
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
