#include "cli/command.h"

#include <spdlog/spdlog.h>

#include <csignal>

#include "proto/config_io.h"

namespace cohort::cli {
namespace {

// Constant-initialized and lock-free: the signal handler may set it.
std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

}  // namespace

std::atomic<bool>& StopFlag() { return g_stop; }

void InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

int Report(const Status& status, const char* what) {
  if (status.ok()) return 0;
  if (status.code() == StatusCode::kCancelled && g_stop.load()) {
    spdlog::info("{} stopped by signal: {}", what, status.message());
    return 0;
  }
  spdlog::error("{}: {}", what, status.ToString());
  return 1;
}

StatusOr<config::RunConfig> LoadConfig(const std::string& path, uint32_t rounds) {
  auto config = config::LoadRunConfig(path);
  if (!config.ok() || rounds == 0) return config;
  config->mutable_rounds()->set_num_rounds(rounds);
  COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(*config).WithContext("--rounds"));
  return config;
}

}  // namespace cohort::cli
