#include "net/envelope.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace cohort::net
