// `cohort worker`: one rank of a data-parallel run (worker/worker.h).
#include <CLI/CLI.hpp>
#include <csignal>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "worker/worker.h"

namespace cohort::cli {
namespace {

struct WorkerFlags {
  worker::WorkerOptions options;
  MetricsFlags metrics;
};

int RunWorkerCommand(WorkerFlags& f, const std::string& log_level) {
  worker::WorkerOptions& o = f.options;
  Status resolved = worker::ResolveRank(o);
  InitLogging(resolved.ok() ? "rank " + std::to_string(o.rank) : "worker", "", log_level);
  if (!resolved.ok()) return Report(resolved, "worker");
  auto metrics = StartMetrics(f.metrics);
  if (!metrics.ok()) return Report(metrics.status(), "worker");
  o.metrics = metrics->get();
  // A stopped worker stops at once: its peers notice by their deadline.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  const Status result = worker::RunWorker(o, StopFlag());
  return Report(LingerForScrape(result, o.metrics, f.metrics), "worker");
}

}  // namespace

Command AddWorkerCommand(CLI::App& app, const std::string& log_level) {
  auto* worker = app.add_subcommand("worker", "Run one rank of a data-parallel run");
  auto f = std::make_shared<WorkerFlags>();
  worker::WorkerOptions* o = &f->options;
  worker->add_option("--config", o->config, "A DATA_PARALLEL run configuration")->required();
  worker->add_option("--run-dir", o->run_dir, "Run directory (rank 0 writes run.db)")->required();
  worker->add_option("--rank", o->rank,
                     "This rank (default: RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID)");
  worker->add_option("--world-size", o->world_size,
                     "Ranks in all (default: WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS)");
  worker->add_option("--master", o->master,
                     "Rank 0's rendezvous address, tcp://HOST:PORT or ipc://PATH (default: "
                     "MASTER_ADDR and MASTER_PORT)");
  worker->add_option("--local-rank", o->local_rank,
                     "This rank's index on its host (default: LOCAL_RANK, "
                     "OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID): --device cuda or auto then "
                     "takes that GPU (modulo the host's)");
  worker->add_option("--host", o->host, "The address other ranks reach this one at")
      ->capture_default_str();
  worker
      ->add_option("--device", o->device,
                   "cpu, cuda, cuda:N or auto (cuda and auto: the local rank's GPU)")
      ->capture_default_str();
  worker
      ->add_option("--transport", o->transport,
                   "shm (one host), tcp, mpi (under mpirun), or auto: shm with an ipc:// "
                   "master")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "mpi"}))
      ->capture_default_str();
  worker
      ->add_option("--collectives", o->collectives,
                   "Who sums the gradients: host (the transport), device (the backend: NCCL "
                   "on CUDA), or auto (device with a GPU backend and more than one rank)")
      ->check(CLI::IsMember({"auto", "host", "device"}))
      ->capture_default_str();
  worker->add_option("--identity", o->identity, "This rank's key file (cohort keygen)");
  worker->add_option("--allow", o->allow, "Directory of the group's .pub files");
  worker->add_option("--master-key", o->master_key, "Rank 0's .pub file (pinned)");
  worker->add_flag("!--no-encryption", o->encrypt,
                   "Over tcp: authenticate the ranks but send plaintext (trusted fabrics)");
  worker->add_flag("--insecure", o->insecure,
                   "Over tcp: no authentication, plaintext (trusted networks only)");
  worker->add_option("--fault-perturb-at-step", o->fault_perturb_step,
                     "Testing: change one weight of this rank's model after this global step");
  worker->add_option("--fault-kill-at-step", o->fault_kill_step,
                     "Testing: kill this rank (SIGKILL) before this global step");
  AddMetricsFlags(worker, f->metrics);
  return {worker, [f, &log_level] { return RunWorkerCommand(*f, log_level); }};
}

}  // namespace cohort::cli
