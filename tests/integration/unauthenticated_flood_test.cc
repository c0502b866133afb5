// Transport limits. Acceptance: 1,000 TCP connections that never
// authenticate, each declaring the largest frame the coordinator accepts
// before CURVE has checked anything and sending all of it but the last byte,
// cost the coordinator under 256 MiB; the coordinator logs that it capped
// them and ends every one of them; an honest run alongside finishes all its
// rounds. Loopback only; bounded in count and time.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <thread>

#include "coordinator/daemon.h"
#include "store/run_store.h"
#include "proto/config_io.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

constexpr int kConnections = 1000;
// Issue 8's budget, for the ordinary build. Under AddressSanitizer (`make
// test-asan`) the coordinator also carries ASan's shadow memory and its
// quarantine of freed blocks (flooding connections free ~1 MiB each), so
// there the test allows twice as much and still catches a leak per
// connection (1000 connections x 1 MiB).
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kMemoryBudgetBytes = size_t{512} << 20;
#else
constexpr size_t kMemoryBudgetBytes = size_t{256} << 20;
#endif

// Raises this process's open-file limit towards `want` (children inherit it);
// returns the limit now in force.
int RaiseFdLimit(int want) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(want)) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, static_cast<rlim_t>(want));
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return static_cast<int>(rl.rlim_cur);
}

int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

// The coordinator states the largest frame it accepts in its log.
uint64_t FrameLimitFromLog(const std::string& log) {
  const std::string needle = "frames of at most ";
  const size_t at = log.find(needle);
  if (at == std::string::npos) return 0;
  return std::stoull(log.substr(at + needle.size()));
}

struct FloodResult {
  int connected = 0;             // Connections the coordinator's side accepted.
  int ended_by_coordinator = 0;  // Of those, closed by the coordinator in time.
  uint64_t bytes_sent = 0;
};

// Opens `count` connections to 127.0.0.1:`port`, as many at a time as the
// open-file limit allows. Each sends the greeting, then a command frame
// declaring `frame_bytes` and all of its body but the last byte, so the frame
// never completes; then it holds on until the coordinator closes it or
// `patience` has passed. `on_open` runs once, when the first wave has been opened.
FloodResult Flood(int port, int count, uint64_t frame_bytes, std::chrono::seconds patience,
                  const std::function<void()>& on_open) {
  const std::string stream = ZmtpGreeting("CURVE", false) + ZmtpCommandHeader(frame_bytes) +
                             std::string(frame_bytes - 1, '\0');
  const int wave = std::clamp(RaiseFdLimit(count + 256) - 128, 1, count);
  FloodResult result;
  bool first_wave = true;
  for (int opened = 0; opened < count; opened += wave) {
    struct Conn {
      int fd;
      size_t sent = 0;
      bool connected = false;
    };
    std::vector<Conn> conns;
    for (int i = opened; i < std::min(count, opened + wave); ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      if (fd < 0) break;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port));
      if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
        close(fd);
        continue;
      }
      conns.push_back({fd});
    }
    if (first_wave) on_open();
    first_wave = false;
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!conns.empty() && std::chrono::steady_clock::now() < deadline) {
      std::vector<pollfd> fds;
      for (const Conn& c : conns) {
        const short out = !c.connected || c.sent < stream.size() ? POLLOUT : 0;
        fds.push_back({c.fd, static_cast<short>(POLLIN | out), 0});
      }
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = conns.size(); i-- > 0;) {
        Conn& c = conns[i];
        const short events = fds[i].revents;
        if (events == 0) continue;
        bool ended = false;
        if (!c.connected) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) {
            ended = true;
          } else {
            c.connected = true;
            ++result.connected;
          }
        }
        if (!ended && (events & POLLOUT) && c.sent < stream.size()) {
          const ssize_t n =
              send(c.fd, stream.data() + c.sent, stream.size() - c.sent, MSG_NOSIGNAL);
          if (n > 0) {
            c.sent += static_cast<size_t>(n);
            result.bytes_sent += static_cast<uint64_t>(n);
          } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            ended = true;
          }
        }
        if (!ended && (events & (POLLIN | POLLHUP | POLLERR))) {
          char buf[4096];  // The coordinator's greeting; then EOF or a reset.
          const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ended = true;
        }
        if (ended) {
          if (c.connected) ++result.ended_by_coordinator;
          close(c.fd);
          conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
    }
    for (const Conn& c : conns) close(c.fd);
  }
  return result;
}

