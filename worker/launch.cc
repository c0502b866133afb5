// cohort launch: one node's workers, like torchrun (worker/launch.h).
#include "worker/launch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "net/group.h"

namespace cohort::worker {
namespace {

// Starts one worker with `env` added to the launcher's environment (its
// stdout and stderr are the launcher's). A program without a '/' is looked
// up on PATH; 127 is its exit status when it cannot be started.
StatusOr<pid_t> Spawn(const std::vector<std::string>& args,
                      const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child's environment, made before fork: the child only execs.
  std::vector<std::string> entries;
  for (const auto& [name, value] : env) entries.push_back(name + "=" + value);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const auto& kv) {
      return entry.size() > kv.first.size() && entry.substr(0, kv.first.size()) == kv.first &&
             entry[kv.first.size()] == '=';
    });
    if (!replaced) entries.emplace_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& e : entries) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return UnavailableError("fork failed");
  if (pid == 0) {
    execvpe(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "launch: cannot start %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

// A TCP port free on 127.0.0.1 now, for rank 0's store (as torchrun
// --standalone picks one; another process could take it in between, and
// the ranks' rendezvous then fails naming the address).
StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return UnavailableError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return UnavailableError("no free port on 127.0.0.1: " + why);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

using EnvList = std::vector<std::pair<std::string, std::string>>;

// This host's address on its route to `ip` (connecting a UDP socket sends
// nothing): where the other nodes reach this node's workers.
StatusOr<std::string> AddressToward(const std::string& ip, int port) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return UnavailableError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &to.sin_addr);
  sockaddr_in mine{};
  socklen_t len = sizeof(mine);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return UnavailableError("--host: no route from this host to the master " + ip + " (" + why +
                            "); give --host, the address the other nodes reach this one at");
  }
  close(fd);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &mine.sin_addr, text, sizeof(text));
  return std::string(text);
}

// Workers per node, from --nproc (one node) or --nproc-per-node.
StatusOr<int> PerNode(const LaunchOptions& o) {
  if (o.nproc >= 0 && o.nproc_per_node >= 0) {
    return InvalidArgumentError(
        "--nproc and --nproc-per-node: give one (--nproc P is --nnodes 1 --nproc-per-node P)");
  }
  if (o.nproc >= 0 && o.nnodes > 1) {
    return InvalidArgumentError("--nproc is one node's workers; with --nnodes " +
                                std::to_string(o.nnodes) + " give --nproc-per-node");
  }
  const int n = o.nproc >= 0 ? o.nproc : o.nproc_per_node >= 0 ? o.nproc_per_node : 1;
  if (n < 1 || n > 256) {
    return InvalidArgumentError(std::string(o.nproc >= 0 ? "--nproc" : "--nproc-per-node") +
                                " must be in [1, 256], not " + std::to_string(n));
  }
  return n;
}

std::string KeyFile(const LaunchOptions& o, int rank) {
  return o.keys + "/rank-" + std::to_string(rank) + ".key";
}

// How the ranks authenticate each other: keys (all three flags) or
// --insecure where they meet over tcp at a --master; nothing on one node
// without one (ipc://, and tcp bound to 127.0.0.1 only).
Status CheckSecurity(const LaunchOptions& o, const LaunchPlan& p) {
  const int given = int(!o.keys.empty()) + int(!o.allow.empty()) + int(!o.master_key.empty());
  if (given != 0 && given != 3) {
    return InvalidArgumentError("--keys, --allow and --master-key go together: give all three");
  }
  if (given == 3 && o.insecure) return InvalidArgumentError("--insecure and --keys: give one");
  if (given == 0 && !o.encrypt) {
    return InvalidArgumentError("--no-encryption needs --keys, --allow and --master-key");
  }
  if (p.master_addr.empty()) {
    if (given != 0 || o.insecure) {
      return InvalidArgumentError(
          "--keys and --insecure are for ranks that meet at a --master HOST:PORT (without one "
          "the ranks of this host meet over ipc://)");
    }
    return OkStatus();
  }
  if (given == 0 && !o.insecure) {
    return InvalidArgumentError(
        "--master: the ranks meet over tcp and authenticate each other: give --keys DIR, --allow "
        "DIR and --master-key FILE (or --insecure on a trusted network)");
  }
  if (given == 0) return OkStatus();
  for (int r = p.first_rank; r < p.first_rank + p.local_world; ++r) {
    if (!std::filesystem::is_regular_file(KeyFile(o, r))) {
      return InvalidArgumentError(
          "--keys " + o.keys + ": no rank-" + std::to_string(r) + ".key for rank " +
          std::to_string(r) + " (cohort keygen --out DIR --name rank-" + std::to_string(r) + ")");
    }
  }
  if (!std::filesystem::is_directory(o.allow)) {
    return InvalidArgumentError("--allow " + o.allow + ": not a directory of .pub files");
  }
  if (!std::filesystem::is_regular_file(o.master_key)) {
    return InvalidArgumentError("--master-key " + o.master_key + ": no such file");
  }
  return OkStatus();
}

