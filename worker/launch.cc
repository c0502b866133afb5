// cohort launch: N local workers, like torchrun --standalone.
#include <arpa/inet.h>
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

#include "worker/worker.h"

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

// Rank r's argv: `cohort worker`'s, or the command (its environment then
// carries torchrun's variables).
std::vector<std::string> RankArgs(const LaunchOptions& o, int r, const std::string& master,
                                  bool inject_fault) {
  if (!o.command.empty()) return o.command;
  std::vector<std::string> args = {
      o.cohort_binary, "worker",      "--config",        o.config,          "--run-dir",
      o.run_dir,       "--rank",      std::to_string(r), "--world-size",    std::to_string(o.nproc),
      "--master",      master,        "--device",        o.device,          "--transport",
      o.transport,  // On one host: over tcp the workers bind 127.0.0.1 only.
      "--collectives", o.collectives, "--local-rank",    std::to_string(r), "--insecure"};
  if (inject_fault && r == o.fault_rank) {
    args.insert(args.end(), {"--fault-kill-at-step", std::to_string(o.fault_step)});
  }
  return args;
}

void StopAll(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (p > 0) kill(p, SIGTERM);
  }
}

// Runs one attempt: every worker, until all exit or one fails (then the
// others are stopped). Returns the first failure's description, or "".
std::string RunGroup(const LaunchOptions& o, const std::string& master, bool inject_fault,
                     const std::atomic<bool>& stop) {
  std::vector<pid_t> pids;
  std::vector<std::pair<std::string, std::string>> group_env;
  if (!o.command.empty()) {
    StatusOr<int> port = FreePort();
    if (!port.ok()) return port.status().message();
    group_env = {{"WORLD_SIZE", std::to_string(o.nproc)},
                 {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", std::to_string(*port)}};
  }
  for (int r = 0; r < o.nproc; ++r) {
    auto env = group_env;
    if (!o.command.empty()) {
      env.insert(env.end(), {{"RANK", std::to_string(r)}, {"LOCAL_RANK", std::to_string(r)}});
    }
    StatusOr<pid_t> pid = Spawn(RankArgs(o, r, master, inject_fault), env);
    if (!pid.ok()) {
      StopAll(pids);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      return pid.status().message();
    }
    pids.push_back(*pid);
  }
  std::string failure;
  size_t running = pids.size();
  bool stopping = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) {
      // A signal to the launcher stops the whole group.
      if (stop && !stopping) {
        stopping = true;
        if (failure.empty()) failure = "stopped by a signal";
        StopAll(pids);
      }
      continue;
    }
    if (pid < 0) break;
    int rank = -1;
    for (int r = 0; r < o.nproc; ++r) {
      if (pids[r] == pid) rank = r;
    }
    if (rank < 0) continue;
    --running;
    pids[rank] = -1;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(rank) +
                (WIFEXITED(status) ? " exited with status " + std::to_string(WEXITSTATUS(status))
                                   : " was killed by signal " + std::to_string(WTERMSIG(status)));
      spdlog::error("launch: {}; stopping the other workers", failure);
      StopAll(pids);
    }
  }
  return failure;
}

}  // namespace

Status RunLaunch(const LaunchOptions& options, const std::atomic<bool>& stop) {
  LaunchOptions o = options;
  if (o.nproc < 1 || o.nproc > 256) return InvalidArgumentError("--nproc must be in [1, 256]");
  if (o.max_restarts < 0) return InvalidArgumentError("--max-restarts must be >= 0");
  if (o.cohort_binary.empty()) {
    std::error_code ec;
    o.cohort_binary = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) return UnavailableError("launch: cannot find this executable: " + ec.message());
  }
  if (o.command.empty() && (o.config.empty() || o.run_dir.empty())) {
    return InvalidArgumentError(
        "launch: --config and --run-dir (cohort worker's), or a program after -- (e.g. "
        "`cohort launch --nproc 2 -- python3 train.py`)");
  }
  if (!o.run_dir.empty()) std::filesystem::create_directories(o.run_dir);
  // A short socket path (Unix sockets allow about 107 bytes): the workers
  // add "-rank-N" for their inboxes.
  const std::string master = "ipc:///tmp/cohort-launch-" + std::to_string(getpid());
  for (int attempt = 0;; ++attempt) {
    const std::string failure = RunGroup(o, master, attempt == 0, stop);
    if (failure.empty()) return OkStatus();
    if (stop) return CancelledError("launch: " + failure);
    if (attempt >= o.max_restarts) {
      return UnavailableError("launch: " + failure + " (" + std::to_string(attempt) +
                              " restart(s) used of " + std::to_string(o.max_restarts) + ")");
    }
    spdlog::warn("launch: restarting all {} workers from the last checkpoint ({} of {})", o.nproc,
                 attempt + 1, o.max_restarts);
  }
}

}  // namespace cohort::worker
