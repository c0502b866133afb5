// All-reduce speed across processes on this host, with the peers' method
// (../shared/bench/peers/allreduce_gloo.py, allreduce_mpi.c): per size,
// warm-up, then timed iterations of { fill; barrier; t0; all-reduce; t1 };
// an iteration's time is the maximum over ranks, the figure the median.
// busbw = bytes * 2(n-1)/n / time (nccl-tests), GB = 1e9 bytes.
//
//   allreduce_bench [--world N] [--transport shm|tcp|tcp-auth|curve|zmq|zmq-ipc] [--exact]
//
// Forks N ranks; they meet over an ipc:// rendezvous, then move data over
// shared memory, plain TCP on 127.0.0.1 (tcp; tcp-auth: connections that
// prove the ranks' keys), ZeroMQ CURVE (curve: authenticated and encrypted),
// or plaintext ZeroMQ tcp:// or ipc://. One JSON line per size from rank 0.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "collective/collective.h"
#include "common/clock.h"
#include "crypto/key_files.h"
#include "net/group.h"
#include "net/rendezvous.h"
#include "net/zmq_transport.h"

using namespace cohort;

namespace {

struct Size {
  size_t bytes;
  int warmup, timed;
};
constexpr Size kSizes[] = {
    {4 << 10, 20, 200}, {1 << 20, 5, 50}, {16 << 20, 2, 15}, {64 << 20, 2, 7}};
// --bytes N --timed T (profiling): only that size, T timed iterations.
size_t g_only_bytes = 0;
int g_timed = 0;
bool g_pin = false;
// --pin-all: also when the ranks outnumber the cores, rank r on core
// r % cores (mpirun --bind-to core:overload-allowed).
bool g_pin_all = false;
collective::Algorithm g_algorithm =
    collective::Algorithm::kAuto;  // --algorithm  // --pin: rank r on CPU r, when there are enough
                                   // CPUs.

std::vector<crypto::Ed25519KeyPair> g_identities;  // --transport curve|tcp-auth.
std::vector<crypto::AllowedKey> g_allowlist;

// This rank's transport: shm, ZeroMQ ipc:// or tcp:// (plaintext), raw tcp
// (plaintext), or through net::JoinGroup with keys: tcp-auth (raw tcp,
// authenticated connections) and curve (ZeroMQ CURVE, encrypted).
StatusOr<std::unique_ptr<collective::Transport>> Join(zmq::context_t& context, int rank, int world,
                                                      const std::string& dir,
                                                      const std::string& transport) {
  const std::string master = "ipc://" + dir + "/rendezvous";
  const TimeMs deadline = SteadyNowMs() + 30000;
  if (transport == "curve" || transport == "tcp-auth" || transport == "shm" || transport == "tcp") {
    net::GroupOptions group{.rank = rank,
                            .size = world,
                            .master = master,
                            .transport = transport == "shm" ? "shm" : "tcp",
                            .encrypt = transport == "curve",
                            .insecure = transport == "tcp"};
    if (transport == "curve" || transport == "tcp-auth") {
      group.identity = &g_identities[rank];
      group.allowlist = g_allowlist;
      group.master_key = g_identities[0].public_key;
    }
    return net::JoinGroup(context, group, {.timeout_ms = 30000});
  }
  const std::string bind = transport == "zmq-ipc" ? "ipc://" + dir + "/rank-" + std::to_string(rank)
                                                  : std::string("tcp://127.0.0.1:0");
  COHORT_ASSIGN_OR_RETURN(auto z, net::ZmqTransport::Bind(context, rank, world, bind));
  COHORT_ASSIGN_OR_RETURN(auto endpoints,
                          net::Rendezvous(context, rank, world, master, z->endpoint(), deadline));
  COHORT_RETURN_IF_ERROR(z->Connect(endpoints));
  return std::unique_ptr<collective::Transport>(std::move(z));
}

int Rank(int rank, int world, const std::string& dir, const std::string& transport, bool exact) {
  zmq::context_t context(1);
  auto joined = Join(context, rank, world, dir, transport);
  if (!joined.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, joined.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<collective::Transport> t = std::move(*joined);
  collective::Communicator comm(t.get());
  collective::CollectiveOptions options{
      .algorithm = g_algorithm, .timeout_ms = 60000, .exact = exact};
  for (Size s : kSizes) {
    if (g_only_bytes != 0) {
      if (s.bytes != kSizes[0].bytes) continue;
      s.bytes = g_only_bytes;
      if (g_timed > 0) s.timed = g_timed;
    }
    std::vector<float> data(s.bytes / sizeof(float));
    std::vector<float> times(size_t(world) * s.timed, 0.0f);
    for (int i = 0; i < s.warmup + s.timed; ++i) {
      std::fill(data.begin(), data.end(), 1.0f);
      if (!comm.Barrier(options).ok()) return 1;
      const double t0 = WallSeconds();
      Status st = comm.AllReduce(data, options);
      const double t1 = WallSeconds();
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
        return 1;
      }
      if (data[0] != float(world)) return 2;
      if (i >= s.warmup) times[size_t(rank) * s.timed + (i - s.warmup)] = float(t1 - t0);
    }
    // Every rank's times to every rank (a sum of disjoint slots).
    if (!comm.AllReduce(times, options).ok()) return 1;
    if (rank != 0) continue;
    std::vector<double> worst(s.timed, 0.0);
    for (int r = 0; r < world; ++r) {
      for (int i = 0; i < s.timed; ++i) {
        worst[i] = std::max(worst[i], double(times[size_t(r) * s.timed + i]));
      }
    }
    std::nth_element(worst.begin(), worst.begin() + s.timed / 2, worst.end());
    const double med = worst[s.timed / 2];
    std::printf(
        "{\"bench\":\"allreduce\",\"impl\":\"cohort-%s%s\",\"world\":%d,\"bytes\":%zu,"
        "\"median_s\":%.6g,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f}\n",
        transport.c_str(), exact ? "-exact" : "", world, s.bytes, med, s.bytes / med / 1e9,
        s.bytes * 2.0 * (world - 1) / world / med / 1e9);
    std::fflush(stdout);
  }
  return comm.Barrier(options).ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int world = 2;
  std::string transport = "tcp";
  bool exact = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--world") && i + 1 < argc) {
      world = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--transport") && i + 1 < argc) {
      transport = argv[++i];
    } else if (!std::strcmp(argv[i], "--exact")) {
      exact = true;
    } else if (!std::strcmp(argv[i], "--algorithm") && i + 1 < argc) {
      const std::string a = argv[++i];
      g_algorithm = a == "ring" ? collective::Algorithm::kRing
                    : a == "rd" ? collective::Algorithm::kRecursiveDoubling
                                : collective::Algorithm::kAuto;
    } else if (!std::strcmp(argv[i], "--pin")) {
      g_pin = true;
    } else if (!std::strcmp(argv[i], "--pin-all")) {
      g_pin = g_pin_all = true;
    } else if (!std::strcmp(argv[i], "--bytes") && i + 1 < argc) {
      g_only_bytes = std::strtoull(argv[++i], nullptr, 10) / 4 * 4;
    } else if (!std::strcmp(argv[i], "--timed") && i + 1 < argc) {
      g_timed = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: allreduce_bench [--world N] [--transport "
                   "shm|tcp|tcp-auth|curve|zmq|zmq-ipc] [--exact] "
                   "[--bytes N [--timed T]]\n");
      return 2;
    }
  }
  const std::vector<std::string> kTransports = {"shm",   "tcp", "tcp-auth",
                                                "curve", "zmq", "zmq-ipc"};
  if (world < 1 || world > 64 ||
      std::find(kTransports.begin(), kTransports.end(), transport) == kTransports.end()) {
    std::fprintf(
        stderr, "allreduce_bench: --world 1..64, --transport shm|tcp|tcp-auth|curve|zmq|zmq-ipc\n");
    return 2;
  }
  for (int r = 0; r < world; ++r) {
    auto id = crypto::GenerateEd25519();
    if (!id.ok()) return 1;
    g_allowlist.push_back({.name = "rank-" + std::to_string(r), .key = id->public_key});
    g_identities.push_back(std::move(*id));
  }
  char tmpl[] = "/tmp/cohort-allreduce-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (g_pin && (g_pin_all || world <= sysconf(_SC_NPROCESSORS_ONLN))) {
        // Like Open MPI's default: each rank bound to a core, unless the
        // ranks outnumber the cores.
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(r % sysconf(_SC_NPROCESSORS_ONLN), &set);
        sched_setaffinity(0, sizeof(set), &set);
      }
      _exit(Rank(r, world, dir, transport, exact));
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::filesystem::remove_all(dir);
  return failed == 0 ? 0 : 1;
}
