#include "aggregation/secagg_wire.h"

#include <gtest/gtest.h>

namespace cohort::aggregation {
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

// Issue 29's messages: the seed commitment and its root, the contributions
// in a key list (none where nothing was committed), and the confirmations,
// each refused by name when a field has the wrong size or repeats.
TEST(SecAggWireTest, SeedAndConfirmationMessagesRoundTripAndBadOnesAreRefused) {
  aggregation::SeedCommit commit{4, TagOf(9)};
  wire::Header h = ToWire(2, 9, commit);
  auto c = FromWire(h.secagg_seed(), 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->commitment, commit.commitment);
  h.mutable_secagg_seed()->mutable_commitment()->resize(31);
  EXPECT_NE(FromWire(h.secagg_seed(), 4).status().message().find("seed commitment has 31 bytes"),
            std::string::npos);

  aggregation::SeedRoot root{TagOf(2), {TagOf(3), TagOf(4)}};
  auto r = FromWire(ToWire(2, 9, root).secagg_seed());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->root, root.root);
  EXPECT_EQ(r->proof, root.proof);

  aggregation::KeyList list;
  list.advert_root = TagOf(1);
  list.seeds = {TagOf(5), std::nullopt, TagOf(6)};
  auto l = FromWire(ToWire(2, 9, list).secagg_keys());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->seeds, list.seeds);
  wire::Header bad_seed = ToWire(2, 9, list);
  bad_seed.mutable_secagg_keys()->mutable_seeds(2)->resize(5);
  EXPECT_NE(FromWire(bad_seed.secagg_keys()).status().message().find("seed contribution has 5"),
            std::string::npos);

  aggregation::CheckedConfirmation confirmation{3, {{1, TagOf(1)}, {4, TagOf(4)}}};
  wire::Header ch = ToWire(2, 9, confirmation);
  auto back = FromWire(ch.secagg_confirm(), 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tags, confirmation.tags);
  wire::SecAggConfirm twice = ch.secagg_confirm();
  *twice.add_tags() = twice.tags(0);
  EXPECT_NE(FromWire(twice, 3).status().message().find("two confirmation tags for client 1"),
            std::string::npos);
  auto inbound = FromWire(ch.secagg_confirm());
  ASSERT_TRUE(inbound.ok());
  EXPECT_EQ(inbound->from, confirmation.tags);
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
}  // namespace cohort::aggregation
