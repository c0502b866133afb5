// The `cohort` subcommands: each registers its flags on the app and returns
// what runs when it is the subcommand given. main.cc only lists them.
#ifndef COHORT_CLI_COMMAND_H_
#define COHORT_CLI_COMMAND_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
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

// Set by SIGINT and SIGTERM once InstallSignalHandlers has run; the daemons
// stop when it becomes true.
std::atomic<bool>& StopFlag();
// SIGINT and SIGTERM set StopFlag(); SIGPIPE is ignored.
void InstallSignalHandlers();

// The exit code for a command's result: 0 when OK, or when it was cancelled
// after a stop signal (logged at info); 1 otherwise, the error logged as
// "WHAT: STATUS".
int Report(const Status& status, const char* what);

// The run configuration at `path`, with `rounds` (when not 0, from --rounds)
// in place of rounds.num_rounds, checked again.
StatusOr<config::RunConfig> LoadConfig(const std::string& path, uint32_t rounds);

}  // namespace cohort::cli

#endif  // COHORT_CLI_COMMAND_H_
