#include "tests/integration/cluster.h"

#include <signal.h>

#include <cstdio>
#include <stdexcept>

namespace cohort::testing {

Cluster::Cluster(const std::string& tag, int clients)
    : dir_(tag), num_clients_(clients), clients_(clients) {
  std::string out;
  const int code =
      RunCohort({"partition", "--format", "synthetic", "--samples", "1200", "--test-samples", "400",
                 "--features", "20", "--classes", "4", "--clients", std::to_string(clients),
                 "--scheme", "iid", "--seed", "3", "--out", dir_ / "shards"},
                &out, dir_ / "partition.log");
  if (code != 0) throw std::runtime_error("partition failed: " + ReadFile(dir_ / "partition.log"));
}

std::string Cluster::Shard(int k) const {
  char name[32];
  std::snprintf(name, sizeof(name), "client-%03d.shard", k);
  return dir_ / ("shards/" + std::string(name));
}

std::string Cluster::WriteConfig(const std::string& name, int rounds,
                                 const std::string& rounds_extra) const {
  const std::string path = dir_ / name;
  WriteFile(path,
            "seed: 5\n"
            "data { test_shard: \"" +
                (dir_ / "shards/test.shard") +
                "\" }\n"
                "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
                "train { batch_size: 16 learning_rate: 0.05 }\n"
                "net { heartbeat_s: 0.5 }\n" +
                "rounds { num_rounds: " + std::to_string(rounds) + " " + rounds_extra + " }\n");
  return path;
}

std::string Cluster::StartCoordinator(const std::string& config, const std::string& run_dir,
                                      const std::string& bind) {
  coordinator_ = std::make_unique<Process>(
      std::vector<std::string>{CohortBin(), "coordinator", "--config", config, "--run-dir", run_dir,
                               "--bind", bind},
      coordinator_log());
  auto line = coordinator_->WaitForLine("coordinator listening on ");
  if (!line) throw std::runtime_error("coordinator did not start: " + ReadFile(coordinator_log()));
  return line->substr(line->rfind(' ') + 1);
}

void Cluster::StartClient(int k, const std::string& endpoint,
                          const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {CohortBin(), "client", "--coordinator",
                                   endpoint,    "--data", Shard(k)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  clients_.at(k) = std::make_unique<Process>(argv, dir_ / ("client-" + std::to_string(k) + ".log"));
}

void Cluster::KillCoordinator() {
  coordinator_->Signal(SIGKILL);
  coordinator_->Wait();
}

}  // namespace cohort::testing
