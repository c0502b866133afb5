// The `cohort` subcommands: each registers its flags on the app and returns
// what runs when it is the subcommand given. main.cc only lists them.
#ifndef COHORT_CLI_COMMAND_H_
#define COHORT_CLI_COMMAND_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "net/metrics_endpoint.h"
#include "proto/config.pb.h"

namespace CLI {
class App;
}  // namespace CLI

namespace cohort::cli {

// A registered subcommand. `run` is called at most once, after parsing and
// only when `app` was parsed; it returns the process's exit code. The flags'
// values live in state that `run` owns.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

// Each adds its subcommand to `app`. `log_level` is the global --log-level
// and must outlive the returned Command.
Command AddCoordinatorCommand(CLI::App& app, const std::string& log_level);
Command AddClientCommand(CLI::App& app, const std::string& log_level);
Command AddSiteWorkerCommand(CLI::App& app, const std::string& log_level);
Command AddKeygenCommand(CLI::App& app, const std::string& log_level);
Command AddPartitionCommand(CLI::App& app, const std::string& log_level);
Command AddWorkerCommand(CLI::App& app, const std::string& log_level);
Command AddLaunchCommand(CLI::App& app, const std::string& log_level);
Command AddSimulateCommand(CLI::App& app, const std::string& log_level);
Command AddStatusCommand(CLI::App& app, const std::string& log_level);
Command AddPlanCommand(CLI::App& app, const std::string& log_level);
Command AddExportCommand(CLI::App& app, const std::string& log_level);
Command AddReportCommand(CLI::App& app, const std::string& log_level);
Command AddProvisionCommand(CLI::App& app, const std::string& log_level);

// Set by SIGINT and SIGTERM once InstallSignalHandlers has run; the daemons
// stop when it becomes true.
std::atomic<bool>& StopFlag();
// SIGINT and SIGTERM set StopFlag(); SIGPIPE is ignored.
void InstallSignalHandlers();
// Set by SIGHUP once InstallReloadHandler has run (the coordinator: re-read
// the allowlist). Without it SIGHUP keeps its default action.
std::atomic<bool>& ReloadFlag();
void InstallReloadHandler();

// The exit code for a command's result: 0 when OK, or when it was cancelled
// after a stop signal (logged at info); 1 otherwise, the error logged as
// "WHAT: STATUS".
int Report(const Status& status, const char* what);

// --metrics-addr and --metrics-linger-s, as the coordinator, the client and
// the worker take them.
struct MetricsFlags {
  std::string addr;  // Empty: no metrics.
  double linger_s = 60;
};
void AddMetricsFlags(CLI::App* app, MetricsFlags& flags);
// The endpoint of flags.addr (null when it is empty), its URL printed on
// stdout ("metrics on http://127.0.0.1:PORT/metrics") and logged; call it
// before the command does anything else. Errors name --metrics-addr and
// its value (net::MetricsEndpoint::Create).
StatusOr<std::unique_ptr<net::MetricsEndpoint>> StartMetrics(const MetricsFlags& flags);
// After a daemon's run ended with `result`: when it is OK and `metrics` is
// not null, serves until one scrape begun now is answered, flags.linger_s
// passed, or a stop signal, so a scraper still reads the final values.
// Returns `result`.
Status LingerForScrape(const Status& result, net::MetricsEndpoint* metrics,
                       const MetricsFlags& flags);

// The run configuration at `path`, with `rounds` (when not 0, from --rounds)
// in place of rounds.num_rounds, checked again.
StatusOr<config::RunConfig> LoadConfig(const std::string& path, uint32_t rounds);

}  // namespace cohort::cli

#endif  // COHORT_CLI_COMMAND_H_
