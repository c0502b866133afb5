// `cohort coordinator`: the coordinator daemon (coordinator/daemon.h).
#include <CLI/CLI.hpp>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "coordinator/daemon.h"

namespace cohort::cli {
namespace {

struct CoordinatorFlags {
  std::string config_path, run_dir, bind = "tcp://127.0.0.1:7000", endpoint_file;
  uint32_t rounds = 0;
  std::string identity, allow_dir;
  bool insecure = false;
  std::string dump_sums;
  std::string initial_model;
  MetricsFlags metrics;
};

int RunCoordinatorCommand(const CoordinatorFlags& f, const std::string& log_level) {
  InstallReloadHandler();  // SIGHUP: re-read --allow (DaemonOptions::reload).
  InitLogging("coordinator", "", log_level);
  auto metrics = StartMetrics(f.metrics);
  if (!metrics.ok()) return Report(metrics.status(), "coordinator");
  auto config = LoadConfig(f.config_path, f.rounds);
  if (!config.ok()) return Report(config.status(), "config");
  coordinator::DaemonOptions opts;
  opts.config = *config;
  opts.run_dir = f.run_dir;
  opts.bind = f.bind;
  opts.endpoint_file =
      f.endpoint_file.empty() ? f.run_dir + "/coordinator.endpoint" : f.endpoint_file;
  opts.identity = f.identity;
  opts.allowlist = f.allow_dir;
  opts.insecure = f.insecure;
  opts.reload = &ReloadFlag();
  opts.dump_sums = f.dump_sums;
  opts.initial_model = f.initial_model;
  opts.metrics = metrics->get();
  const Status result = coordinator::RunCoordinator(opts, StopFlag());
  return Report(LingerForScrape(result, opts.metrics, f.metrics), "coordinator");
}

}  // namespace

Command AddCoordinatorCommand(CLI::App& app, const std::string& log_level) {
  auto* coord = app.add_subcommand("coordinator", "Run the coordinator daemon");
  auto f = std::make_shared<CoordinatorFlags>();
  coord->add_option("--config", f->config_path, "Run configuration (text format or JSON)")
      ->required();
  coord->add_option("--run-dir", f->run_dir, "Run directory (SQLite database inside)")->required();
  coord->add_option("--bind", f->bind,
                    "ZeroMQ endpoint to bind, e.g. tcp://127.0.0.1:7000 "
                    "(port 0: any free port)");
  coord->add_option("--endpoint-file", f->endpoint_file,
                    "Write the bound endpoint here (default RUN_DIR/coordinator.endpoint)");
  coord->add_option("--rounds", f->rounds, "Override rounds.num_rounds");
  coord->add_option("--identity", f->identity, "This coordinator's key file (cohort keygen)");
  coord->add_option("--allow", f->allow_dir,
                    "Directory of client .pub files allowed to join; SIGHUP reads it again, "
                    "refusing a removed key at once");
  coord->add_flag("--insecure", f->insecure,
                  "No CURVE: plaintext, anyone may join (local development only)");
  coord->add_option("--dump-sums", f->dump_sums,
                    "Debugging: write each secure round's unmasked sum to this directory");
  coord
      ->add_option("--initial-model", f->initial_model,
                   "A model the clients bring (model.external): its initial values, an .npz "
                   "as cohort.torch.save_initial writes (needed until round 1 commits)")
      ->check(CLI::ExistingFile);
  AddMetricsFlags(coord, f->metrics);
  return {coord, [f, &log_level] { return RunCoordinatorCommand(*f, log_level); }};
}

}  // namespace cohort::cli
