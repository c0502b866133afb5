// `cohort launch`: one node's data-parallel workers, in torchrun's shape
// (worker/launch.h).
#include <CLI/CLI.hpp>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "worker/launch.h"

namespace cohort::cli {
namespace {

// Which workers this node runs and where the ranks meet. The values are
// checked by worker::PlanLaunch, whose errors name the flag.
void AddNodeFlags(CLI::App* launch, worker::LaunchOptions* o) {
  launch->add_option("--nproc", o->nproc,
                     "Workers to start on this host alone (--nnodes 1 --nproc-per-node N)");
  launch->add_option("--nnodes", o->nnodes, "Hosts in the group, each running a launcher")
      ->capture_default_str();
  launch->add_option("--node-rank", o->node_rank,
                     "This host's index, 0 to nnodes-1 (node 0 runs rank 0): it runs global ranks "
                     "node-rank * nproc-per-node onwards");
  launch->add_option("--nproc-per-node", o->nproc_per_node, "Workers on each host");
  launch->add_option("--master", o->master,
                     "HOST:PORT where rank 0 (on node 0) hosts the rendezvous (required with "
                     "--nnodes > 1; without it one host's ranks meet over ipc://)");
  launch->add_option("--host", o->host,
                     "The address the other nodes reach this host's workers at (default: this "
                     "host's address on its route to the master)");
  launch->add_option("--keys", o->keys,
                     "With --master: a directory holding rank-R.key for each of this node's "
                     "global ranks R (cohort keygen --name rank-R)");
  launch->add_option("--allow", o->allow, "With --keys: the directory of the group's .pub files");
  launch->add_option("--master-key", o->master_key, "With --keys: rank 0's .pub file (pinned)");
  launch->add_flag("!--no-encryption", o->encrypt,
                   "With --keys: authenticate the ranks but send plaintext (trusted fabrics)");
  launch->add_flag("--insecure", o->insecure,
                   "With --master: no authentication, plaintext (trusted networks only)");
}

}  // namespace

Command AddLaunchCommand(CLI::App& app, const std::string& log_level) {
  auto* launch = app.add_subcommand(
      "launch",
      "Start this host's data-parallel workers, like torchrun: `cohort worker`s of a "
      "DATA_PARALLEL config, or any program after -- with torchrun's variables (RANK, "
      "WORLD_SIZE, MASTER_ADDR, ...)");
  auto o = std::make_shared<worker::LaunchOptions>();
  AddNodeFlags(launch, o.get());
  launch->add_option("--config", o->config, "A DATA_PARALLEL run configuration");
  launch->add_option("--run-dir", o->run_dir, "Run directory (node 0's holds the run store)");
  launch->add_option("command", o->command,
                     "A program and its arguments, after --, started once per rank (e.g. "
                     "python3 train.py with init_process_group(\"cohort\"))");
  launch
      ->add_option("--max-restarts", o->max_restarts,
                   "When a worker of this host fails, start this host's workers again this many "
                   "times; the run resumes from the last checkpoint")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  launch->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  launch
      ->add_option("--transport", o->transport,
                   "auto (shared memory on one host without --master, else tcp), shm or tcp")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  launch->add_option("--collectives", o->collectives, "auto, host or device (see worker)")
      ->check(CLI::IsMember({"auto", "host", "device"}))
      ->capture_default_str();
  launch->add_option("--fault-rank", o->fault_rank, "Testing: this global rank fails once");
  launch->add_option("--fault-step", o->fault_step, "Testing: at this global step");
  return {launch, [o, &log_level] {
            InitLogging("launch", "", log_level);
            return Report(worker::RunLaunch(*o, StopFlag()), "launch");
          }};
}

}  // namespace cohort::cli
