// The collectives with each rank a process of its own, joined through the
// rendezvous as `cohort worker` ranks are (collective_test.cc runs the same
// sums with ranks as threads). Its own binary: the ranks are forked from a
// process that has started no thread yet.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "collective/collective.h"
#include "net/group.h"

namespace cohort::net {
namespace {

// What rank `rank` of `world` adds in at element i: small integers, so the
// float sums are exact and order-free.
float FloatInput(int rank, size_t i) { return float((rank + 1) * int(i % 13 + 1)); }
int64_t IntInput(int rank, size_t i) { return (rank + 1) * (int64_t(i) - 5) * 1000003; }

// One rank: every length and type against the serial sum. The exit code
// says what failed (0: all matched).
int Rank(int rank, int world, const std::string& master, const std::string& transport,
         const std::vector<size_t>& lengths) {
  zmq::context_t context(1);
  const collective::CollectiveOptions options{.timeout_ms = 60000};
  auto joined = JoinGroup(
      context,
      {.rank = rank, .size = world, .master = master, .transport = transport, .insecure = true},
      options);
  if (!joined.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, joined.status().ToString().c_str());
    return 1;
  }
  collective::Communicator comm(joined->get());
  const int64_t ranks_sum = int64_t(world) * (world + 1) / 2;
  for (size_t n : lengths) {
    std::vector<float> x(n);
    std::vector<int64_t> y(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = FloatInput(rank, i);
      y[i] = IntInput(rank, i);
    }
    if (!comm.AllReduce(x, options).ok() || !comm.AllReduce(y, options).ok()) return 2;
    for (size_t i = 0; i < n; ++i) {
      if (x[i] != float(ranks_sum * int64_t(i % 13 + 1)) ||
          y[i] != ranks_sum * (int64_t(i) - 5) * 1000003) {
        std::fprintf(stderr, "rank %d of %d, %zu elements: element %zu is wrong\n", rank, world, n,
                     i);
        return 3;
      }
    }
  }
  return comm.Barrier(options).ok() ? 0 : 4;
}

// Forks `world` ranks; true when every one exits 0.
bool RunRanks(int world, const std::string& transport, const std::vector<size_t>& lengths) {
  static int instance = 0;
  const std::string master = "ipc:///tmp/cohort-collective-process-" + std::to_string(getpid()) +
                             "-" + std::to_string(instance++);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(Rank(r, world, master, transport, lengths));
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

TEST(CollectiveProcessTest, RanksAsProcessesSumLikeTheSerialSum) {
  for (const std::string transport : {"shm", "tcp"}) {
    for (int world = 1; world <= 8; ++world) {
      EXPECT_TRUE(RunRanks(world, transport, {1, 7, 1000, 65539}))
          << transport << ", " << world << " processes";
    }
    // 64 MiB and three elements, over three ranks (divisible by neither).
    EXPECT_TRUE(RunRanks(3, transport, {(size_t{64} << 20) / sizeof(float) + 3}))
        << transport << ", 64 MiB";
  }
}

}  // namespace
}  // namespace cohort::net
