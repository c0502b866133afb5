// Data-parallel training (mode: DATA_PARALLEL): one `cohort worker` process
// per rank, synchronous SGD with the gradients all-reduced every step over
// the peer collectives (collective/collective.h). `cohort launch` starts
// them: worker/launch.h.
#ifndef COHORT_WORKER_WORKER_H_
#define COHORT_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "net/metrics_endpoint.h"

namespace cohort::worker {

struct WorkerOptions {
  std::string config;   // A DATA_PARALLEL run configuration.
  std::string run_dir;  // Rank 0 writes the run store (run.db) here.
  int rank = -1;        // -1: from the environment (see ResolveRank).
  int world_size = -1;
  // This rank's index among those on its host (-1: unknown): --device cuda
  // or auto then means GPU local_rank (modulo the host's GPUs), as torchrun
  // users expect.
  int local_rank = -1;
  // Rank 0's rendezvous address: tcp://HOST:PORT, or ipc://PATH on one host
  // (the ranks then exchange gradients through shared memory).
  std::string master;
  // The address other ranks reach this one at (tcp masters only).
  std::string host = "127.0.0.1";
  std::string device = "cpu";  // cpu | cuda | cuda:N | auto
  // How gradients travel: shm (shared memory; every rank on this host), tcp,
  // or auto: shm with an ipc:// master, tcp otherwise.
  std::string transport = "auto";
  // Who sums the gradients: host (the transport above, over host memory),
  // device (the backend itself on device buffers: NCCL on CUDA), or auto:
  // device where the backend has collectives and there is more than one
  // rank. A backend without them falls back to host and says so.
  std::string collectives = "auto";
  // Over tcp the ranks authenticate each other: this rank's key file, the
  // allowlist directory of the group's .pub files, and rank 0's .pub file.
  // `encrypt`: over ZeroMQ CURVE, else plain TCP (trusted fabrics).
  // `insecure`: no keys, plaintext, trusting the network instead.
  std::string identity, allow, master_key;
  bool encrypt = true;
  bool insecure = false;
  // Testing: this rank kills itself (SIGKILL) before global step N (for
  // the first step of an epoch: at the end of the epoch before; on rank 0
  // while it commits that epoch, after evaluating it and before the store),
  // or changes one weight of its model after global step N.
  int64_t fault_kill_step = -1;
  int64_t fault_perturb_step = -1;
  // --metrics-addr (not owned; null: none): this rank's epochs, steps and
  // speed go into its registry (worker/metrics.h).
  net::MetricsEndpoint* metrics = nullptr;
};

// Fills rank, world size, local rank and master from the environment where
// the flags left them unset: torchrun / Kubeflow PyTorchJob (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK),
// Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and rank 0 on the first
// host of SLURM_NODELIST at MASTER_PORT or 29500). kInvalidArgument naming
// what is missing or malformed.
Status ResolveRank(WorkerOptions& options);

// The first host of a Slurm node list ("gpu[03-06,09],cpu01" -> "gpu03"),
// or "" when there is none.
std::string FirstSlurmHost(const std::string& nodelist);

// The vote over the host group that decides whether the backend sums the
// gradients on the device (NCCL): a vector of DeviceVoteLength(world)
// integers, zero but for what each rank casts, summed by an integer
// all-reduce (each rank's 64-bit device key arrives as it was cast).
// DeviceVoteVerdict says why the gradients stay on the host (two ranks on
// one device, or a rank whose backend cannot), or "" when every rank's
// backend can and each has its own device.
size_t DeviceVoteLength(int world);
void CastDeviceVote(std::span<int64_t> vote, int rank, bool can, uint64_t device_key);
std::string DeviceVoteVerdict(std::span<const int64_t> vote, int world);

// Trains the whole run (resuming from rank 0's last checkpoint); returns
// when it is done, or with an error naming the rank that failed:
//  - kFailedPrecondition on every rank when a rank's config is not rank 0's
//    (config::CheckResumable: only data_parallel.epochs may differ from the
//    run's stored config, and must be the same on every rank).
//  - kDataLoss on every rank when a rank's gradient (or, with local SGD, its
//    model) is not finite, naming it, before the step is taken: the epoch is
//    not committed, the epochs before it are kept.
//  - A gone or silent peer is an error naming it within
//    data_parallel.timeout_s, at the epoch's end too: while rank 0 commits
//    an epoch it exchanges a beat with the others every timeout_s / 4, so a
//    slow commit keeps the group waiting and a dead rank 0 does not.
// An epoch's training seconds (printed and stored) are read from `env`'s
// monotonic clock.
Status RunWorker(const WorkerOptions& options, const std::atomic<bool>& stop,
                 Env* env = Env::Default());

}  // namespace cohort::worker

#endif  // COHORT_WORKER_WORKER_H_
