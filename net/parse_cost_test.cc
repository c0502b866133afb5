#include "net/parse_cost.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <memory>
#include <string>
#include <vector>

#include "net/zmq_codec.h"

namespace cohort::net {
namespace {

constexpr uint64_t kNoLimit = ~uint64_t{0};

uint64_t Cost(const wire::Header& h) {
  StatusOr<uint64_t> cost = ParseCost(*wire::Header::descriptor(), h.SerializeAsString(), kNoLimit);
  EXPECT_TRUE(cost.ok()) << cost.status();
  return cost.ok() ? *cost : 0;
}

wire::Header Keys() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  h.mutable_secagg_keys()->set_round(3);
  return h;
}

// What the fair and the hostile headers of a client look like, at `entries`.
std::vector<std::pair<std::string, wire::Header>> Shapes(int entries) {
  std::vector<std::pair<std::string, wire::Header>> shapes;
  wire::Header roster;  // The fairest large header: n 32-byte keys.
  roster.set_version(wire::VERSION_1);
  for (int i = 0; i < entries; ++i) {
    roster.mutable_task()->mutable_secagg()->add_roster(std::string(32, static_cast<char>(i)));
  }
  shapes.emplace_back("roster", roster);
  wire::Header listed = Keys();
  for (int i = 0; i < entries / 20; ++i) {
    auto* l = listed.mutable_secagg_keys()->add_listed();
    l->set_index(i);
    l->mutable_advert()->set_signature(std::string(64, 's'));
    l->set_identity(std::string(32, 'i'));
    for (int j = 0; j < 20; ++j) l->add_identity_proof(std::string(32, 'p'));
  }
  shapes.emplace_back("listed adverts with proofs", listed);
  wire::Header survivors;
  survivors.set_version(wire::VERSION_1);
  for (int i = 0; i < entries; ++i) {
    survivors.mutable_secagg_unmask_request()->add_survivors(i * 1000);
  }
  shapes.emplace_back("packed survivors", survivors);
  wire::Header empty_listed = Keys();
  for (int i = 0; i < entries; ++i) empty_listed.mutable_secagg_keys()->add_listed();
  shapes.emplace_back("empty listed entries", empty_listed);
  wire::Header one_proof = Keys();  // A repeated field's array in each entry.
  for (int i = 0; i < entries; ++i) {
    one_proof.mutable_secagg_keys()->add_listed()->add_identity_proof();
  }
  shapes.emplace_back("empty entries of one empty proof", one_proof);
  wire::Header empty_seeds = Keys();
  for (int i = 0; i < entries; ++i) empty_seeds.mutable_secagg_keys()->add_seeds();
  shapes.emplace_back("empty seeds", empty_seeds);
  wire::Header unknown = Keys();
  auto* set = unknown.mutable_secagg_keys()->GetReflection()->MutableUnknownFields(
      unknown.mutable_secagg_keys());
  for (int i = 0; i < entries; ++i) {
    set->AddLengthDelimited(100, i % 2 ? "" : std::string(20, 'u'));
    set->AddVarint(101, i);
  }
  shapes.emplace_back("unknown fields", unknown);
  // Survivors (uint32, field 3) sent as fixed64: kept as unknown fields.
  wire::Header mismatched;
  mismatched.set_version(wire::VERSION_1);
  auto* request = mismatched.mutable_secagg_unmask_request();
  for (int i = 0; i < entries; ++i) {
    request->GetReflection()->MutableUnknownFields(request)->AddFixed64(3, i);
  }
  shapes.emplace_back("survivors of another wire type", mismatched);
  return shapes;
}

// The heap bytes in use, as glibc counts them (chunk headers included);
// 0 where malloc is not glibc's (under a sanitizer).
uint64_t HeapInUse() {
#ifdef __GLIBC__
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
#else
  return 0;
#endif
}

TEST(ParseCostTest, BoundsWhatParsingAllocatesWithoutOverstatingIt) {
  for (int entries : {1, 3, 2000}) {
    for (const auto& [name, h] : Shapes(entries)) {
      const std::string bytes = h.SerializeAsString();
      const uint64_t cost = Cost(h);
      const uint64_t before = HeapInUse();
      auto parsed = std::make_unique<wire::Header>();
      ASSERT_TRUE(parsed->ParseFromString(bytes)) << name;
      const uint64_t allocated = HeapInUse() - before;
      const std::string where = name + ", " + std::to_string(entries) + " entries";
      EXPECT_GE(cost, parsed->SpaceUsedLong()) << where;
      if (allocated == 0) continue;  // Not glibc's malloc.
      EXPECT_GE(cost, allocated) << where;
      EXPECT_LE(cost, 2 * allocated + 512) << where;
    }
  }
}

// Measured: roster 3.23, listed adverts 3.49, packed survivors 2.06; empty
// listed entries 60, empty seeds 32, unknown fields 7.9.
TEST(ParseCostTest, EmptyEntriesCostTensOfTimesTheirBytesAndFairHeadersAFew) {
  for (const auto& [name, h] : Shapes(20000)) {
    const double ratio = static_cast<double>(Cost(h)) / h.ByteSizeLong();
    if (name.rfind("empty", 0) == 0) {
      EXPECT_GT(ratio, 15) << name;
    } else if (name != "unknown fields") {
      EXPECT_LT(ratio, kParsedBytesPerHeaderByte) << name;
    }
  }
}

TEST(ParseCostTest, StopsOnceOverTheLimit) {
  const wire::Header h = Shapes(20000)[3].second;
  StatusOr<uint64_t> cost =
      ParseCost(*wire::Header::descriptor(), h.SerializeAsString(), /*limit=*/10000);
  ASSERT_TRUE(cost.ok());
  EXPECT_GT(*cost, 10000u);
  EXPECT_LT(*cost, 11000u);
}

TEST(ParseCostTest, RefusesMalformedBytesNamingWhatWasWrong) {
  const auto* type = wire::Header::descriptor();
  auto message = [&](const std::string& bytes) {
    StatusOr<uint64_t> cost = ParseCost(*type, bytes, kNoLimit);
    return cost.ok() ? std::string("accepted") : std::string(cost.status().message());
  };
  // Field 19 (secagg_keys), length 9 with 2 bytes left.
  EXPECT_EQ(message(std::string("\x9a\x01\x09\x08\x01", 5)), "a length past the end of Header");
  // A group in field 1 of Header.
  EXPECT_EQ(message(std::string("\x0b\x0c", 2)),
            "a group (field 1 of Header), which this protocol never sends");
  // A varint cut short, and a tag cut short.
  EXPECT_EQ(message(std::string("\x08\xff", 2)), "a field value cut short in Header");
  EXPECT_EQ(message(std::string("\x08\x01\x80", 3)), "a bad tag (read up to byte 3 of Header)");
  EXPECT_EQ(message(std::string("\x08\x01\x00\x08\x01", 5)),
            "a bad tag (read up to byte 3 of Header)");  // Field 0.
  // Nesting: Value > ListValue > Value ..., two levels a step.
  google::protobuf::Value value;
  google::protobuf::Value* inner = &value;
  for (int depth = 0; depth < 50; ++depth) inner = inner->mutable_list_value()->add_values();
  StatusOr<uint64_t> cost =
      ParseCost(*google::protobuf::Value::descriptor(), value.SerializeAsString(), kNoLimit);
  EXPECT_TRUE(cost.ok()) << cost.status();  // 100 deep, as protobuf allows.
  inner->mutable_list_value();
  cost = ParseCost(*google::protobuf::Value::descriptor(), value.SerializeAsString(), kNoLimit);
  EXPECT_EQ(cost.status().message(), "messages nested deeper than 100");
}

TEST(ParseCostTest, ADecodedHeaderOfEmptyEntriesIsRefusedBeforeItIsParsed) {
  Limits limits;
  limits.max_header_bytes = 1 << 20;
  wire::Header hostile = Keys();
  // Each empty entry is 2 bytes; 100 bytes to spare for the rest.
  for (size_t i = 0; i < (limits.max_header_bytes - 100) / 2; ++i) {
    hostile.mutable_secagg_keys()->add_listed();
  }
  // Parsed, it would take 60 times its bytes.
  wire::Header parsed;
  ASSERT_TRUE(parsed.ParseFromString(hostile.SerializeAsString()));
  EXPECT_GT(parsed.SpaceUsedLong(), 40 * limits.max_header_bytes);
  StatusOr<Envelope> env = DecodeEnvelope(EncodeEnvelope(hostile), limits);
  ASSERT_EQ(env.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(env.status().message(),
            "header frame of " + std::to_string(hostile.ByteSizeLong()) +
                " bytes would take more than 4194304 bytes of memory once parsed (4 times the "
                "header limit): too many entries for its size");

  // A roster of 32-byte keys as large (35 bytes each) takes 3.2 times its
  // bytes: accepted.
  wire::Header roster;
  roster.set_version(wire::VERSION_1);
  for (size_t i = 0; i < (limits.max_header_bytes - 100) / 35; ++i) {
    roster.mutable_task()->mutable_secagg()->add_roster(std::string(32, 'k'));
  }
  env = DecodeEnvelope(EncodeEnvelope(roster), limits);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->header.task().secagg().roster_size(), roster.task().secagg().roster_size());
}

}  // namespace
}  // namespace cohort::net
