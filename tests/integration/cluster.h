// A small federated cluster on 127.0.0.1 for integration tests: synthetic
// shards written by `cohort partition`, one coordinator process, N client
// processes.
#ifndef COHORT_TESTS_INTEGRATION_CLUSTER_H_
#define COHORT_TESTS_INTEGRATION_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace cohort::testing {

// "client-007": the shard stem, hence the default client name and key name.
std::string ClientName(int k);

class Cluster {
 public:
  // Partitions 1200 synthetic samples (20 features, 4 classes) over `clients`.
  Cluster(const std::string& tag, int clients);

  const TempDir& dir() const { return dir_; }
  std::string Shard(int k) const;
  // The hidden layer of the model WriteConfig writes (16 by default).
  void set_hidden_units(int units) { hidden_units_ = units; }
  // Writes a config: mlp 20-H-4 (H: set_hidden_units), `rounds` rounds, `rounds_extra` (text
  // format) inside its rounds { } block and `extra` at the top level (by
  // default plain aggregation; the secagg tests pass their own).
  std::string WriteConfig(const std::string& name, int rounds, const std::string& rounds_extra,
                          const std::string& extra = "secagg { aggregation: PLAIN }") const;
  // Starts a coordinator; returns its endpoint from "coordinator listening on".
  std::string StartCoordinator(const std::string& config, const std::string& run_dir,
                               const std::string& bind = "tcp://127.0.0.1:0",
                               const std::vector<std::string>& extra = {});
  void StartClient(int k, const std::string& endpoint, const std::vector<std::string>& extra = {});
  // Starts `cohort client ARGS...` as client k, with no arguments of its own.
  void StartClientWith(int k, const std::vector<std::string>& args);
  std::string client_log(int k) const { return dir_ / ("client-" + std::to_string(k) + ".log"); }

  // From now on, processes use CURVE: keys for the coordinator and every
  // client; clients in `allowed` go into the coordinator's allowlist.
  void EnableCurve(const std::vector<int>& allowed);

  Process& coordinator() { return *coordinator_; }
  Process& client(int k) { return *clients_.at(k); }
  std::string coordinator_log() const { return dir_ / "coordinator.log"; }
  void KillCoordinator();

 private:
  TempDir dir_;
  int num_clients_;
  bool curve_ = false;
  int hidden_units_ = 16;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> clients_;
};

}  // namespace cohort::testing

#endif  // COHORT_TESTS_INTEGRATION_CLUSTER_H_
