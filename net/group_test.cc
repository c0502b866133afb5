// Ranks that authenticate each other (CURVE over ZeroMQ, or TCP
// connections that prove the pair's key), as threads, each
// with a context of its own as separate processes would have: they meet
// and sum; a key outside the allowlist cannot join; and a message that
// claims another rank's number, plaintext or under another rank's key, is
// never delivered.
#include "net/group.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "net/curve.h"
#include "net/tcp_transport.h"
#include "net/zmq_transport.h"

namespace cohort::net {
namespace {

struct Member {
  crypto::Ed25519KeyPair identity = std::move(crypto::GenerateEd25519()).value();
  zmq::context_t context{1};
  StatusOr<std::unique_ptr<collective::Transport>> transport = UnavailableError("not joined");
};

std::string Master(const std::string& tag) {
  return "ipc:///tmp/cohort-group-test-" + std::to_string(getpid()) + "-" + tag;
}

// Joins members[r] as rank r of a tcp group whose allowlist holds `allowed`.
void JoinAll(std::vector<Member>& members, const std::vector<int>& allowed,
             const std::string& master, TimeMs timeout_ms, bool encrypt = true,
             const std::string& host = "127.0.0.1") {
  std::vector<crypto::AllowedKey> allowlist;
  for (int r : allowed)
    allowlist.push_back({"rank-" + std::to_string(r), members[r].identity.public_key});
  std::vector<std::thread> threads;
  for (size_t r = 0; r < members.size(); ++r) {
    threads.emplace_back([&, r] {
      GroupOptions o{.rank = int(r),
                     .size = int(members.size()),
                     .master = master,
                     .transport = "tcp",
                     .host = host,
                     .identity = &members[r].identity,
                     .allowlist = allowlist,
                     .master_key = members[0].identity.public_key,
                     .encrypt = encrypt};
      members[r].transport = JoinGroup(members[r].context, o, {.timeout_ms = timeout_ms});
    });
  }
  for (auto& t : threads) t.join();
}

// Encrypted (ZeroMQ CURVE) or not (TCP connections that prove the pair's
// key): the same sum.
class GroupSumTest : public ::testing::TestWithParam<bool> {};

// The joined members all-reduce 1, 2, ... and each gets their sum.
void ExpectSum(std::vector<Member>& members, bool encrypt) {
  const int n = int(members.size());
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> data(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(members[r].transport.ok()) << members[r].transport.status().ToString();
    EXPECT_EQ(dynamic_cast<TcpTransport*>(members[r].transport->get()) == nullptr, encrypt);
    data[r].assign(100000, float(r + 1));
  }
  std::vector<Status> results(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      collective::Communicator comm(members[r].transport->get());
      results[r] = comm.AllReduce(data[r], {.timeout_ms = 10000});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(results[r].ok()) << results[r].ToString();
    EXPECT_EQ(data[r].front(), float(n * (n + 1) / 2));
    EXPECT_EQ(data[r].back(), float(n * (n + 1) / 2));
  }
}

TEST_P(GroupSumTest, AuthenticatedRanksMeetAndSum) {
  const bool encrypt = GetParam();
  std::vector<Member> members(3);
  JoinAll(members, {0, 1, 2}, Master(encrypt ? "sum-curve" : "sum-tcp"), 10000, encrypt);
  ExpectSum(members, encrypt);
}

// A port on 127.0.0.1 that was free a moment ago: a tcp master must be
// known before rank 0 binds it.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// Slurm names hosts: rank 0 meets the others at the first node's name
// (tcp://NODE:PORT) and each rank is reached at its node's name, neither of
// which ZeroMQ would bind. Here the node is "localhost".
TEST_P(GroupSumTest, RanksGivenHostNamesMeetAndSum) {
  const bool encrypt = GetParam();
  std::vector<Member> members(3);
  JoinAll(members, {0, 1, 2}, "tcp://localhost:" + std::to_string(FreePort()), 10000, encrypt,
          "localhost");
  ExpectSum(members, encrypt);
}

INSTANTIATE_TEST_SUITE_P(Encryption, GroupSumTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "curve" : "tcp"; });

// The one resolver of a rank's host and of `cohort launch --master`.
TEST(GroupTest, AHostNameResolvesToItsIpv4AddressOrIsNamed) {
  EXPECT_EQ(*ResolveIpv4("localhost"), "127.0.0.1");
  EXPECT_EQ(*ResolveIpv4("127.0.0.1"), "127.0.0.1");
  StatusOr<std::string> unknown = ResolveIpv4("no-such-host.invalid");
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find(
                "host \"no-such-host.invalid\" does not resolve to an IPv4 address"),
            std::string::npos)
      << unknown.status();
}

TEST(GroupTest, AKeyOutsideTheAllowlistDoesNotJoin) {
  std::vector<Member> members(3);
  JoinAll(members, {0, 1}, Master("outsider"), 1500);  // Rank 2's key is not listed.
  ASSERT_FALSE(members[0].transport.ok());
  EXPECT_NE(members[0].transport.status().message().find("rank(s) 2 did not report"),
            std::string::npos)
      << members[0].transport.status().ToString();
  EXPECT_FALSE(members[2].transport.ok());
}

