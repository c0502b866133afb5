// Transport security: CURVE with an allowlist. A client whose key is not
// allowed cannot join; a byte-level TCP relay between a client and the
// coordinator never sees a known plaintext (the client's name, the model).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "store/run_store.h"
#include "crypto/key_files.h"
#include "net/envelope.h"
#include "tests/integration/cluster.h"
#include "train/backend.h"
#include "train/model.h"
#include "train/model_config.h"

namespace cohort::testing {
namespace {

// Forwards TCP connections from 127.0.0.1:port() to 127.0.0.1:target and
// records every byte, both ways.
class Relay {
 public:
  explicit Relay(int target) : target_(target) {
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listen_, 8);
    socklen_t len = sizeof(a);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    close(listen_);
  }
  int port() const { return port_; }
  std::string transcript() {
    std::lock_guard<std::mutex> lock(mu_);
    return transcript_;
  }

 private:
  void Loop() {
    std::vector<std::pair<int, int>> pairs;  // (client fd, server fd)
    while (!stop_) {
      std::vector<pollfd> fds = {{listen_, POLLIN, 0}};
      for (auto [c, s] : pairs) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({s, POLLIN, 0});
      }
      // Bounded so the destructor's stop flag is seen.
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = accept(listen_, nullptr, nullptr);
        const int s = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(target_);
        if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
          pairs.emplace_back(c, s);
        } else {
          close(c);
          close(s);
        }
      }
      std::vector<bool> dead(pairs.size(), false);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto& pr = pairs[(i - 1) / 2];
        if (dead[(i - 1) / 2]) continue;
        const int from = fds[i].fd, to = from == pr.first ? pr.second : pr.first;
        char buf[65536];
        const ssize_t n = read(from, buf, sizeof(buf));
        if (n <= 0) {
          // Either side closing ends the pair: ZeroMQ reconnects if it must.
          dead[(i - 1) / 2] = true;
          continue;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          transcript_.append(buf, n);
        }
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = write(to, buf + off, n - off);
          if (w <= 0) break;
          off += w;
        }
      }
      for (size_t p = pairs.size(); p-- > 0;) {
        if (!dead[p]) continue;
        close(pairs[p].first);
        close(pairs[p].second);
        pairs.erase(pairs.begin() + p);
      }
    }
    for (auto [c, s] : pairs) {
      close(c);
      close(s);
    }
  }

  int target_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string transcript_;
};

int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

// 64 bytes from `offset` of the initial model the coordinator sends (seed 5,
// mlp 20-H-4, as Cluster::WriteConfig configures).
std::string InitialModelBytes(int hidden = 16, size_t offset = 0) {
  auto backend = std::move(train::NewCpuBackend(1)).value();
  config::ModelConfig config;
  config.set_input_dim(20);
  config.set_num_classes(4);
  config.add_hidden(hidden);
  auto model = std::move(train::BuildModel(config, backend.get())).value();
  std::vector<float> params(model->num_params());
  model->Init(params, 5);
  if (offset + 64 > params.size() * sizeof(float)) return "";
  return std::string(reinterpret_cast<const char*>(params.data()) + offset, 64);
}

