#include "coordinator/client_registry.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>

namespace cohort::coordinator {
namespace {

constexpr TimeMs kTimeout = 1000;

wire::Hello HelloOf(const std::string& name, uint64_t samples = 100, uint8_t key = 0) {
  wire::Hello h;
  h.set_client_name(name);
  h.set_num_samples(samples);
  if (key != 0) h.set_identity_key(std::string(crypto::kEd25519PublicBytes, char(key)));
  return h;
}

class ClientRegistryTest : public ::testing::Test {
 protected:
  // Registers `hello` from `peer` as the engine does: checked first.
  ClientRegistry::Registration Join(const std::string& peer, const wire::Hello& hello, TimeMs now) {
    std::optional<crypto::Ed25519Public> identity;
    auto refusal = registry_.CheckHello(hello, nullptr, false, identity);
    EXPECT_FALSE(refusal.has_value()) << refusal->reason;
    return registry_.Register(peer, hello, identity, now);
  }

  LogRedirectEnv env_{Env::Default(), std::make_shared<spdlog::logger>(
                                          "test", std::make_shared<spdlog::sinks::null_sink_st>())};
  ClientRegistry registry_{kTimeout, &env_};
};

TEST_F(ClientRegistryTest, HelloRulesRefuseBadNamesCountsAndBorrowedKeys) {
  std::optional<crypto::Ed25519Public> identity;
  auto bad_name = registry_.CheckHello(HelloOf("no spaces"), nullptr, false, identity);
  ASSERT_TRUE(bad_name.has_value());
  EXPECT_FALSE(bad_name->malformed);
  auto no_samples = registry_.CheckHello(HelloOf("a", 0), nullptr, false, identity);
  ASSERT_TRUE(no_samples.has_value());
  EXPECT_TRUE(no_samples->malformed);
  auto keyless = registry_.CheckHello(HelloOf("a"), nullptr, /*secure=*/true, identity);
  ASSERT_TRUE(keyless.has_value());
  EXPECT_NE(keyless->reason.find("identity key"), std::string::npos);

  Join("p1", HelloOf("alice", 100, 7), 0);
  auto borrowed = registry_.CheckHello(HelloOf("bob", 100, 7), nullptr, false, identity);
  ASSERT_TRUE(borrowed.has_value());
  EXPECT_NE(borrowed->reason.find("already registered by client \"alice\""), std::string::npos);

  AuthenticatedPeer sender{"carol", {}};
  auto impostor = registry_.CheckHello(HelloOf("dave"), &sender, false, identity);
  ASSERT_TRUE(impostor.has_value());
  EXPECT_NE(impostor->reason.find("allowlist name \"carol\""), std::string::npos);
}

TEST_F(ClientRegistryTest, SampleCountStaysOnTheSameConnection) {
  EXPECT_TRUE(Join("p1", HelloOf("alice", 100), 0).is_new);
  const auto again = Join("p1", HelloOf("alice", 200), 10);
  EXPECT_TRUE(again.recount);
  EXPECT_EQ(registry_.at("alice").num_samples, 100u);
  // A new connection is a new process: it may bring a new count.
  const auto moved = Join("p2", HelloOf("alice", 300), 20);
  EXPECT_TRUE(moved.reconnected);
  EXPECT_FALSE(moved.recount);
  EXPECT_EQ(registry_.at("alice").num_samples, 300u);
  EXPECT_EQ(registry_.NameOf("p1"), nullptr);
  EXPECT_EQ(*registry_.NameOf("p2"), "alice");
}

TEST_F(ClientRegistryTest, AnotherNameOnAPeerEvictsItsOwner) {
  Join("p1", HelloOf("alice", 100, 7), 0);
  Join("p1", HelloOf("bob", 100), 5);
  EXPECT_EQ(registry_.Find("alice"), nullptr);
  EXPECT_EQ(registry_.PeerOf("alice"), "");
  EXPECT_EQ(registry_.size(), 1u);
  // Alice's key is free again.
  std::optional<crypto::Ed25519Public> identity;
  EXPECT_FALSE(registry_.CheckHello(HelloOf("carol", 100, 7), nullptr, false, identity));
  // Marking an unknown name inactive registers nothing.
  registry_.SetInactive("alice");
  registry_.Seen("alice", 6);
  EXPECT_EQ(registry_.size(), 1u);
}

TEST_F(ClientRegistryTest, SilentClientsExpireInNameOrder) {
  Join("p1", HelloOf("zed"), 0);
  Join("p2", HelloOf("amy"), 10);
  Join("p3", HelloOf("kim"), 500);
  EXPECT_EQ(registry_.NextTimeout(), TimeMs{kTimeout + 1});
  EXPECT_TRUE(registry_.ExpireSilent(kTimeout).empty());
  EXPECT_EQ(registry_.ExpireSilent(kTimeout + 11), (std::vector<std::string>{"amy", "zed"}));
  EXPECT_EQ(registry_.ActiveNames(), (std::vector<std::string>{"kim"}));
  EXPECT_EQ(registry_.NextTimeout(), TimeMs{500 + kTimeout + 1});
  registry_.Seen("amy", 1200);
  EXPECT_EQ(registry_.ActiveNames(), (std::vector<std::string>{"amy", "kim"}));
}

TEST_F(ClientRegistryTest, FinishWaitsForClientsHeardWithinTheTimeout) {
  Join("p1", HelloOf("alice"), 0);
  Join("p2", HelloOf("bob"), 0);
  registry_.SetInactive("bob");  // Dropped from the last round, maybe alive.
  registry_.AcknowledgeFinish("alice");
  EXPECT_FALSE(registry_.AllAcknowledgedFinish(kTimeout));
  EXPECT_TRUE(registry_.AllAcknowledgedFinish(kTimeout + 1));
  registry_.AcknowledgeFinish("bob");
  EXPECT_TRUE(registry_.AllAcknowledgedFinish(0));
}

}  // namespace
}  // namespace cohort::coordinator
