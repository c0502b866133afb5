// The single `cohort` executable: the global flags and the list of
// subcommands (cli/command.h), each in its own file.
#include <CLI/CLI.hpp>

#include "cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"Cohort: federated and data-parallel training"};
  app.require_subcommand(1);
  // `cohort client ... --log-level debug` as well as `cohort --log-level debug client ...`.
  app.fallthrough();
  app.set_version_flag("--version", std::string("cohort ") + COHORT_VERSION,
                       "Print the version (the one a run's store records) and exit");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  using namespace cohort::cli;
  // In this order in --help.
  const Command commands[] = {
      AddCoordinatorCommand(app, log_level), AddClientCommand(app, log_level),
      AddSiteWorkerCommand(app, log_level),  AddKeygenCommand(app, log_level),
      AddPartitionCommand(app, log_level),   AddWorkerCommand(app, log_level),
      AddLaunchCommand(app, log_level),      AddSimulateCommand(app, log_level),
      AddStatusCommand(app, log_level),      AddPlanCommand(app, log_level),
      AddExportCommand(app, log_level),      AddReportCommand(app, log_level),
      AddProvisionCommand(app, log_level),
  };
  CLI11_PARSE(app, argc, argv);
  InstallSignalHandlers();
  for (const Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return 2;
}
