#include "cli/command.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "proto/config_io.h"

namespace cohort::cli {
namespace {

// Constant-initialized and lock-free: the signal handler may set it.
std::atomic<bool> g_stop{false};

std::atomic<bool> g_reload{false};

void OnSignal(int) { g_stop.store(true); }
void OnReload(int) { g_reload.store(true); }

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

std::atomic<bool>& ReloadFlag() { return g_reload; }

void InstallReloadHandler() {
  struct sigaction sa = {};
  sa.sa_handler = OnReload;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGHUP, &sa, nullptr);
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

void AddMetricsFlags(CLI::App* app, MetricsFlags& flags) {
  app->add_option("--metrics-addr", flags.addr,
                  "Serve Prometheus metrics at http://HOST:PORT/metrics (HOST an IPv4 address; "
                  "port 0: any free port, printed as \"metrics on URL\")");
  app->add_option("--metrics-linger-s", flags.linger_s,
                  "With --metrics-addr: after the run, keep serving until one scrape has read "
                  "the final values, at most this many seconds (0: exit at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
}

StatusOr<std::unique_ptr<net::MetricsEndpoint>> StartMetrics(const MetricsFlags& flags) {
  if (flags.addr.empty()) return std::unique_ptr<net::MetricsEndpoint>();
  COHORT_ASSIGN_OR_RETURN(auto endpoint,
                          net::MetricsEndpoint::Create("--metrics-addr", flags.addr));
  spdlog::info("metrics on {}", endpoint->url());
  std::printf("metrics on %s\n", endpoint->url().c_str());
  std::fflush(stdout);
  return endpoint;
}

Status LingerForScrape(const Status& result, net::MetricsEndpoint* metrics,
                       const MetricsFlags& flags) {
  if (!result.ok() || metrics == nullptr || flags.linger_s <= 0) return result;
  // Before the line that says so: a scraper that reacts to it is counted.
  const uint64_t begun = metrics->scrapes_begun();
  spdlog::info("run over; serving {} until a scrape reads the final values (at most {} s)",
               metrics->url(), flags.linger_s);
  if (metrics->WaitForScrape(begun, flags.linger_s, g_stop)) {
    spdlog::info("metrics: the final values were scraped");
  } else {
    spdlog::info("metrics: no scrape of the final values within {} s", flags.linger_s);
  }
  return result;
}

StatusOr<config::RunConfig> LoadConfig(const std::string& path, uint32_t rounds) {
  auto config = config::LoadRunConfig(path);
  if (!config.ok() || rounds == 0) return config;
  config->mutable_rounds()->set_num_rounds(rounds);
  COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(*config).WithContext("--rounds"));
  return config;
}

}  // namespace cohort::cli
