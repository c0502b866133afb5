#include "tests/integration/harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace cohort::testing {

std::string CohortBin() {
  const char* bin = std::getenv("COHORT_BIN");
  if (bin == nullptr) throw std::runtime_error("COHORT_BIN is not set");
  return bin;
}

TempDir::TempDir(const std::string& tag) {
  std::string pattern =
      std::filesystem::temp_directory_path().string() + "/cohort_" + tag + "_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (std::getenv("COHORT_KEEP_TEST_DIRS") != nullptr) return;  // For debugging.
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process::Process(const std::vector<std::string>& argv, const std::string& stderr_path) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) {
    throw std::runtime_error("cannot start " + argv[0]);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  stdout_fd_ = fds[0];
}

Process::~Process() {
  if (!exit_code_.has_value() && pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool Process::ReadMore(int timeout_ms) {
  pollfd p = {stdout_fd_, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char buf[4096];
  const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
  if (n <= 0) return false;
  buffer_.append(buf, n);
  size_t nl;
  while ((nl = buffer_.find('\n')) != std::string::npos) {
    lines_.push_back(buffer_.substr(0, nl));
    buffer_.erase(0, nl + 1);
  }
  return true;
}

std::optional<std::string> Process::WaitForLine(const std::string& needle,
                                                std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (; consumed_ < lines_.size(); ++consumed_) {
      if (lines_[consumed_].find(needle) != std::string::npos) return lines_[consumed_++];
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    // Nothing more within the deadline, or EOF.
    if (left.count() <= 0 || !ReadMore(static_cast<int>(left.count()))) return std::nullopt;
  }
}

void Process::Signal(int sig) {
  if (!exit_code_.has_value()) kill(pid_, sig);
}

int Process::Wait(std::chrono::seconds timeout) {
  if (exit_code_.has_value()) return *exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    rusage usage{};
    const pid_t r = wait4(pid_, &status, WNOHANG, &usage);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      peak_rss_bytes_ = static_cast<size_t>(usage.ru_maxrss) * 1024;  // Linux: KiB.
      while (ReadMore(0)) {
      }
      return *exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    // Drain stdout while waiting so the child never blocks on a full pipe;
    // the bounded poll doubles as the wait between exit checks.
    ReadMore(50);
  }
}

int RunCohort(const std::vector<std::string>& args, std::string* out, const std::string& err_path) {
  std::vector<std::string> argv = {CohortBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, err_path);
  const int code = p.Wait(std::chrono::seconds(120));
  if (out != nullptr) {
    out->clear();
    for (const auto& l : p.lines()) *out += l + "\n";
  }
  return code;
}

std::string ZmtpGreeting(const std::string& mechanism, bool as_server) {
  std::string g(64, '\0');
  g[0] = '\xff';
  g[9] = '\x7f';
  g[10] = 3;
  g.replace(12, std::min<size_t>(mechanism.size(), 20), mechanism.substr(0, 20));
  g[32] = as_server ? 1 : 0;
  return g;
}

std::string ZmtpCommandHeader(uint64_t size) {
  std::string h(9, '\0');
  h[0] = 0x06;
  for (int i = 0; i < 8; ++i) h[1 + i] = static_cast<char>(size >> (56 - 8 * i));
  return h;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

bool WaitForFile(const std::string& path, const std::function<bool()>& done,
                 std::chrono::seconds timeout) {
  const std::string dir = path.substr(0, path.rfind('/'));
  const int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  inotify_add_watch(in, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE | IN_MODIFY);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool found = false;
  while (!(found = done()) && std::chrono::steady_clock::now() < deadline) {
    pollfd p = {in, POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char buf[4096];
      while (read(in, buf, sizeof(buf)) > 0) {
      }
    }
  }
  close(in);
  return found;
}

bool WaitForText(const std::string& path, const std::string& needle, std::chrono::seconds timeout) {
  return WaitForFile(
      path,
      [&] {
        return std::filesystem::exists(path) && ReadFile(path).find(needle) != std::string::npos;
      },
      timeout);
}

}  // namespace cohort::testing
