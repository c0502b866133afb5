#include "tests/integration/cluster.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
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

std::string ClientName(int k) {
  char name[32];
  std::snprintf(name, sizeof(name), "client-%03d", k);
  return name;
}

std::string Cluster::Shard(int k) const { return dir_ / ("shards/" + ClientName(k) + ".shard"); }

std::string Cluster::WriteConfig(const std::string& name, int rounds,
                                 const std::string& rounds_extra, const std::string& extra) const {
  const std::string path = dir_ / name;
  WriteFile(path,
            "seed: 5\n"
            "data { test_shard: \"" +
                (dir_ / "shards/test.shard") +
                "\" }\n"
                "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: " +
                std::to_string(hidden_units_) +
                " }\n"
                "train { batch_size: 16 learning_rate: 0.05 }\n"
                "net { heartbeat_s: 0.5 }\n" +
                "rounds { num_rounds: " + std::to_string(rounds) + " " + rounds_extra + " }\n" +
                extra + "\n");
  return path;
}

void Cluster::EnableCurve(const std::vector<int>& allowed) {
  curve_ = true;
  std::string out;
  auto keygen = [&](const std::string& dir, const std::string& name) {
    if (RunCohort({"keygen", "--out", dir, "--name", name}, &out, dir_ / "keygen.log") != 0) {
      throw std::runtime_error("keygen failed: " + ReadFile(dir_ / "keygen.log"));
    }
  };
  keygen(dir_ / "keys", "coordinator");
  for (int k = 0; k < num_clients_; ++k) keygen(dir_ / "keys", ClientName(k));
  std::filesystem::create_directories(dir_ / "allow");
  for (int k : allowed) {
    const std::string name = ClientName(k) + ".pub";
    std::filesystem::copy_file(dir_ / ("keys/" + name), dir_ / ("allow/" + name));
  }
}

std::string Cluster::StartCoordinator(const std::string& config, const std::string& run_dir,
                                      const std::string& bind,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {CohortBin(), "coordinator", "--config", config,
                                   "--run-dir", run_dir,       "--bind",   bind};
  if (curve_) {
    argv.insert(argv.end(),
                {"--identity", dir_ / "keys/coordinator.key", "--allow", dir_ / "allow"});
  } else {
    argv.push_back("--insecure");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  coordinator_ = std::make_unique<Process>(argv, coordinator_log());
  auto line = coordinator_->WaitForLine("coordinator listening on ");
  if (!line) throw std::runtime_error("coordinator did not start: " + ReadFile(coordinator_log()));
  return line->substr(line->rfind(' ') + 1);
}

void Cluster::StartClient(int k, const std::string& endpoint,
                          const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {CohortBin(), "client", "--coordinator",
                                   endpoint,    "--data", Shard(k)};
  if (curve_) {
    argv.insert(argv.end(), {"--identity", dir_ / ("keys/" + ClientName(k) + ".key"),
                             "--coordinator-key", dir_ / "keys/coordinator.pub"});
  } else {
    argv.push_back("--insecure");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  clients_.at(k) = std::make_unique<Process>(argv, dir_ / ("client-" + std::to_string(k) + ".log"));
}

void Cluster::StartClientWith(int k, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CohortBin(), "client"};
  argv.insert(argv.end(), args.begin(), args.end());
  clients_.at(k) = std::make_unique<Process>(argv, client_log(k));
}

void Cluster::KillCoordinator() {
  coordinator_->Signal(SIGKILL);
  coordinator_->Wait();
}

}  // namespace cohort::testing