TEST(UnauthenticatedFloodTest, CostsBoundedMemoryAndAnHonestRunFinishes) {
  RaiseFdLimit(kConnections + 256);  // Before the coordinator starts: it inherits the limit.
  Cluster cluster("unauth_flood", 3);
  cluster.EnableCurve({0, 1, 2});
  const std::string config =
      cluster.WriteConfig("run.textproto", 3, "min_clients: 3 start_clients: 3");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  const uint64_t frame_limit = FrameLimitFromLog(ReadFile(cluster.coordinator_log()));
  ASSERT_GT(frame_limit, 1u) << ReadFile(cluster.coordinator_log());
  // Clients 0 and 1 connect while the flood goes on; no round can start
  // before client 2, which joins after it, so the coordinator serves the whole
  // flood.
  const auto started = std::chrono::steady_clock::now();
  const FloodResult flood =
      Flood(PortOf(endpoint), kConnections, frame_limit - 1, std::chrono::seconds(20), [&] {
        cluster.StartClient(0, endpoint);
        cluster.StartClient(1, endpoint);
      });
  const double flood_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  cluster.StartClient(2, endpoint);

  ASSERT_EQ(cluster.coordinator().Wait(std::chrono::seconds(120)), 0)
      << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  EXPECT_EQ(rounds.size(), 3u);
  for (const auto& r : rounds) EXPECT_EQ(r.participants, 3u) << "round " << r.round;

  const size_t peak = cluster.coordinator().peak_rss_bytes().value_or(0);
  std::cout << "flood: " << flood.connected << " connections, " << flood.ended_by_coordinator
            << " ended by the coordinator, " << (flood.bytes_sent >> 20) << " MiB sent in "
            << flood_s << " s (frames of " << frame_limit << " bytes); coordinator peak RSS "
            << (peak >> 20) << " MiB\n";
  EXPECT_EQ(flood.connected, kConnections);
  // Every connection was ended by the coordinator (the cap or the handshake
  // timeout), none outlived our patience.
  EXPECT_EQ(flood.ended_by_coordinator, flood.connected);
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak, kMemoryBudgetBytes) << "coordinator peak RSS " << (peak >> 20) << " MiB";
  const std::string log = ReadFile(cluster.coordinator_log());
  EXPECT_NE(log.find("had not authenticated"), std::string::npos) << log.substr(0, 4000);
}

// Clients that have authenticated do not hold a place under the cap: with
// room for 2 connections in their handshake, and a handshake timeout longer
// than the test, 4 clients all get in and the run finishes. The coordinator
// runs in this process, the only way to set its cap.
TEST(UnauthenticatedFloodTest, ClientsThatAuthenticatedMakeRoomForOthers) {
  Cluster cluster("cap_honest", 4);
  cluster.EnableCurve({0, 1, 2, 3});
  auto config = config::LoadRunConfig(
      cluster.WriteConfig("run.textproto", 2, "min_clients: 4 start_clients: 4"));
  ASSERT_TRUE(config.ok()) << config.status();
  coordinator::DaemonOptions options;
  options.config = *config;
  options.run_dir = cluster.dir() / "run";
  options.bind = "tcp://127.0.0.1:0";
  options.endpoint_file = cluster.dir() / "endpoint";
  options.identity = cluster.dir() / "keys/coordinator.key";
  options.allowlist = cluster.dir() / "allow";
  // Limits that would not bound anything are refused.
  std::atomic<bool> stop{false};
  options.handshake_timeout_ms = 0;
  EXPECT_EQ(coordinator::RunCoordinator(options, stop).code(), StatusCode::kInvalidArgument);
  options.handshake_timeout_ms = 5000;
  options.max_unauthenticated = 0;
  EXPECT_EQ(coordinator::RunCoordinator(options, stop).code(), StatusCode::kInvalidArgument);

  options.max_unauthenticated = 2;
  options.handshake_timeout_ms = 120000;
  std::promise<Status> result;
  std::thread coordinator([&] { result.set_value(coordinator::RunCoordinator(options, stop)); });
  auto done = result.get_future();
  ASSERT_TRUE(WaitForFile(
      options.endpoint_file, [&] { return std::filesystem::exists(options.endpoint_file); },
      std::chrono::seconds(30)));
  std::string endpoint = ReadFile(options.endpoint_file);
  endpoint.erase(endpoint.find_last_not_of("\n") + 1);
  for (int k = 0; k < 4; ++k) cluster.StartClient(k, endpoint);
  const bool finished = done.wait_for(std::chrono::seconds(40)) == std::future_status::ready;
  stop = true;
  coordinator.join();
  ASSERT_TRUE(finished) << "the run did not finish: clients were kept out";
  EXPECT_TRUE(done.get().ok());
  for (int k = 0; k < 4; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0) << "client " << k;
}

}  // namespace
}  // namespace cohort::testing
