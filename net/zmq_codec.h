// The ZeroMQ codec of net/envelope.h: an envelope travels as one protobuf
// header frame plus its payload in frames of at most kPayloadChunkBytes
// (every frame but the last exactly that size). So no frame is larger than
// max(header limit, chunk size), whatever the model size, and a socket's
// ZMQ_MAXMSGSIZE (what a peer may make ZeroMQ buffer before anyone has
// authenticated it) stays small. Decoding treats every byte as untrusted.
// Only the daemons' I/O loops and the simulator's stand-in use this file.
#ifndef COHORT_NET_ZMQ_CODEC_H_
#define COHORT_NET_ZMQ_CODEC_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "net/envelope.h"
#include "proto/wire.pb.h"

namespace cohort::net {

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

#endif  // COHORT_NET_ZMQ_CODEC_H_
