// Acceptance: hostile bytes from a raw ZeroMQ peer never stop a run. Random
// bytes, a truncated protobuf, an unknown message type, an oversized frame,
// an update of the wrong length, one with NaN and one for a past round are
// each rejected with a reason (sent back and logged), while an honest run
// alongside finishes all its rounds.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "common/rng.h"
#include "net/zmq_codec.h"
#include "store/run_store.h"
#include "tests/integration/cluster.h"

namespace cohort::testing {
namespace {

class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::rcvtimeo, 30000);  // Bounded: a lost reply fails the test.
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void SendRaw(std::vector<std::string> frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  void Send(const wire::Header& h, std::span<const float> payload = {}) {
    ASSERT_TRUE(net::SendFrames(socket_, "", net::EncodeEnvelope(h, payload)));
  }
  // The next message that is not a heartbeat ack.
  wire::Header Receive() {
    for (;;) {
      std::vector<zmq::message_t> frames;
      for (;;) {
        zmq::message_t m;
        if (!socket_.recv(m)) {
          ADD_FAILURE() << "no reply from the coordinator";
          return {};
        }
        const bool more = m.more();
        frames.push_back(std::move(m));
        if (!more) break;
      }
      wire::Header h;
      h.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()));
      if (!h.has_heartbeat_ack()) return h;
    }
  }
  wire::Header ExpectError(wire::ErrorCode code, const std::string& needle) {
    wire::Header h = Receive();
    EXPECT_TRUE(h.has_error()) << h.ShortDebugString();
    EXPECT_EQ(h.error().code(), code) << h.error().message();
    EXPECT_NE(h.error().message().find(needle), std::string::npos) << h.error().message();
    return h;
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
};

wire::Header Header() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

wire::Header UpdateHeader(const wire::RoundTask& task) {
  wire::Header h = Header();
  h.mutable_update()->set_round(task.round());
  h.mutable_update()->set_task_id(task.task_id());
  h.mutable_update()->set_num_samples(100);
  return h;
}

wire::RoundTask NextTask(RawPeer& peer) {
  for (;;) {
    wire::Header h = peer.Receive();
    if (h.has_task()) return h.task();
    if (!h.has_welcome() && !h.has_error()) {
      ADD_FAILURE() << "expected a task, got " << h.ShortDebugString();
      return {};
    }
  }
}

TEST(BadInputTest, HostilePeerNeverStopsTheRun) {
  Cluster cluster("badinput", 2);
  const std::string config =
      cluster.WriteConfig("run.textproto", 4, "min_clients: 2 start_clients: 3");
  const std::string run_dir = cluster.dir() / "run";
  const std::string endpoint = cluster.StartCoordinator(config, run_dir);
  for (int k = 0; k < 2; ++k) cluster.StartClient(k, endpoint);

  RawPeer evil(endpoint);
  // Before registering: garbage of every kind.
  Rng rng(1);
  std::string noise(300, '\0');
  for (char& c : noise) c = static_cast<char>(rng.Next());
  evil.SendRaw({noise});
  evil.ExpectError(wire::MALFORMED, "malformed header");
  wire::Header hello = Header();
  hello.mutable_hello()->set_client_name("evil");
  hello.mutable_hello()->set_num_samples(100);
  const std::string hello_bytes = hello.SerializeAsString();
  evil.SendRaw({hello_bytes.substr(0, hello_bytes.size() - 3)});
  evil.ExpectError(wire::MALFORMED, "malformed header");
  evil.SendRaw({std::string("\x08\x01\x98\x06\x01", 5)});  // Field 99: no such type.
  evil.ExpectError(wire::MALFORMED, "unknown or missing message type");
  evil.SendRaw({std::string(100000, 'x')});
  evil.ExpectError(wire::TOO_LARGE, "exceeds the limit");

  // Register, then misbehave inside the rounds.
  evil.Send(hello);
  wire::Header welcome = evil.Receive();
  ASSERT_TRUE(welcome.has_welcome()) << welcome.ShortDebugString();
  const size_t n = welcome.welcome().num_params();
  ASSERT_GT(n, 0u);

  wire::RoundTask task = NextTask(evil);  // Round 1.
  ASSERT_EQ(task.round(), 1u);
  const wire::RoundTask round1 = task;
  std::vector<float> wrong_length(n - 1, 0.0f);
  evil.Send(UpdateHeader(task), wrong_length);
  evil.ExpectError(wire::INVALID_UPDATE, "expected " + std::to_string(n));

  task = NextTask(evil);  // Round 2.
  ASSERT_EQ(task.round(), 2u);
  std::vector<float> nan(n, 0.0f);
  nan[n / 2] = std::numeric_limits<float>::quiet_NaN();
  evil.Send(UpdateHeader(task), nan);
  evil.ExpectError(wire::INVALID_UPDATE, "NaN");

  task = NextTask(evil);  // Round 3.
  ASSERT_EQ(task.round(), 3u);
  evil.Send(UpdateHeader(round1), std::vector<float>(n, 0.0f));
  evil.ExpectError(wire::STALE, "current round is 3");
  evil.Send(UpdateHeader(task), std::vector<float>(n + 1000, 0.0f));
  evil.ExpectError(wire::TOO_LARGE, "exceeds the limit");
  // After all that, an honest update from the same peer still counts.
  evil.Send(UpdateHeader(task), std::vector<float>(n, 0.0f));

  task = NextTask(evil);  // Round 4.
  ASSERT_EQ(task.round(), 4u);
  evil.Send(UpdateHeader(task), std::vector<float>(n, 0.0f));
  wire::Header finished = evil.Receive();
  EXPECT_TRUE(finished.has_finished()) << finished.ShortDebugString();
  evil.Send([] {
    wire::Header h = Header();
    h.mutable_heartbeat();
    return h;
  }());

  ASSERT_EQ(cluster.coordinator().Wait(), 0) << ReadFile(cluster.coordinator_log());
  for (int k = 0; k < 2; ++k) EXPECT_EQ(cluster.client(k).Wait(), 0);
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 4u);
  EXPECT_EQ(rounds[0].participants, 2u);
  EXPECT_EQ(rounds[0].dropped, 1u);
  EXPECT_EQ(rounds[1].participants, 2u);
  EXPECT_EQ(rounds[2].participants, 3u);
  EXPECT_EQ(rounds[3].participants, 3u);
  EXPECT_GT(rounds[3].test_accuracy, 0.9);
  const std::string log = ReadFile(cluster.coordinator_log());
  for (const char* reason : {"malformed header", "unknown or missing message type",
                             "exceeds the limit", "expected ", "NaN", "current round is 3"}) {
    EXPECT_NE(log.find(reason), std::string::npos) << "not logged: " << reason;
  }
}

