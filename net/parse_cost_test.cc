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

// A length-delimited field, as the wire spells it.
std::string Delimited(int field, const std::string& bytes) {
  std::string out;
  for (uint64_t v : {uint64_t(field) << 3 | 2, uint64_t{bytes.size()}}) {
    for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>(v | 0x80));
    out.push_back(static_cast<char>(v));
  }
  return out + bytes;
}

// Fair: what a coordinator sends a client. Hostile: what would take more
// than kParsedBytesPerHeaderByte times its bytes.
enum class Kind { kFair, kHostile, kOther };

struct Shape {
  std::string name;
  Kind kind;
  wire::Header header;
};

// What the fair and the hostile headers of a client look like, at `entries`.
std::vector<Shape> Shapes(int entries) {
  std::vector<Shape> shapes;
  for (size_t key : {32, 41}) {  // The fairest large header: n 32-byte keys.
    wire::Header roster;
    roster.set_version(wire::VERSION_1);
    for (int i = 0; i < entries; ++i) {
      roster.mutable_task()->mutable_secagg()->add_roster(std::string(key, static_cast<char>(i)));
    }
    shapes.push_back({"roster of " + std::to_string(key) + "-byte keys",
                      key == 32 ? Kind::kFair : Kind::kOther, roster});
  }
  wire::Header listed = Keys();
  for (int i = 0; i < entries / 20; ++i) {
    auto* l = listed.mutable_secagg_keys()->add_listed();
    l->set_index(i);
    l->mutable_advert()->set_signature(std::string(64, 's'));
    l->set_identity(std::string(32, 'i'));
    for (int j = 0; j < 20; ++j) l->add_identity_proof(std::string(32, 'p'));
  }
  shapes.push_back({"listed adverts with proofs", Kind::kFair, listed});
  wire::Header survivors;
  survivors.set_version(wire::VERSION_1);
  for (int i = 0; i < entries; ++i) {
    survivors.mutable_secagg_unmask_request()->add_survivors(i * 1000);
  }
  shapes.push_back({"packed survivors", Kind::kFair, survivors});
  wire::Header empty_listed = Keys();
  for (int i = 0; i < entries; ++i) empty_listed.mutable_secagg_keys()->add_listed();
  shapes.push_back({"empty listed entries", Kind::kHostile, empty_listed});
  wire::Header one_proof = Keys();  // A repeated field's array in each entry.
  for (int i = 0; i < entries; ++i) {
    one_proof.mutable_secagg_keys()->add_listed()->add_identity_proof();
  }
  shapes.push_back({"empty entries of one empty proof", Kind::kHostile, one_proof});
  wire::Header empty_seeds = Keys();
  for (int i = 0; i < entries; ++i) empty_seeds.mutable_secagg_keys()->add_seeds();
  shapes.push_back({"empty seeds", Kind::kHostile, empty_seeds});
  wire::Header unknown = Keys();
  auto* set = unknown.mutable_secagg_keys()->GetReflection()->MutableUnknownFields(
      unknown.mutable_secagg_keys());
  for (int i = 0; i < entries; ++i) {
    set->AddLengthDelimited(100, i % 2 ? "" : std::string(20, 'u'));
    set->AddVarint(101, i);
  }
  shapes.push_back({"unknown fields", Kind::kHostile, unknown});
  // Survivors (uint32, field 3) sent as fixed64: kept as unknown fields.
  wire::Header mismatched;
  mismatched.set_version(wire::VERSION_1);
  auto* request = mismatched.mutable_secagg_unmask_request();
  for (int i = 0; i < entries; ++i) {
    request->GetReflection()->MutableUnknownFields(request)->AddFixed64(3, i);
  }
  shapes.push_back({"survivors of another wire type", Kind::kOther, mismatched});
  // TrainConfig.optimizer (field 6, a proto2 enum) = 3, which it does not
  // name, over and over: each kept as an unknown field.
  std::string train;
  for (int i = 0; i < entries; ++i) train += std::string("\x30\x03", 2);
  wire::Header enums;
  EXPECT_TRUE(enums.ParseFromString(wire::Header().SerializeAsString() +
                                    std::string("\x08\x01", 2) +
                                    Delimited(13, Delimited(4, train))));
  shapes.push_back({"values a closed enum does not name", Kind::kHostile, enums});
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
    for (const auto& [name, kind, h] : Shapes(entries)) {
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
      EXPECT_LE(cost, 2 * allocated + 1024) << where;
    }
  }
}

// Measured: roster 3.2, listed adverts 3.5, packed survivors 2.1; empty
// listed entries 60, empty seeds 32, unknown fields 7.9, unnamed enum
// values 16.
TEST(ParseCostTest, HostileEntriesCostTensOfTimesTheirBytesAndFairHeadersAFew) {
  for (const auto& [name, kind, h] : Shapes(20000)) {
    const double ratio = static_cast<double>(Cost(h)) / h.ByteSizeLong();
    if (kind == Kind::kFair) {
      EXPECT_LT(ratio, kParsedBytesPerHeaderByte) << name;
    } else if (kind == Kind::kHostile) {
      EXPECT_GT(ratio, kParsedBytesPerHeaderByte) << name;
    }
  }
}

TEST(ParseCostTest, StopsOnceOverTheLimit) {
  std::string bytes;
  for (const Shape& shape : Shapes(20000)) {
    if (shape.name == "empty listed entries") bytes = shape.header.SerializeAsString();
  }
  ASSERT_EQ(bytes.size(), 40009u);
  StatusOr<uint64_t> cost = ParseCost(*wire::Header::descriptor(), bytes, /*limit=*/10000);
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
  limits.max_header_bytes = 4 << 20;  // A budget of 16 MiB, 4 times.
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
                " bytes would take more than 16777216 bytes of memory once parsed: too many "
                "entries for its size");

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

// Small limits get a floor: a Hello's label counts for 60,000 classes, 1 byte
// each, cost 16 times their bytes, more than 4 times the coordinator's
// default limit of 64 KiB, and are a fair Hello.
TEST(ParseCostTest, AFairHelloOfManyClassesFitsTheFloor) {
  wire::Header hello;
  hello.set_version(wire::VERSION_1);
  hello.mutable_hello()->set_client_name("c1");
  for (int i = 0; i < 60000; ++i) hello.mutable_hello()->add_label_counts(i % 100);
  const Limits limits;  // 64 KiB.
  ASSERT_LT(hello.ByteSizeLong(), limits.max_header_bytes);
  EXPECT_GT(Cost(hello), kParsedBytesPerHeaderByte * limits.max_header_bytes);
  StatusOr<Envelope> env = DecodeEnvelope(EncodeEnvelope(hello), limits);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->header.hello().label_counts_size(), 60000);
}

}  // namespace
}  // namespace cohort::net
