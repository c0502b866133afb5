#include "net/connection_guard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "net/zmq_codec.h"

namespace cohort::net {
namespace {

TEST(PendingConnectionsTest, DropsTheNewestPastTheCapUntilASlotFrees) {
  PendingConnections c(/*cap=*/2, /*expire_ms=*/60000, /*report_interval_ms=*/10000);
  EXPECT_TRUE(c.OnAccepted(10, 0));
  EXPECT_TRUE(c.OnAccepted(11, 0));
  EXPECT_FALSE(c.OnAccepted(12, 1));
  EXPECT_FALSE(c.OnAccepted(13, 2));
  EXPECT_EQ(c.pending(), 2u);
  EXPECT_EQ(c.dropped_total(), 2u);
  c.OnClosed(12);  // A dropped connection closing frees nothing.
  EXPECT_FALSE(c.OnAccepted(14, 3));
  c.OnClosed(10);
  EXPECT_TRUE(c.OnAccepted(15, 4));
  c.OnAuthenticated(11);
  EXPECT_TRUE(c.OnAccepted(16, 5));
  EXPECT_FALSE(c.OnAccepted(17, 6));
  EXPECT_EQ(c.dropped_total(), 4u);
}

TEST(PendingConnectionsTest, UnknownDescriptorsAreIgnoredAndAReusedOneIsCountedOnce) {
  PendingConnections c(2, 60000, 10000);
  c.OnAuthenticated(99);
  c.OnClosed(98);
  EXPECT_EQ(c.pending(), 0u);
  EXPECT_TRUE(c.OnAccepted(5, 0));
  // Descriptor 5 again: its first connection closed without being seen.
  EXPECT_TRUE(c.OnAccepted(5, 1));
  EXPECT_EQ(c.pending(), 1u);
  EXPECT_TRUE(c.OnAccepted(6, 2));
  EXPECT_EQ(c.pending(), 2u);
}

TEST(PendingConnectionsTest, EntriesExpireAfterTheHandshakeTimeout) {
  PendingConnections c(1, /*expire_ms=*/100, 10000);
  EXPECT_TRUE(c.OnAccepted(3, 0));
  EXPECT_FALSE(c.OnAccepted(4, 99));
  EXPECT_TRUE(c.OnAccepted(5, 100));  // 3 is past its handshake timeout.
  EXPECT_EQ(c.pending(), 1u);
}

TEST(PendingConnectionsTest, ReportsTheFirstDropAtOnceThenOncePerInterval) {
  PendingConnections c(0, 60000, /*report_interval_ms=*/1000);
  EXPECT_EQ(c.TakeReport(0).dropped, 0u);
  EXPECT_FALSE(c.OnAccepted(3, 0));
  EXPECT_EQ(c.TakeReport(0).dropped, 1u);
  for (int fd = 4; fd < 104; ++fd) EXPECT_FALSE(c.OnAccepted(fd, 10 + fd));
  EXPECT_EQ(c.TakeReport(500).dropped, 0u);  // Not due yet.
  const auto report = c.TakeReport(1000);
  EXPECT_EQ(report.dropped, 100u);
  EXPECT_EQ(report.span_ms, 1000);
  EXPECT_EQ(c.TakeReport(5000).dropped, 0u);
  EXPECT_FALSE(c.OnAccepted(3, 5001));
  EXPECT_EQ(c.TakeReport(5002, /*flush=*/true).dropped, 1u);
  EXPECT_EQ(c.dropped_total(), 102u);
}

// A raw TCP connection to 127.0.0.1:port that never sends anything.
int RawConnect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Waits until the peer has closed `want` of `fds` (reading and discarding
// ZeroMQ's greeting); returns the ones still open. Bounded by `timeout`.
std::vector<int> WaitForClosed(std::vector<int> fds, size_t want, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t closed = 0;
  while (closed < want && std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back({fd, POLLIN, 0});
    if (poll(p.data(), p.size(), 100) <= 0) continue;
    for (size_t i = p.size(); i-- > 0;) {
      if (p[i].revents == 0) continue;
      char buf[256];
      if (recv(p[i].fd, buf, sizeof(buf), 0) > 0) continue;
      close(p[i].fd);
      fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
      ++closed;
    }
  }
  return fds;
}

TEST(ConnectionGuardTest, ConnectionsPastTheCapAreClosedAndAnHonestPeerStillGetsIn) {
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, 20000);  // Bounded: a lost message fails the test.
  GuardOptions options;
  options.max_unauthenticated = 2;
  options.handshake_timeout_ms = 60000;  // Longer than the test: only the cap closes.
  router.set(zmq::sockopt::handshake_ivl, options.handshake_timeout_ms);
  auto guard = ConnectionGuard::Watch(context, router, options);
  ASSERT_TRUE(guard.ok()) << guard.status();
  router.bind("tcp://127.0.0.1:0");
  const std::string endpoint = LastEndpoint(router);
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));

  // Five silent connections: two may wait for their handshake, the guard
  // closes the other three.
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) fds.push_back(RawConnect(port));
  const std::vector<int> open = WaitForClosed(fds, 3, std::chrono::seconds(20));
  EXPECT_EQ(open.size(), 2u);
  EXPECT_EQ((*guard)->dropped(), 3u);
  EXPECT_EQ((*guard)->pending(), 2u);

  // The silent ones leave; an honest peer connects and is heard.
  for (int fd : open) close(fd);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  dealer.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  zmq::pollitem_t item = {router.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::seconds(20)), 1);
  RawMessage raw;
  ASSERT_TRUE(TryReceive(router, true, raw));
  ASSERT_EQ(raw.frames.size(), 1u);
  EXPECT_EQ(raw.frames[0].to_string(), "hello");
  EXPECT_GE(raw.source_fd, 0);
  (*guard)->Authenticated(raw.source_fd);
  guard->reset();  // Before the socket, as the contract says.
}

}  // namespace
}  // namespace cohort::net