// Hostile command lines (issue 29): sizes that overflowed or could never be
// allocated are refused before any work, naming the flag.
TEST(BadCommandLineTest, PartitionSizesOutOfRangeAreNamed) {
  TempDir dir("bad-partition");
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  } cases[] = {
      // Used to wrap to 0 samples in all and crash (SIGSEGV).
      {{"--samples", "4294967295", "--test-samples", "1"},
       "format synthetic: --samples 4294967295 is outside [1, 67108864]"},
      // These two aborted on std::bad_alloc.
      {{"--features", "4294967295"},
       "format synthetic: --features 4294967295 is outside [1, 65536]"},
      {{"--classes", "4294967295"}, "format synthetic: --classes 4294967295 is outside [2, 65536]"},
  };
  int n = 0;
  for (const Case& c : cases) {
    std::vector<std::string> args = {"partition", "--format", "synthetic", "--out", dir / "out"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const std::string log = dir / ("partition-" + std::to_string(n++) + ".log");
    std::string out;
    EXPECT_EQ(RunCohort(args, &out, log), 1) << ReadFile(log);
    EXPECT_NE(ReadFile(log).find("partition: INVALID_ARGUMENT: " + c.says), std::string::npos)
        << ReadFile(log);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out/client-000.shard"));
}

// `cohort status` reads: on a run.db that is empty (or anything but a run
// store) it says so and leaves the file as it was. It used to write a
// schema into it.
TEST(BadCommandLineTest, StatusOnAFileThatIsNoRunStoreLeavesItAlone) {
  TempDir dir("bad-status");
  WriteFile(dir / "run.db", "");
  std::string out;
  EXPECT_EQ(RunCohort({"status", "--run-dir", dir.path()}, &out, dir / "status.log"), 1);
  EXPECT_NE(ReadFile(dir / "status.log")
                .find("status: INVALID_ARGUMENT: " + (dir / "run.db") +
                      ": not a Cohort run store (it has no runs table)"),
            std::string::npos)
      << ReadFile(dir / "status.log");
  EXPECT_EQ(std::filesystem::file_size(dir / "run.db"), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir / "run.db-wal"));

  WriteFile(dir / "run.db", "not a database, just text\n");
  EXPECT_EQ(RunCohort({"status", "--run-dir", dir.path()}, &out, dir / "status2.log"), 1);
  EXPECT_NE(ReadFile(dir / "status2.log").find("run.db: not a Cohort run store ("),
            std::string::npos)
      << ReadFile(dir / "status2.log");
  EXPECT_EQ(ReadFile(dir / "run.db"), "not a database, just text\n");
}

}  // namespace
}  // namespace cohort::testing
