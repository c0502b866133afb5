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
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::sim {

struct SimOptions {
  config::RunConfig config;
  std::string run_dir;
  // The clients' data: every client-*.shard file in this directory (what
  // `cohort partition` writes), named by its stem as the daemons are. Empty:
  // the config's data.partition, split in memory (`clients` overriding its
  // count when not 0), its test set the coordinator's.
  std::string shards;
  uint32_t clients = 0;
  // Clients trained at once, one backend each; 0: one per device of
  // `devices` (ExpandDevices).
  int executors = 1;
  // The executors' devices, round-robin: "cpu", "cuda:N", "auto" (a GPU
  // where one is usable, else the CPU, said in the log), "all" (every
  // usable GPU, else the CPU, said in the log), comma-separated, where a
  // bare number after a cuda device is another GPU: "cuda:0,1" is
  // "cuda:0,cuda:1". The CPU gives the daemons' bits; a GPU does not.
  std::string devices = "cpu";
  // Faults drawn from the seed: in each round each selected client drops
  // out with this probability, at a stage drawn uniformly from those of
  // the round (secure aggregation: advertise_keys, share_keys,
  // check_shares, masked_input, consistency, unmasking; plain: before its
  // update). A dropped client sends nothing more in that round, as if its
  // connection died, and is back for the next.
  double dropout = 0;
  // Availability, drawn from the seed: each client is online a fraction
  // `availability` of the time, alternating online and offline spells of
  // exponential length (on average availability x availability_period_s
  // and the rest of the period). Offline, nothing it sends or is sent
  // arrives, as with a machine switched off: the coordinator times it out
  // and stops selecting it, and it registers again when back. 1 (the
  // default): always online.
  double availability = 1;
  double availability_period_s = 600;
  // Each committed round as a JSON object on stdout (`cohort status
  // --json`'s) instead of the coordinator's line. On a terminal a live line
  // on stderr shows the round in progress either way.
  bool json = false;
  // Heterogeneity on the virtual clock, drawn from the seed: client i's
  // training takes samples x local epochs x sample_ms x s_i virtual
  // milliseconds, s_i = exp(speed_sigma * N(0, 1)) fixed per client, plus
  // its link latency each way for its task and its update (and for every
  // secure-stage message): latency_ms * exp(latency_sigma * N(0, 1)), also
  // fixed per client. The engine's deadlines then cut stragglers as they
  // would in a real run; no one sleeps. 0 (the default): training takes no
  // virtual time.
  double sample_ms = 0;
  double speed_sigma = 0;
  double latency_ms = 0;
  double latency_sigma = 0;
  // Testing: round(misbehave_fraction x clients) clients, drawn from the
  // seed, play `misbehave` (client::kMisbehaviours, e.g. sign_flip or
  // scale10 for the robust rules' benchmark) in every round; the others
  // are honest. Both or neither.
  std::string misbehave;
  double misbehave_fraction = 0;
};

// The device list of SimOptions::devices, each entry cpu, auto or cuda:N;
// "all" becomes the usable GPUs (probed), or cpu with `note` saying why.
StatusOr<std::vector<std::string>> ExpandDevices(const std::string& devices, std::string* note);

// Runs until the configured rounds are committed (OK) or `stop` becomes
// true (kCancelled). Prints the coordinator's line per committed round.
Status RunSimulation(const SimOptions& options, const std::atomic<bool>& stop);

}  // namespace cohort::sim

#endif  // COHORT_SIM_SIMULATOR_H_
