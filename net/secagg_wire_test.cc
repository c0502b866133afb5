#include "net/secagg_wire.h"

#include <gtest/gtest.h>

namespace cohort::net {
namespace {

aggregation::SurvivorTag TagOf(uint8_t b) {
  aggregation::SurvivorTag t;
  t.fill(b);
  return t;
}

// A survivor's tags reach the coordinator intact; a repeated recipient or a
// tag of the wrong size is refused by name.
TEST(SecAggWireTest, SurvivorTagsRoundTripAndBadOnesAreRefused) {
  aggregation::SurvivorSignature sig;
  sig.from = 3;
  sig.signature.fill(7);
  sig.tags = {{1, TagOf(1)}, {4, TagOf(4)}};
  wire::Header h = ToWire(2, 9, sig);
  auto back = FromWire(h.secagg_signature(), 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tags, sig.tags);
  EXPECT_EQ(back->signature, sig.signature);

  wire::SecAggSignature twice = h.secagg_signature();
  *twice.add_tags() = twice.tags(0);
  auto r = FromWire(twice, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("two survivor tags for client 1"), std::string::npos)
      << r.status();

  wire::SecAggSignature short_tag = h.secagg_signature();
  short_tag.mutable_tags(1)->mutable_tag()->resize(31);
  r = FromWire(short_tag, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("survivor tag has 31 bytes"), std::string::npos)
      << r.status();
}

// In an unmask request, each signature carries its signer's tag for the
// recipient, or none.
TEST(SecAggWireTest, AnUnmaskRequestCarriesEachSignersTagOrNone) {
  aggregation::UnmaskRequest req;
  req.survivors = {0, 1, 2};
  for (uint32_t i : {0u, 2u}) {
    aggregation::SurvivorSignature s;
    s.from = i;
    if (i == 2) s.tag = TagOf(2);
    req.signatures.push_back(s);
  }
  wire::Header h = ToWire(2, 9, req);
  auto back = FromWire(h.secagg_unmask_request());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->signatures.size(), 2u);
  EXPECT_FALSE(back->signatures[0].tag.has_value());
  ASSERT_TRUE(back->signatures[1].tag.has_value());
  EXPECT_EQ(*back->signatures[1].tag, TagOf(2));

  h.mutable_secagg_unmask_request()->mutable_signatures(1)->mutable_tag()->append("x");
  auto bad = FromWire(h.secagg_unmask_request());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("survivor tag has 33 bytes"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace cohort::net
