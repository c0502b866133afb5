// `cohort launch`: N local data-parallel workers (worker/worker.h).
#include <CLI/CLI.hpp>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "worker/worker.h"

namespace cohort::cli {

Command AddLaunchCommand(CLI::App& app, const std::string& log_level) {
  auto* launch = app.add_subcommand(
      "launch",
      "Start N local data-parallel workers: `cohort worker`s of a DATA_PARALLEL config, or any "
      "program after -- with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...)");
  auto o = std::make_shared<worker::LaunchOptions>();
  launch->add_option("--nproc", o->nproc, "Workers to start")->check(CLI::Range(1, 256));
  launch->add_option("--config", o->config, "A DATA_PARALLEL run configuration");
  launch->add_option("--run-dir", o->run_dir, "Run directory");
  launch->add_option("command", o->command,
                     "A program and its arguments, after --, started once per rank (e.g. "
                     "python3 train.py with init_process_group(\"cohort\"))");
  launch
      ->add_option("--max-restarts", o->max_restarts,
                   "Restart the group from the last checkpoint this many times")
      ->check(CLI::Range(0, 100));
  launch->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  launch->add_option("--transport", o->transport, "auto (shared memory), shm or tcp")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  launch->add_option("--collectives", o->collectives, "auto, host or device (see worker)")
      ->check(CLI::IsMember({"auto", "host", "device"}))
      ->capture_default_str();
  launch->add_option("--fault-rank", o->fault_rank, "Testing: this rank fails once");
  launch->add_option("--fault-step", o->fault_step, "Testing: at this global step");
  return {launch, [o, &log_level] {
            InitLogging("launch", "", log_level);
            return Report(worker::RunLaunch(*o, StopFlag()), "launch");
          }};
}

}  // namespace cohort::cli
