#include "aggregation/secagg_wire.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace cohort::aggregation {
namespace {

aggregation::SurvivorTag TagOf(uint8_t b) {
  aggregation::SurvivorTag t;
  t.fill(b);
  return t;
}

// A setup survives the trip coordinator -> client field for field, and a
// wire setup with a field of the wrong size or an unknown mask generator is
// refused by name.
TEST(SecAggWireTest, SetupRoundTripsAndBadFieldsAreRefused) {
  SecAggSetup s;
  s.sparse = true;
  s.n = 5;
  s.k = 4;
  s.t = 3;
  s.index = 2;
  s.nonce.fill(9);
  s.roster_root.fill(8);
  s.roster_proof = {crypto::Digest{}, crypto::Digest{}, crypto::Digest{}};
  s.roster_proof[1].fill(6);
  s.roster.resize(5);
  for (uint8_t i = 0; i < 5; ++i) s.roster[i].fill(i);
  s.clip = 4.5f;
  s.scale = 1e6;
  s.total_weight = 150;
  s.prg = crypto::MaskPrg::kChaCha20;
  s.corrupt_fraction = 0.25f;
  s.stage_timeout_ms = 3000;
  s.round_deadline_ms = 60000;
  s.task_digest.fill(5);
  const wire::SecAggSetup w = ToWire(s);
  EXPECT_EQ(w.mask_prg(), 1u);  // wire.SecAggSetup.mask_prg: 1 is ChaCha20.
  auto back = FromWire(w);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sparse, s.sparse);
  EXPECT_EQ(back->n, s.n);
  EXPECT_EQ(back->k, s.k);
  EXPECT_EQ(back->t, s.t);
  EXPECT_EQ(back->index, s.index);
  EXPECT_EQ(back->nonce, s.nonce);
  EXPECT_EQ(back->roster_root, s.roster_root);
  EXPECT_EQ(back->roster_proof, s.roster_proof);
  EXPECT_EQ(back->roster, s.roster);
  EXPECT_EQ(back->clip, s.clip);
  EXPECT_EQ(back->scale, s.scale);
  EXPECT_EQ(back->total_weight, s.total_weight);
  EXPECT_EQ(back->prg, s.prg);
  EXPECT_EQ(back->corrupt_fraction, s.corrupt_fraction);
  EXPECT_EQ(back->stage_timeout_ms, s.stage_timeout_ms);
  EXPECT_EQ(back->round_deadline_ms, s.round_deadline_ms);
  EXPECT_EQ(back->task_digest, s.task_digest);
  EXPECT_EQ(ToWire(*back).SerializeAsString(), w.SerializeAsString());

  auto refused = [&](auto&& spoil, const std::string& words) {
    wire::SecAggSetup bad = w;
    spoil(bad);
    auto r = FromWire(bad);
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
  };
  refused([](wire::SecAggSetup& m) { m.mutable_context()->resize(31); }, "context is not 32 bytes");
  refused([](wire::SecAggSetup& m) { m.mutable_roster_root()->clear(); },
          "the roster root is not 32 bytes");
  refused([](wire::SecAggSetup& m) { m.mutable_roster_proof(1)->push_back('x'); },
          "a roster proof sibling is not 32 bytes");
  refused([](wire::SecAggSetup& m) { m.mutable_roster(3)->resize(5); },
          "roster key 3 is not 32 bytes");
  refused([](wire::SecAggSetup& m) { m.set_mask_prg(3); }, "unknown mask PRG 3");
  // A coordinator of a build before the digest sends none.
  refused([](wire::SecAggSetup& m) { m.clear_task_digest(); }, "the task digest is not 32 bytes");
}

