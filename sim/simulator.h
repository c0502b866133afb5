// cohort simulate: the round engine and N virtual clients in one process.
// The same coordinator::RoundEngine and client::Session the daemons run,
// their messages handed over through in-process queues instead of ZeroMQ;
// time is virtual (when nothing is left to do it jumps to the next
// deadline or heartbeat), and a pool of executors, one backend each,
// trains the clients a round selects, one after another. A virtual client
// is its data, its identity key and its session: no thread, no socket, no
// model copy. The run goes to the same SQLite store (`cohort status` reads
// it); with the same config, seed and data, the final model is the
// daemons' bit for bit.
#ifndef COHORT_SIM_SIMULATOR_H_
#define COHORT_SIM_SIMULATOR_H_

#include <atomic>
#include <string>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::sim {

struct SimOptions {
  config::RunConfig config;
  std::string run_dir;
  // The clients' data: every client-*.shard file in this directory (what
  // `cohort partition` writes), named by its stem as the daemons are.
  std::string shards;
  int executors = 1;  // Clients trained at once, one CPU backend each.
};

// Runs until the configured rounds are committed (OK) or `stop` becomes
// true (kCancelled). Prints the coordinator's line per committed round.
Status RunSimulation(const SimOptions& options, const std::atomic<bool>& stop);

}  // namespace cohort::sim

#endif  // COHORT_SIM_SIMULATOR_H_