// The master's address, the transport and this node's address, from
// --master (tcp), or ipc:// on one node without it.
Status PlanRendezvous(const LaunchOptions& o, LaunchPlan& p) {
  if (o.master.empty()) {
    if (o.nnodes > 1) {
      return InvalidArgumentError("--master HOST:PORT is required with --nnodes " +
                                  std::to_string(o.nnodes) + " (rank 0's address, on node 0)");
    }
    if (!o.host.empty()) return InvalidArgumentError("--host: only with --master");
    // A short socket path (Unix sockets allow about 107 bytes): the workers
    // add "-rank-N" for their inboxes.
    p.master = "ipc:///tmp/cohort-launch-" + std::to_string(getpid());
    p.transport = o.transport;
    return OkStatus();
  }
  COHORT_ASSIGN_OR_RETURN(auto host_port, ParseMaster(o.master));
  // Rank 0 binds the master's address, and every node is given the same one.
  auto master_addr = net::ResolveIpv4(host_port.first);
  if (!master_addr.ok()) return InvalidArgumentError("--master: " + master_addr.status().message());
  p.master_addr = *master_addr;
  p.master_port = host_port.second;
  p.master = "tcp://" + p.master_addr + ":" + std::to_string(p.master_port);
  if (o.transport == "shm") {
    return InvalidArgumentError(
        "--transport shm: ranks that meet at a --master run over tcp (shared memory is for one "
        "host's ranks, without --master)");
  }
  p.transport = "tcp";
  if (!o.host.empty()) {
    p.host = o.host;
  } else {
    COHORT_ASSIGN_OR_RETURN(p.host, AddressToward(p.master_addr, p.master_port));
  }
  return OkStatus();
}

// Rank `rank`'s argv: `cohort worker`'s, or the command (its environment then
// carries torchrun's variables).
std::vector<std::string> RankArgs(const LaunchOptions& o, const LaunchPlan& p, int local,
                                  bool inject_fault) {
  if (!o.command.empty()) return o.command;
  const int rank = p.first_rank + local;
  std::vector<std::string> args = {o.cohort_binary, "worker",
                                   "--config",      o.config,
                                   "--run-dir",     o.run_dir,
                                   "--rank",        std::to_string(rank),
                                   "--world-size",  std::to_string(p.world),
                                   "--master",      p.master,
                                   "--device",      o.device,
                                   "--transport",   p.transport,
                                   "--collectives", o.collectives,
                                   "--local-rank",  std::to_string(local)};
  if (!p.host.empty()) args.insert(args.end(), {"--host", p.host});
  if (!o.keys.empty()) {
    args.insert(args.end(),
                {"--identity", KeyFile(o, rank), "--allow", o.allow, "--master-key", o.master_key});
    if (!o.encrypt) args.push_back("--no-encryption");
  } else {
    // --insecure, or one host without a master (over tcp the workers then
    // bind 127.0.0.1 only).
    args.push_back("--insecure");
  }
  if (inject_fault && rank == o.fault_rank) {
    args.insert(args.end(), {"--fault-kill-at-step", std::to_string(o.fault_step)});
  }
  return args;
}

