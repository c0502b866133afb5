#include <gtest/gtest.h>

#include <cstring>

#include "net/zmq_codec.h"

namespace cohort::net {
namespace {

std::vector<zmq::message_t> Frames(std::initializer_list<std::string> parts) {
  std::vector<zmq::message_t> out;
  for (const auto& p : parts) out.emplace_back(p.data(), p.size());
  return out;
}

Limits TestLimits() {
  Limits l;
  l.max_header_bytes = 1024;
  l.max_payload_floats = 100;
  return l;
}

TEST(EnvelopeTest, RoundTripKeepsHeaderAndPayloadBits) {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  h.mutable_update()->set_round(4);
  std::vector<float> payload = {1.0f, -2.5f, 3.25e-8f};
  auto frames = EncodeEnvelope(h, payload);
  auto env = DecodeEnvelope(frames, TestLimits());
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->header.update().round(), 4u);
  ASSERT_EQ(env->payloads.size(), 1u);
  EXPECT_EQ(env->payloads[0], payload);
  EXPECT_EQ(BodyName(env->header), "update");
}

TEST(EnvelopeTest, SharedPayloadIsSentWithoutCopyAndOutlivesItsOwner) {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  h.mutable_task()->set_round(1);
  auto model = std::make_shared<const std::vector<float>>(std::vector<float>{1.5f, 2.5f});
  std::weak_ptr<const std::vector<float>> watch = model;
  auto frames = EncodeEnvelope(h, model);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1].data(), model->data());  // The same memory: no copy.
  model.reset();
  EXPECT_FALSE(watch.expired());  // The frame keeps it alive...
  auto env = DecodeEnvelope(frames, TestLimits());
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->payloads[0], (std::vector<float>{1.5f, 2.5f}));
  frames.clear();
  EXPECT_TRUE(watch.expired());  // ...until the frame is gone.
}

TEST(EnvelopeTest, RejectsGarbageWithAReason) {
  auto env = DecodeEnvelope(Frames({"\xff\xff\xff\xff garbage"}), TestLimits());
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("malformed header"), std::string::npos);

  wire::Header h;
  h.set_version(wire::VERSION_1);
  h.mutable_hello()->set_client_name("a-long-enough-name-to-truncate");
  std::string bytes = h.SerializeAsString();
  env = DecodeEnvelope(Frames({bytes.substr(0, bytes.size() - 5)}), TestLimits());
  EXPECT_FALSE(env.ok());
}

TEST(EnvelopeTest, RejectsUnknownTypeAndVersion) {
  // Field 99 (varint) is no known message type.
  std::string unknown = std::string("\x08\x01", 2) + std::string("\x98\x06\x01", 3);
  auto env = DecodeEnvelope(Frames({unknown}), TestLimits());
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("unknown or missing message type"), std::string::npos);

  wire::Header h;
  h.mutable_heartbeat();  // Version left at 0.
  env = DecodeEnvelope(Frames({h.SerializeAsString()}), TestLimits());
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("version"), std::string::npos);
}

TEST(EnvelopeTest, RejectsOversizedAndRaggedFrames) {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  h.mutable_heartbeat();
  const std::string head = h.SerializeAsString();
  auto env = DecodeEnvelope(Frames({std::string(2000, 'x')}), TestLimits());
  EXPECT_EQ(env.status().code(), StatusCode::kResourceExhausted);
  env = DecodeEnvelope(Frames({head, std::string(404, 'x')}), TestLimits());
  EXPECT_EQ(env.status().code(), StatusCode::kResourceExhausted);
  env = DecodeEnvelope(Frames({head, std::string(7, 'x')}), TestLimits());
  EXPECT_NE(env.status().message().find("multiple of 4"), std::string::npos);
  env = DecodeEnvelope(Frames({head, "abcd", "abcd"}), TestLimits());
  EXPECT_FALSE(env.ok());
}

wire::Header UpdateHeader() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  h.mutable_update()->set_round(2);
  return h;
}

