// net::DecodeEnvelope over frames cut from the input.
//
// Input: one byte that picks the limits (and, with bits 5 and 6, stretches
// payload frames to a full chunk by repeating their bytes, so that
// multi-frame payloads, which a 16-bit length cannot spell, are reached),
// then frames, each a 16-bit little-endian length and that many
// bytes (the last may be short). Checks that a decoded envelope honours the
// limits (its parse cost bounds what parsing took, within the budget),
// carries every payload byte for byte in one joined payload, and survives
// EncodeEnvelope + DecodeEnvelope unchanged.
#include <google/protobuf/stubs/logging.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "net/parse_cost.h"
#include "net/zmq_codec.h"
#include "tests/fuzz/fuzz_input.h"

namespace cohort::fuzz {
namespace {

constexpr size_t kMaxFrames = 6;

void Run(FuzzInput& in) {
  // Headers that fail to parse would each log an error line.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const uint8_t mode = in.Byte();
  net::Limits limits;
  limits.max_header_bytes = (mode & 1) != 0 ? 64 : 65536;
  limits.max_payload_floats = std::array<size_t, 4>{0, 1, 16, 1 << 20}[(mode >> 1) & 3];
  limits.max_payload_frames = (mode >> 3) & 3;

  // Bit 5: full chunks for every payload frame but the last; bit 6: for the
  // last one too (a payload of exactly k MiB). Only where the limits could
  // accept them: a rejected 1 MiB frame only slows the fuzzer down.
  const bool room = limits.max_payload_frames >= 1 &&
                    limits.max_payload_floats * sizeof(float) >= net::kPayloadChunkBytes;
  const bool full_chunks = room && (mode & 0x20) != 0;
  const bool full_last = room && (mode & 0x40) != 0;
  std::vector<std::string> parts;
  while (!in.empty() && parts.size() < kMaxFrames) parts.push_back(in.LengthPrefixed());
  std::vector<zmq::message_t> frames;
  std::string joined;  // The payload bytes, frames 1.. in order.
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string frame = std::move(parts[i]);
    if (i > 0 && (i + 1 < parts.size() ? full_chunks : full_last)) {
      if (frame.empty()) frame.assign(1, '\0');
      while (frame.size() < net::kPayloadChunkBytes) frame += frame;
      frame.resize(net::kPayloadChunkBytes);
    }
    if (i > 0) joined += frame;
    frames.emplace_back(frame.data(), frame.size());
  }
  StatusOr<net::Envelope> env = net::DecodeEnvelope(frames, limits);
  if (!env.ok()) {
    FUZZ_CHECK(!env.status().message().empty(), "an error must say what was wrong");
    return;
  }
  // max_payload_frames counts payloads (0 or 1), not the chunk frames of one.
  FUZZ_CHECK(!frames.empty() && (frames.size() == 1 || limits.max_payload_frames > 0),
             "a payload only where one is allowed");
  FUZZ_CHECK(frames[0].size() <= limits.max_header_bytes, "header limit");
  // The cost DecodeEnvelope checked bounds what parsing took.
  StatusOr<uint64_t> cost =
      net::ParseCost(*wire::Header::descriptor(),
                     std::string_view(frames[0].data<char>(), frames[0].size()), ~uint64_t{0});
  FUZZ_CHECK(cost.ok() && env->header.SpaceUsedLong() <= *cost,
             "the parse cost bounds the parsed header's SpaceUsedLong");
  FUZZ_CHECK(*cost <= net::ParsedBytesBudget(limits.max_header_bytes),
             "the parsed header within its budget");
  FUZZ_CHECK(env->header.version() == wire::VERSION_1, "version");
  FUZZ_CHECK(env->header.body_case() != wire::Header::BODY_NOT_SET, "body");
  FUZZ_CHECK(net::BodyName(env->header) != "unknown", "body name");
  FUZZ_CHECK(env->payloads.size() == (frames.size() > 1 ? 1u : 0u), "one joined payload");
  for (size_t i = 1; i < frames.size(); ++i) {
    const size_t size = frames[i].size();
    FUZZ_CHECK(i + 1 < frames.size() ? size == net::kPayloadChunkBytes
                                     : size > 0 && size <= net::kPayloadChunkBytes,
               "every payload frame but the last is one full chunk; the last holds 1 to a chunk");
  }
  if (!env->payloads.empty()) {
    const auto& values = env->payloads[0];
    FUZZ_CHECK(values.size() <= limits.max_payload_floats, "payload limit");
    FUZZ_CHECK(values.size() * sizeof(float) == joined.size(), "payload size");
    FUZZ_CHECK(values.empty() || std::memcmp(values.data(), joined.data(), joined.size()) == 0,
               "payload bytes");
  }

  // Round trip. EncodeEnvelope writes no frame for an empty payload.
  // Re-serialising may grow the header (a 5-byte negative enum becomes 10
  // bytes), so the second decode gets room for it.
  if (!env->payloads.empty() && env->payloads[0].empty()) env->payloads.clear();
  std::vector<zmq::message_t> again =
      env->payloads.empty()
          ? net::EncodeEnvelope(env->header, std::span<const float>())
          : net::EncodeEnvelope(env->header, std::span<const float>(env->payloads[0]));
  net::Limits relaxed = limits;
  relaxed.max_header_bytes = std::max(limits.max_header_bytes, again[0].size());
  StatusOr<net::Envelope> decoded = net::DecodeEnvelope(again, relaxed);
  FUZZ_CHECK(decoded.ok(), "re-encoded envelope must decode: " + decoded.status().ToString());
  FUZZ_CHECK(decoded->header.SerializeAsString() == env->header.SerializeAsString(),
             "header changed in the round trip");
  FUZZ_CHECK(decoded->payloads.size() == env->payloads.size(), "payload count after round trip");
  for (size_t i = 0; i < env->payloads.size(); ++i) {
    const auto& a = env->payloads[i];
    const auto& b = decoded->payloads[i];
    FUZZ_CHECK(a.size() == b.size() &&
                   (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0),
               "payload changed in the round trip");
  }
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