// A command's environment: torchrun's variables, and the cohort backend's
// for tcp between nodes.
EnvList RankEnv(const LaunchOptions& o, const LaunchPlan& p, int local, const std::string& addr,
                int port) {
  EnvList env = {{"RANK", std::to_string(p.first_rank + local)},
                 {"LOCAL_RANK", std::to_string(local)},
                 {"GROUP_RANK", std::to_string(p.node_rank)},
                 {"WORLD_SIZE", std::to_string(p.world)},
                 {"LOCAL_WORLD_SIZE", std::to_string(p.local_world)},
                 {"MASTER_ADDR", addr},
                 {"MASTER_PORT", std::to_string(port)}};
  if (!p.host.empty()) env.emplace_back("COHORT_HOST", p.host);
  if (!o.keys.empty()) {
    env.insert(env.end(), {{"COHORT_IDENTITY", KeyFile(o, p.first_rank + local)},
                           {"COHORT_ALLOW", o.allow},
                           {"COHORT_MASTER_KEY", o.master_key}});
  } else if (o.insecure) {
    env.emplace_back("COHORT_INSECURE", "1");
  }
  return env;
}

void StopAll(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (p > 0) kill(p, SIGTERM);
  }
}

// "node 1: " where there are several nodes, for the launcher's lines.
std::string NodeTag(const LaunchPlan& p) {
  return p.nnodes > 1 ? "node " + std::to_string(p.node_rank) + ": " : "";
}

// This node's workers, started. When one cannot be, the others are stopped
// and reaped.
StatusOr<std::vector<pid_t>> StartGroup(const LaunchOptions& o, const LaunchPlan& p,
                                        bool inject_fault) {
  std::string addr = p.master_addr;
  int port = p.master_port;
  if (!o.command.empty() && addr.empty()) {
    COHORT_ASSIGN_OR_RETURN(port, FreePort());
    addr = "127.0.0.1";
  }
  std::vector<pid_t> pids;
  for (int local = 0; local < p.local_world; ++local) {
    const EnvList env = o.command.empty() ? EnvList{} : RankEnv(o, p, local, addr, port);
    StatusOr<pid_t> pid = Spawn(RankArgs(o, p, local, inject_fault), env);
    if (!pid.ok()) {
      StopAll(pids);
      for (pid_t q : pids) waitpid(q, nullptr, 0);
      return pid.status();
    }
    spdlog::info("launch: {}rank {} (local rank {}) started, pid {}", NodeTag(p),
                 p.first_rank + local, local, *pid);
    pids.push_back(*pid);
  }
  return pids;
}

// Waits until every worker has exited. The first to fail (or a signal to
// the launcher) stops the others; returns its description, or "".
std::string WaitGroup(const LaunchPlan& p, std::vector<pid_t> pids, const std::atomic<bool>& stop) {
  std::string failure;
  size_t running = pids.size();
  bool stopping = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) {
      if (stop && !stopping) {
        stopping = true;
        if (failure.empty()) failure = "stopped by a signal";
        StopAll(pids);
      }
      continue;
    }
    if (pid < 0) break;
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    const int rank = p.first_rank + int(it - pids.begin());
    --running;
    *it = -1;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(rank) +
                (WIFEXITED(status) ? " exited with status " + std::to_string(WEXITSTATUS(status))
                                   : " was killed by signal " + std::to_string(WTERMSIG(status)));
      spdlog::error("launch: {}{}; stopping the other workers", NodeTag(p), failure);
      StopAll(pids);
    }
  }
  return failure;
}

// "ranks 2-3" or "rank 2": this node's.
std::string LocalRanks(const LaunchPlan& p) {
  if (p.local_world == 1) return "rank " + std::to_string(p.first_rank);
  return "ranks " + std::to_string(p.first_rank) + "-" +
         std::to_string(p.first_rank + p.local_world - 1);
}

}  // namespace

