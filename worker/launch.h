// `cohort launch`, in torchrun's shape: on each of --nnodes hosts, one
// launcher starts that node's --nproc-per-node workers (`cohort worker`s of
// a DATA_PARALLEL config, or any program with torchrun's variables), waits
// for them, and restarts the node's group from the last checkpoint when one
// fails (--max-restarts).
#ifndef COHORT_WORKER_LAUNCH_H_
#define COHORT_WORKER_LAUNCH_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace cohort::worker {

struct LaunchOptions {
  // The group: nnodes hosts of nproc_per_node workers each. This host is
  // node `node_rank` and runs global ranks node_rank * P .. node_rank * P +
  // P - 1; rank 0 (on node 0) hosts the rendezvous at `master`.
  int nnodes = 1;
  int node_rank = -1;       // -1: not given (0 on one node; required on more).
  int nproc_per_node = -1;  // -1: not given.
  int nproc = -1;           // --nproc P: --nnodes 1 --nproc-per-node P. Neither: 1.
  // Rank 0's rendezvous, HOST:PORT (or tcp://HOST:PORT); required with more
  // than one node. Without it (one node) the ranks meet over ipc:// under
  // /tmp and reduce over shared memory, as `torchrun --standalone`.
  std::string master;
  // The address the other nodes reach this node's workers at. Default: this
  // host's address on its route to the master.
  std::string host;
  // With a master the ranks meet over tcp, authenticated: `keys` is a
  // directory of every local rank's key file (rank-R.key, from `cohort
  // keygen --name rank-R`), `allow` the directory of the group's .pub files,
  // `master_key` rank 0's .pub (all three), or `insecure` (trusted networks).
  std::string keys, allow, master_key;
  bool encrypt = true;
  bool insecure = false;
  std::string config, run_dir;  // `cohort worker`'s; rank 0 writes run_dir/run.db.
  // How many times this node's group starts again after a worker fails.
  int max_restarts = 0;
  std::string device = "cpu";
  std::string transport = "auto";    // Passed on to the workers,
  std::string collectives = "auto";  // and this.
  std::string cohort_binary;         // Default: this executable.
  // Testing: pass --fault-kill-at-step to this global rank in the first attempt.
  int fault_rank = -1;
  int64_t fault_step = -1;
  // A program to start on every local rank instead of `cohort worker` (a
  // PyTorch script: `cohort launch --nproc 2 -- python3 train.py`), with
  // torchrun's variables: RANK, LOCAL_RANK, GROUP_RANK (the node),
  // WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (on one node
  // without --master: 127.0.0.1 and a free port), so init_process_group's
  // env:// (backend "cohort" or any other) finds its peers; with a master,
  // also the cohort backend's COHORT_HOST, COHORT_IDENTITY, COHORT_ALLOW,
  // COHORT_MASTER_KEY or COHORT_INSECURE. config and run_dir are then not used.
  std::vector<std::string> command;
};

// What one node's launcher runs, from options PlanLaunch has checked.
struct LaunchPlan {
  int nnodes = 1, node_rank = 0;
  int local_world = 1;  // This node's workers.
  int world = 1;        // Every node's.
  int first_rank = 0;   // This node's first global rank.
  // The workers' --master: tcp://IP:PORT, or ipc://PATH on one node.
  std::string master;
  std::string master_addr;  // The master's IPv4 address ("" with ipc://).
  int master_port = 0;
  std::string host;       // This node's workers' address (tcp).
  std::string transport;  // The workers' --transport.
};

// The master's host and port from "HOST:PORT" or "tcp://HOST:PORT".
// kInvalidArgument naming --master when it is not that form or the port is
// not in [1, 65535].
StatusOr<std::pair<std::string, int>> ParseMaster(const std::string& master);

// Checks the options and works out this node's part. kInvalidArgument naming
// the flag: --nnodes below 1, --node-rank outside [0, nnodes) or missing on
// more than one node, --nproc with --nproc-per-node (or with several
// nodes), a --master that is not HOST:PORT or does not resolve, --transport
// shm across nodes, key flags given in part, a missing rank key file, a
// master without keys or --insecure.
StatusOr<LaunchPlan> PlanLaunch(const LaunchOptions& options);

// Runs this node's workers (PlanLaunch's plan) and waits. When one fails
// (a non-zero exit or a signal), the others are stopped; with restarts left
// the node's group starts again, its ranks meet the other nodes' restarted
// groups at the master, and rank 0 resumes from the last checkpoint. Every
// restart and its reason are logged. The other nodes' workers fail when a
// peer vanishes (within data_parallel.timeout_s), so their launchers
// restart too. When `stop` is set (a signal), every worker is stopped and
// the result is kCancelled.
Status RunLaunch(const LaunchOptions& options, const std::atomic<bool>& stop);

}  // namespace cohort::worker

#endif  // COHORT_WORKER_LAUNCH_H_
