// Envelopes: one protobuf header plus, optionally, one payload of raw
// little-endian 32-bit words. This header is the plain message and its
// limits, with no transport in it, so the sans-I/O round engine and client
// session can take envelopes without seeing ZeroMQ; net/zmq_codec.h turns
// them into ZeroMQ frames and back.
#ifndef COHORT_NET_ENVELOPE_H_
#define COHORT_NET_ENVELOPE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/wire.pb.h"

namespace cohort::net {

// Payload frames carry this many bytes (the last one of a payload may carry
// fewer).
inline constexpr size_t kPayloadChunkBytes = size_t{1} << 20;
// Room above the largest frame for transport framing: CURVE adds 33 bytes to
// every message it encrypts.
inline constexpr size_t kFrameSlackBytes = 4096;

// A header, once parsed, may take at most this many times max_header_bytes
// of memory (net/parse_cost.h), and never less than kMinParsedBytes. The
// large headers a client takes cost 2 to 3.5 times their bytes (a roster of
// 32-byte keys 3.2); 2-byte empty entries of a repeated field would cost 60
// times. Small headers can cost more per byte: a packed list of 1-byte
// counts, 16 times (a Hello's label counts of 65,536 classes, 1 MiB), hence
// the floor.
inline constexpr size_t kParsedBytesPerHeaderByte = 4;
inline constexpr size_t kMinParsedBytes = size_t{16} << 20;

// What a header within `max_header_bytes` may take once parsed.
inline uint64_t ParsedBytesBudget(size_t max_header_bytes) {
  return std::max<uint64_t>(uint64_t{kParsedBytesPerHeaderByte} * max_header_bytes,
                            kMinParsedBytes);
}

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

// Name of the header's body ("update", "hello", ...) for logs.
std::string BodyName(const wire::Header& header);

}  // namespace cohort::net

#endif  // COHORT_NET_ENVELOPE_H_