StatusOr<std::pair<std::string, int>> ParseMaster(const std::string& master) {
  std::string_view rest = master;
  if (rest.substr(0, 6) == "tcp://") rest.remove_prefix(6);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--master \"" + master.substr(0, 100) + "\": " + why);
  };
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return bad("expected HOST:PORT (e.g. 10.0.0.1:29500)");
  }
  const std::string_view host = rest.substr(0, colon), digits = rest.substr(colon + 1);
  if (host.find_first_of(":[]") != std::string_view::npos) {
    return bad("IPv6 addresses are not supported; give an IPv4 address or a host name");
  }
  int port = 0;
  const bool number =
      !digits.empty() && digits.size() <= 5 &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (number) port = std::stoi(std::string(digits));
  if (!number || port < 1 || port > 65535) return bad("the port must be a number in [1, 65535]");
  return std::pair<std::string, int>(std::string(host), port);
}

StatusOr<LaunchPlan> PlanLaunch(const LaunchOptions& o) {
  LaunchPlan p;
  if (o.nnodes < 1 || o.nnodes > 1024) {
    return InvalidArgumentError("--nnodes must be in [1, 1024], not " + std::to_string(o.nnodes));
  }
  p.nnodes = o.nnodes;
  COHORT_ASSIGN_OR_RETURN(p.local_world, PerNode(o));
  if (o.node_rank == -1 && o.nnodes > 1) {
    return InvalidArgumentError("--node-rank is required with --nnodes " +
                                std::to_string(o.nnodes) + " (this host's index, 0 to " +
                                std::to_string(o.nnodes - 1) + "; node 0 runs rank 0)");
  }
  p.node_rank = std::max(o.node_rank, 0);
  if (o.node_rank < -1 || p.node_rank >= o.nnodes) {
    return InvalidArgumentError("--node-rank " + std::to_string(o.node_rank) +
                                " is out of range: --nnodes " + std::to_string(o.nnodes) +
                                " has nodes 0 to " + std::to_string(o.nnodes - 1));
  }
  if (o.max_restarts < 0) return InvalidArgumentError("--max-restarts must be >= 0");
  p.world = p.nnodes * p.local_world;
  p.first_rank = p.node_rank * p.local_world;
  COHORT_RETURN_IF_ERROR(PlanRendezvous(o, p));
  COHORT_RETURN_IF_ERROR(CheckSecurity(o, p));
  return p;
}

Status RunLaunch(const LaunchOptions& options, const std::atomic<bool>& stop) {
  LaunchOptions o = options;
  if (o.command.empty() && (o.config.empty() || o.run_dir.empty())) {
    return InvalidArgumentError(
        "launch: --config and --run-dir (cohort worker's), or a program after -- (e.g. "
        "`cohort launch --nproc 2 -- python3 train.py`)");
  }
  COHORT_ASSIGN_OR_RETURN(const LaunchPlan p, PlanLaunch(o));
  if (o.cohort_binary.empty()) {
    std::error_code ec;
    o.cohort_binary = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) return UnavailableError("launch: cannot find this executable: " + ec.message());
  }
  if (!o.run_dir.empty()) std::filesystem::create_directories(o.run_dir);
  if (p.nnodes > 1) {
    spdlog::info("launch: node {} of {}: ranks {} to {} of {}, meeting at {} ({} here)",
                 p.node_rank, p.nnodes, p.first_rank, p.first_rank + p.local_world - 1, p.world,
                 p.master, p.host);
  }
  for (int attempt = 0;; ++attempt) {
    StatusOr<std::vector<pid_t>> pids = StartGroup(o, p, attempt == 0);
    const std::string failure =
        pids.ok() ? WaitGroup(p, *std::move(pids), stop) : pids.status().message();
    if (failure.empty()) return OkStatus();
    if (stop) return CancelledError("launch: " + NodeTag(p) + failure);
    if (attempt >= o.max_restarts) {
      return UnavailableError("launch: " + NodeTag(p) + failure + " (" + std::to_string(attempt) +
                              " restart(s) used of " + std::to_string(o.max_restarts) + ")");
    }
    spdlog::warn("launch: {}restart {} of {} ({}): starting {} again from the last checkpoint",
                 NodeTag(p), attempt + 1, o.max_restarts, failure, LocalRanks(p));
  }
}

}  // namespace cohort::worker