TEST(GroupTest, PlaintextOverTcpIsRefusedUnlessInsecure) {
  zmq::context_t context(1);
  auto t = JoinGroup(context, {.rank = 0, .size = 2, .master = Master("plain"), .transport = "tcp"},
                     {.timeout_ms = 100});
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("authenticate"), std::string::npos);
}

// Every backend comes from one table (net/join.h): a name outside it is
// refused, naming the ones there are; shared memory meeting over the
// network is refused unless insecure.
TEST(GroupTest, AnUnknownTransportIsRefusedNamingTheRegisteredOnes) {
  zmq::context_t context(1);
  auto t = JoinGroup(context, {.rank = 0, .size = 2, .master = Master("x"), .transport = "rdma"},
                     {.timeout_ms = 100});
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "transport \"rdma\": expected auto, shm, tcp or mpi");
  auto shm =
      JoinGroup(context, {.rank = 0, .size = 2, .master = "tcp://127.0.0.1:1", .transport = "shm"},
                {.timeout_ms = 100});
  EXPECT_EQ(shm.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(shm.status().message().find("meet at an ipc:// address"), std::string::npos);
}

// Without encryption the data connections still prove the key each pair of
// ranks agrees from its identities: a rank that knows rank 0 under another
// key (here: rank 1, holding the right key to meet rank 0 but an allowlist
// with rank 0's name on a stranger's key) never gets a connection.
TEST(GroupTest, UnencryptedConnectionsProveThePairsKey) {
  std::vector<Member> members(2);
  const auto stranger = std::move(crypto::GenerateEd25519()).value();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<crypto::AllowedKey> allowlist = {
          {"rank-0", r == 0 ? members[0].identity.public_key : stranger.public_key},
          {"rank-1", members[1].identity.public_key}};
      GroupOptions o{.rank = r,
                     .size = 2,
                     .master = Master("pairkey"),
                     .transport = "tcp",
                     .identity = &members[r].identity,
                     .allowlist = allowlist,
                     .master_key = members[0].identity.public_key,
                     .encrypt = false};
      members[r].transport = JoinGroup(members[r].context, o, {.timeout_ms = 3000});
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(members[0].transport.ok());
  EXPECT_NE(members[0].transport.status().message().find("did not prove the key of the pair"),
            std::string::npos)
      << members[0].transport.status();
  EXPECT_FALSE(members[1].transport.ok());
}

// Sends one well-formed collective-sized message claiming `claimed_rank`.
void Inject(zmq::socket_t& push, uint32_t claimed_rank) {
  const uint8_t body[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  push.send(zmq::buffer(&claimed_rank, sizeof(claimed_rank)), zmq::send_flags::sndmore);
  push.send(zmq::buffer(body, sizeof(body)), zmq::send_flags::none);
}

TEST(GroupTest, AMessageUnderAnotherRanksNameIsNeverDelivered) {
  std::vector<Member> members(3);
  JoinAll(members, {0, 1, 2}, Master("spoof"), 10000);
  for (auto& m : members) ASSERT_TRUE(m.transport.ok()) << m.transport.status().ToString();
  auto* rank0 = dynamic_cast<ZmqTransport*>(members[0].transport->get());
  ASSERT_NE(rank0, nullptr);
  zmq::context_t attacker(1);
  // Plaintext: the CURVE handshake fails, nothing arrives.
  zmq::socket_t plain(attacker, zmq::socket_type::push);
  plain.set(zmq::sockopt::linger, 0);
  plain.connect(rank0->endpoint());
  Inject(plain, 1);
  // Rank 2's own key, claiming to be rank 1: admitted by the allowlist,
  // dropped for the name.
  zmq::socket_t insider(attacker, zmq::socket_type::push);
  insider.set(zmq::sockopt::linger, 0);
  const crypto::CurveKeys keys2 = std::move(crypto::CurveKeysFor(members[2].identity)).value();
  ASSERT_TRUE(
      SetUpCurveClient(insider, keys2,
                       std::move(crypto::CurvePublicFor(members[0].identity.public_key)).value())
          .ok());
  insider.connect(rank0->endpoint());
  Inject(insider, 1);
  // The genuine rank 1 sends too: what rank 0 gets from rank 1 is rank 1's
  // message.
  const uint8_t real[4] = {9, 9, 9, 9};
  ASSERT_TRUE(members[1].transport.value()->Send(0, real, {}).ok());
  auto m = rank0->Receive(1, SteadyNowMs() + 5000);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->bytes().size(), 4u);
  EXPECT_EQ(std::memcmp(m->data(), real, 4), 0);
  // Whenever the forgery arrives (its handshake may finish after rank 1's
  // message), it is not delivered as rank 1's; it is counted.
  auto more = rank0->Receive(1, SteadyNowMs() + 1000);
  EXPECT_EQ(more.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(rank0->dropped(), 1u);
}

}  // namespace
}  // namespace cohort::net