// 2.5 MiB of floats: two full chunks and a half one.
std::vector<float> LargePayload() {
  std::vector<float> v(5 * kPayloadChunkBytes / sizeof(float) / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;
  return v;
}

Limits LargeLimits(size_t floats) {
  Limits l;
  l.max_payload_floats = floats;
  return l;
}

TEST(EnvelopeTest, LargePayloadTravelsInBoundedFramesAndArrivesWhole) {
  const std::vector<float> payload = LargePayload();
  auto frames = EncodeEnvelope(UpdateHeader(), payload);
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(frames[1].size(), kPayloadChunkBytes);
  EXPECT_EQ(frames[2].size(), kPayloadChunkBytes);
  EXPECT_EQ(frames[3].size(), kPayloadChunkBytes / 2);
  // No frame exceeds what a receiver sets as ZMQ_MAXMSGSIZE, however large
  // the model.
  for (const auto& f : frames) EXPECT_LE(f.size(), static_cast<size_t>(MaxFrameBytes(65536)));
  auto env = DecodeEnvelope(frames, LargeLimits(payload.size()));
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->payloads.size(), 1u);
  EXPECT_EQ(env->payloads[0], payload);

  // The limit is on the whole payload, not on a frame.
  env = DecodeEnvelope(frames, LargeLimits(payload.size() - 1));
  EXPECT_EQ(env.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(env.status().message().find("exceeds the limit"), std::string::npos);
}

TEST(EnvelopeTest, MaskedWordsAndSharedModelsAreChunkedAlike) {
  std::vector<uint32_t> words(kPayloadChunkBytes / 4 + 3);
  for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<uint32_t>(i * 2654435761u);
  auto frames = EncodeEnvelope(UpdateHeader(), std::span<const uint32_t>(words));
  ASSERT_EQ(frames.size(), 3u);
  auto env = DecodeEnvelope(frames, LargeLimits(words.size()));
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->payloads[0].size(), words.size());
  EXPECT_EQ(std::memcmp(env->payloads[0].data(), words.data(), words.size() * 4), 0);

  auto model = std::make_shared<const std::vector<float>>(LargePayload());
  const std::vector<float> copy = *model;
  std::weak_ptr<const std::vector<float>> watch = model;
  frames = EncodeEnvelope(UpdateHeader(), model);
  ASSERT_EQ(frames.size(), 4u);
  for (size_t i = 1; i < frames.size(); ++i) {  // Views into the model: no copy.
    EXPECT_EQ(frames[i].data(),
              reinterpret_cast<const char*>(model->data()) + (i - 1) * kPayloadChunkBytes);
  }
  model.reset();
  frames.pop_back();
  frames.erase(frames.begin() + 1);
  EXPECT_FALSE(watch.expired());  // One frame still holds it.
  frames.clear();
  EXPECT_TRUE(watch.expired());
  frames = EncodeEnvelope(UpdateHeader(), std::make_shared<const std::vector<float>>(copy));
  env = DecodeEnvelope(frames, LargeLimits(copy.size()));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->payloads[0], copy);
}

TEST(EnvelopeTest, RejectsPayloadFramesNotCutAtChunkBoundaries) {
  const std::string head = UpdateHeader().SerializeAsString();
  const Limits limits = LargeLimits(kPayloadChunkBytes);  // 4 MiB of floats.
  const std::string full(kPayloadChunkBytes, 'x');
  // Two half chunks, a frame over the chunk size, an empty last frame.
  for (const auto& parts : std::vector<std::vector<std::string>>{
           {head, full.substr(0, kPayloadChunkBytes / 2), full.substr(0, kPayloadChunkBytes / 2)},
           {head, full + "abcd"},
           {head, full, ""}}) {
    std::vector<zmq::message_t> frames;
    for (const auto& p : parts) frames.emplace_back(p.data(), p.size());
    auto env = DecodeEnvelope(frames, limits);
    ASSERT_FALSE(env.ok()) << parts.size() << " frames";
    EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument) << env.status();
    EXPECT_NE(env.status().message().find("every frame but the last"), std::string::npos)
        << env.status();
  }
  // Well cut: accepted.
  std::vector<zmq::message_t> frames;
  frames.emplace_back(head.data(), head.size());
  frames.emplace_back(full.data(), full.size());
  frames.emplace_back(full.data(), 8);
  EXPECT_TRUE(DecodeEnvelope(frames, limits).ok());
}

TEST(EnvelopeTest, NoPayloadWhereNoneIsAllowed) {
  Limits limits = TestLimits();
  limits.max_payload_frames = 0;
  auto frames = EncodeEnvelope(UpdateHeader(), std::vector<float>{1.0f});
  EXPECT_EQ(DecodeEnvelope(frames, limits).status().code(), StatusCode::kInvalidArgument);
  limits = TestLimits();
  limits.max_payload_floats = 0;
  EXPECT_EQ(DecodeEnvelope(frames, limits).status().code(), StatusCode::kResourceExhausted);
}

TEST(EnvelopeTest, FrameLimitCoversTheHeaderLimitOrAChunkWithRoomForCurve) {
  EXPECT_GE(MaxFrameBytes(65536), static_cast<int64_t>(kPayloadChunkBytes + 33));
  EXPECT_LT(MaxFrameBytes(65536), static_cast<int64_t>(kPayloadChunkBytes + 65536));
  EXPECT_GE(MaxFrameBytes(size_t{64} << 20), int64_t{64} << 20);
}

}  // namespace
}  // namespace cohort::net