TEST(TransportTest, ClientOutsideTheAllowlistCannotJoin) {
  Cluster cluster("curve_allow", 3);
  cluster.EnableCurve({0, 1});  // client-2 has a key, but it is not allowed.
  const std::string config =
      cluster.WriteConfig("run.textproto", 2, "min_clients: 2 start_clients: 2");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  cluster.StartClient(2, endpoint);
  cluster.StartClient(0, endpoint);
  cluster.StartClient(1, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  EXPECT_EQ(cluster.client(0).Wait(), 0);
  EXPECT_EQ(cluster.client(1).Wait(), 0);
  cluster.client(2).Signal(SIGTERM);
  EXPECT_EQ(cluster.client(2).Wait(), 0);
  const std::string log = ReadFile(cluster.coordinator_log());
  EXPECT_NE(log.find("is not in the allowlist"), std::string::npos) << log;
  EXPECT_EQ(log.find("client client-002 registered"), std::string::npos);
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  for (uint32_t r = 1; r <= 2; ++r) {
    // Held in a variable: a range-for over *temporary would outlive it.
    auto clients = store->ClientRounds(r);
    ASSERT_TRUE(clients.ok()) << clients.status();
    for (const auto& c : *clients) EXPECT_NE(c.client, "client-002");
  }
}

TEST(TransportTest, AnAllowedClientCannotTakeAnotherClientsName) {
  Cluster cluster("curve_name", 2);
  cluster.EnableCurve({0, 1});
  const std::string config =
      cluster.WriteConfig("run.textproto", 1, "min_clients: 1 start_clients: 1");
  const std::string endpoint = cluster.StartCoordinator(config, cluster.dir() / "run");
  // client-001's key, client-000's name.
  cluster.StartClient(1, endpoint, {"--name", "client-000"});
  EXPECT_EQ(cluster.client(1).Wait(), 1);
  EXPECT_NE(
      ReadFile(cluster.dir() / "client-1.log").find("does not match this key's allowlist name"),
      std::string::npos);
  cluster.StartClient(0, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  EXPECT_EQ(cluster.client(0).Wait(), 0);
}

void RunThroughRelay(bool curve, std::string* transcript, std::string* client_key = nullptr,
                     int hidden = 16) {
  Cluster cluster(curve ? "curve_relay" : "plain_relay", 2);
  cluster.set_hidden_units(hidden);
  if (curve) cluster.EnableCurve({0, 1});
  const std::string config =
      cluster.WriteConfig("run.textproto", 2, "min_clients: 2 start_clients: 2");
  const std::string endpoint = cluster.StartCoordinator(config, cluster.dir() / "run");
  Relay relay(PortOf(endpoint));
  cluster.StartClient(0, "tcp://127.0.0.1:" + std::to_string(relay.port()));
  cluster.StartClient(1, endpoint);
  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  EXPECT_EQ(cluster.client(0).Wait(), 0);
  EXPECT_EQ(cluster.client(1).Wait(), 0);
  *transcript = relay.transcript();
  if (client_key != nullptr && curve) {
    // client-000's long-term CURVE public key, raw.
    auto pub = crypto::LoadPublicKey(cluster.dir() / "keys/client-000.pub");
    ASSERT_TRUE(pub.ok());
    auto curve_key = crypto::CurvePublicFor(*pub);
    *client_key = std::string(reinterpret_cast<const char*>(curve_key->data()), 32);
  }
}

TEST(TransportTest, RelayNeverSeesPlaintextUnderCurve) {
  const std::string model = InitialModelBytes();
  std::string plain, encrypted;
  // Control: without CURVE the relay sees the name and the model, so the
  // search below is able to find them.
  RunThroughRelay(false, &plain);
  ASSERT_GT(plain.size(), 1000u);
  EXPECT_NE(plain.find("client-000"), std::string::npos);
  EXPECT_NE(plain.find(model), std::string::npos);
  std::string client_key;
  RunThroughRelay(true, &encrypted, &client_key);
  ASSERT_GT(encrypted.size(), 1000u);
  ASSERT_EQ(client_key.size(), 32u);
  EXPECT_EQ(encrypted.find(client_key), std::string::npos) << "client key visible on the wire";
  EXPECT_EQ(encrypted.find("client-000"), std::string::npos);
  EXPECT_EQ(encrypted.find(model), std::string::npos);
  EXPECT_EQ(encrypted.find(model.substr(0, 16)), std::string::npos);
}

// Until CURVE has authenticated the coordinator, whoever answers at its
// address can make the client buffer a frame; the client drops the
// connection at a frame header over its limit (64 MiB + 4 KiB) rather than
// wait for the bytes.
TEST(TransportTest, ClientDropsAnOversizedFrameFromAnUnauthenticatedServer) {
  Cluster cluster("client_frame_limit", 1);
  cluster.EnableCurve({0});
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  cluster.StartClient(0, "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  pollfd p = {listener, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 30000), 1) << "the client did not connect";
  const int fd = accept(listener, nullptr, nullptr);
  const std::string bytes = ZmtpGreeting("CURVE", true) + ZmtpCommandHeader(uint64_t{65} << 20);
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  // The client's greeting and HELLO arrive; then it must close (bounded:
  // its handshake timeout would only close it after 30 s).
  bool closed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    pollfd q = {fd, POLLIN, 0};
    if (poll(&q, 1, 100) <= 0) continue;
    char buf[512];
    closed = recv(fd, buf, sizeof(buf), 0) <= 0;
  }
  EXPECT_TRUE(closed) << "the client still waits for the rest of a 65 MiB frame";
  close(fd);
  close(listener);
  cluster.client(0).Signal(SIGTERM);
  EXPECT_EQ(cluster.client(0).Wait(), 0);
}

// A model of 300,004 parameters (1.2 MB) travels as two payload frames, each
// within the coordinator's frame limit (about 1 MiB, whatever the model);
// both runs finish, and under CURVE the relay sees nothing of the second
// frame either.
TEST(TransportTest, AModelOfSeveralFramesCrossesTheRelayOnlyEncrypted) {
  constexpr int kHidden = 12000;
  const std::string second_frame = InitialModelBytes(kHidden, net::kPayloadChunkBytes + 4096);
  ASSERT_EQ(second_frame.size(), 64u);
  std::string plain, encrypted;
  RunThroughRelay(false, &plain, nullptr, kHidden);
  EXPECT_NE(plain.find(second_frame), std::string::npos);
  RunThroughRelay(true, &encrypted, nullptr, kHidden);
  ASSERT_GT(encrypted.size(), 2 * net::kPayloadChunkBytes);  // The model went both ways.
  EXPECT_EQ(encrypted.find(second_frame), std::string::npos);
  EXPECT_EQ(encrypted.find(InitialModelBytes(kHidden)), std::string::npos);
}

}  // namespace
}  // namespace cohort::testing