// The task digest changes with every part of the task a coordinator could
// vary between clients to isolate one update (the seed and deadline are
// not among its inputs).
TEST(SecAggWireTest, TheTaskDigestCoversTheArchitectureSettingsFlagAndPayload) {
  config::ModelConfig model_config;
  model_config.add_hidden(16);
  config::TrainConfig train;
  train.set_learning_rate(0.05f);
  train.set_local_epochs(2);
  const std::vector<float> model = {1, 2, 3, 4};
  const crypto::Digest base = TaskDigest(model_config, train, false, model);
  EXPECT_EQ(TaskDigest(model_config, train, false, model), base);
  config::TrainConfig slower = train;
  slower.set_learning_rate(1e-30f);
  EXPECT_NE(TaskDigest(model_config, slower, false, model), base);
  config::TrainConfig fewer = train;
  fewer.set_local_epochs(1);
  EXPECT_NE(TaskDigest(model_config, fewer, false, model), base);
  EXPECT_NE(TaskDigest(model_config, train, true, model), base);
  // Another architecture reads the same values otherwise.
  config::ModelConfig deeper = model_config;
  deeper.add_hidden(8);
  EXPECT_NE(TaskDigest(deeper, train, false, model), base);
  std::vector<float> other = model;
  other[3] = -4;
  EXPECT_NE(TaskDigest(model_config, train, false, other), base);
  // A payload cut short, or with the SCAFFOLD variate after it.
  EXPECT_NE(TaskDigest(model_config, train, false, std::span<const float>(model).first(3)), base);
  std::vector<float> longer = model;
  longer.resize(8, 0.0f);
  EXPECT_NE(TaskDigest(model_config, train, false, longer), base);
  // A config that spells out defaults (as a coordinator restarted with an
  // equivalent config may: its resume check allows it) is the same task.
  config::ModelConfig spelled = model_config;
  spelled.set_arch("mlp");
  spelled.set_input_dim(784);
  spelled.mutable_input_shape();  // Set, but empty.
  config::TrainConfig spelled_train = train;
  spelled_train.set_fednova(false);
  EXPECT_EQ(TaskDigest(spelled, spelled_train, false, model), base);
  EXPECT_EQ(CanonicalBytes(spelled), CanonicalBytes(model_config));
  spelled.set_input_dim(785);
  EXPECT_NE(TaskDigest(spelled, train, false, model), base);
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

// The client's one translation of a server message into the variant its
// Handle takes: each server body becomes its stage's type, a bad one is
// refused as that body would be, and a client's body is no server message.
TEST(SecAggWireTest, ServerMessagesBecomeTheClientMachinesInput) {
  aggregation::SeedRoot root{TagOf(2), {TagOf(3)}};
  auto r = ServerMessageFromWire(ToWire(2, 9, root), 10, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(std::holds_alternative<aggregation::SeedRoot>(*r));
  EXPECT_EQ(std::get<aggregation::SeedRoot>(*r).root, root.root);
  aggregation::KeyList list;
  list.advert_root = TagOf(1);
  list.seeds = {TagOf(5), std::nullopt};
  wire::Header keys = ToWire(2, 9, list);
  auto l = ServerMessageFromWire(keys, 10, 4);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(std::get<aggregation::KeyList>(*l).seeds, list.seeds);
  keys.mutable_secagg_keys()->mutable_seeds(0)->resize(5);
  EXPECT_NE(ServerMessageFromWire(keys, 10, 4).status().message().find("seed contribution has 5"),
            std::string::npos);
  aggregation::CheckedConfirmation confirmation{3, {{1, TagOf(1)}}};
  auto tags = ServerMessageFromWire(ToWire(2, 9, confirmation), 10, 4);
  ASSERT_TRUE(tags.ok()) << tags.status();
  EXPECT_TRUE(std::holds_alternative<aggregation::Confirmations>(*tags));
  wire::Header update;
  update.mutable_update()->set_round(2);
  EXPECT_NE(ServerMessageFromWire(update, 10, 4)
                .status()
                .message()
                .find("not a secure-aggregation message from the coordinator"),
            std::string::npos);
}

// A malicious coordinator's list of empty entries would be tiny on the wire
// and large once copied: each list is held to what a cohort of n = 10 with
// k = 4 neighbours each can send, before the copy, naming the list.
TEST(SecAggWireTest, ListsLongerThanTheCohortAllowsAreRefusedBeforeTheyAreCopied) {
  struct List {
    std::function<void(wire::Header&)> add;  // One entry.
    int most;
    std::string name;
  };
  const std::vector<List> lists = {
      {[](wire::Header& h) { h.mutable_secagg_keys()->add_listed(); }, 5, "a key list"},
      {[](wire::Header& h) { h.mutable_secagg_keys()->add_seeds(); }, 10,
       "a list of seed contributions"},
      {[](wire::Header& h) {
         h.mutable_secagg_shares()->add_shares()->set_peer(h.secagg_shares().shares_size());
       },
       4, "a list of neighbours' shares"},
      {[](wire::Header& h) { h.mutable_secagg_checked()->add_members(1); }, 10, "a checked list"},
      {[](wire::Header& h) {
         auto* tag = h.mutable_secagg_confirm()->add_tags();
         tag->set_to(h.secagg_confirm().tags_size());
         tag->set_tag(std::string(32, 't'));
       },
       4, "a list of confirmations"},
      {[](wire::Header& h) { h.mutable_secagg_survivors()->add_survivors(1); }, 10,
       "a survivor list"},
      {[](wire::Header& h) { h.mutable_secagg_unmask_request()->add_survivors(1); }, 10,
       "an unmask request's survivors"},
      {[](wire::Header& h) { h.mutable_secagg_unmask_request()->add_dropped(1); }, 10,
       "an unmask request's dropped"},
      {[](wire::Header& h) { h.mutable_secagg_unmask_request()->add_signatures(); }, 10,
       "an unmask request's signatures"},
  };
  for (const List& list : lists) {
    wire::Header h;
    h.set_version(wire::VERSION_1);
    for (int i = 0; i < list.most; ++i) list.add(h);
    auto at_most = ServerMessageFromWire(h, 10, 4);
    EXPECT_EQ(at_most.status().message().find("more than the"), std::string::npos)
        << list.name << ": " << at_most.status();
    list.add(h);
    EXPECT_EQ(ServerMessageFromWire(h, 10, 4).status().message(),
              list.name + " of " + std::to_string(list.most + 1) + " entries, more than the " +
                  std::to_string(list.most) + " a cohort of 10 with 4 neighbours each can have");
  }
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
