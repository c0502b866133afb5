// The single `cohort` executable. Only flag parsing lives here.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <set>

#include "cli/commands.h"
#include "client/daemon.h"
#include "client/session.h"
#include "client/site.h"
#include "common/logging.h"
#include "coordinator/daemon.h"
#include "crypto/key_files.h"
#include "proto/config_io.h"
#include "sim/simulator.h"
#include "worker/worker.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

void InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

int Report(const cohort::Status& status, const char* what) {
  if (status.ok()) return 0;
  if (status.code() == cohort::StatusCode::kCancelled && g_stop.load()) {
    spdlog::info("{} stopped by signal: {}", what, status.message());
    return 0;
  }
  spdlog::error("{}: {}", what, status.ToString());
  return 1;
}

// The run configuration at `path`, with --rounds (when not 0) in place of
// rounds.num_rounds, checked again.
cohort::StatusOr<cohort::config::RunConfig> LoadConfig(const std::string& path, uint32_t rounds) {
  auto config = cohort::config::LoadRunConfig(path);
  if (!config.ok() || rounds == 0) return config;
  config->mutable_rounds()->set_num_rounds(rounds);
  COHORT_RETURN_IF_ERROR(cohort::config::ValidateRunConfig(*config).WithContext("--rounds"));
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cohort: federated and data-parallel training"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error");

  // coordinator
  auto* coord = app.add_subcommand("coordinator", "Run the coordinator daemon");
  std::string config_path, run_dir, bind = "tcp://127.0.0.1:7000", endpoint_file;
  uint32_t rounds_flag = 0;
  coord->add_option("--config", config_path, "Run configuration (text format or JSON)")->required();
  coord->add_option("--run-dir", run_dir, "Run directory (SQLite database inside)")->required();
  coord->add_option("--bind", bind,
                    "ZeroMQ endpoint to bind, e.g. tcp://127.0.0.1:7000 "
                    "(port 0: any free port)");
  coord->add_option("--endpoint-file", endpoint_file,
                    "Write the bound endpoint here (default RUN_DIR/coordinator.endpoint)");
  coord->add_option("--rounds", rounds_flag, "Override rounds.num_rounds");
  std::string coord_identity, allow_dir;
  bool coord_insecure = false;
  coord->add_option("--identity", coord_identity, "This coordinator's key file (cohort keygen)");
  coord->add_option("--allow", allow_dir, "Directory of client .pub files allowed to join");
  coord->add_flag("--insecure", coord_insecure,
                  "No CURVE: plaintext, anyone may join (local development only)");
  std::string dump_sums;
  coord->add_option("--dump-sums", dump_sums,
                    "Debugging: write each secure round's unmasked sum to this directory");

  // client
  auto* client = app.add_subcommand("client", "Run a client daemon");
  cohort::client::ClientOptions copts;
  client->add_option("--coordinator", copts.coordinator, "Coordinator endpoint")->required();
  client->add_option("--data", copts.data, "This client's shard file")->required();
  client->add_option("--name", copts.name, "Client name (default: shard file name)");
  client->add_option("--threads", copts.threads, "BLAS threads for training")
      ->check(CLI::Range(1, 256));
  client
      ->add_option("--device", copts.device,
                   "Where to train: cpu, cuda, cuda:N or auto (a GPU where one is usable, "
                   "else the CPU)")
      ->capture_default_str();
  uint32_t pause_round = 0;
  std::string fault;
  client->add_option("--fault-pause-before-update-round", pause_round,
                     "Testing: withhold the update of this round");
  client->add_option("--fault-stop-before", fault,
                     "Testing: STAGE:ROUND; send nothing from that secure-aggregation stage of "
                     "that round on (commit_seed, advertise_keys, share_keys, check_shares, "
                     "confirm_checked, masked_input, consistency, unmasking)");
  client->add_option("--fault-misbehave", copts.fault_misbehave,
                     "Testing: play a malicious client in every round (low_order_key, "
                     "garbage_shares, bad_unmask_share, rehello_weight, huge_update)");
  client->add_option("--dump-inputs", copts.dump_inputs,
                     "Debugging: write each secure round's encoded input to this directory");
  client->add_option("--identity", copts.identity, "This client's key file (cohort keygen)");
  client->add_option("--peers", copts.peers,
                     "Directory of .pub files: the only identity keys accepted in a "
                     "secure-aggregation cohort (default: trust the coordinator's list)");
  client->add_flag("--require-secure", copts.require_secure,
                   "Refuse any task that is not securely aggregated (implied by --peers)");
  client
      ->add_option("--corrupt-fraction", copts.corrupt_fraction,
                   "The fraction of a secure cohort this client assumes may collude with the "
                   "coordinator: it refuses any threshold weaker than that implies. 0 admits "
                   "cohorts of two, which hide each input from the coordinator only: the other "
                   "client learns it from the sum (and without --peers could be the "
                   "coordinator's own; with --peers cohorts under 3 are refused)")
      ->check(CLI::Range(0.0, 0.49))
      ->capture_default_str();
  client->add_option("--coordinator-key", copts.coordinator_key,
                     "The coordinator's .pub file (pinned)");
  client->add_flag("--insecure", copts.insecure, "No CURVE: plaintext (local development only)");
  client->add_option("--site-master", copts.site_master,
                     "A site that is data-parallel inside: where its workers meet this client "
                     "(ipc://PATH on one host, tcp://HOST:PORT)");
  client->add_option("--site-size", copts.site_size, "Ranks of the site, this client included")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  client
      ->add_option("--site-transport", copts.site_transport,
                   "shm, tcp, or auto (shm with an ipc:// site master)")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  client
      ->add_option("--site-host", copts.site_host,
                   "Where the site's workers reach this client (tcp)")
      ->capture_default_str();
  client->add_option("--site-allow", copts.site_allow,
                     "Over tcp: directory of the site's .pub files (its workers' and this "
                     "client's --identity); the workers pin this client's key");
  client->add_flag("!--site-no-encryption", copts.site_encrypt,
                   "Over tcp: the site's ranks authenticate but send plaintext (trusted fabrics)");
  client->add_flag("--site-insecure", copts.site_insecure,
                   "Over tcp: the site's ranks do not authenticate (trusted networks only)");

  // site-worker
  auto* site_worker = app.add_subcommand(
      "site-worker", "Train with a site's client, on this worker's shard (a site's rank >= 1)");
  cohort::client::SiteWorkerOptions sopts;
  site_worker->add_option("--site-master", sopts.group.master, "The site's meeting address")
      ->required();
  site_worker->add_option("--rank", sopts.group.rank, "This worker's rank, 1 .. size-1")
      ->required();
  site_worker->add_option("--site-size", sopts.group.size, "Ranks of the site, its client included")
      ->required()
      ->check(CLI::Range(2, 1024));
  site_worker->add_option("--transport", sopts.group.transport, "shm, tcp or auto")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  site_worker->add_option("--host", sopts.group.host, "Where the other ranks reach this one (tcp)")
      ->capture_default_str();
  site_worker->add_option("--data", sopts.data, "This worker's shard file")->required();
  site_worker->add_option("--device", sopts.device, "cpu, cuda, cuda:N or auto")
      ->capture_default_str();
  site_worker->add_option("--threads", sopts.threads, "BLAS threads for training")
      ->capture_default_str();
  site_worker->add_option("--identity", sopts.identity, "This worker's key file (cohort keygen)");
  site_worker->add_option("--allow", sopts.allow, "Directory of the site's .pub files");
  site_worker->add_option("--master-key", sopts.master_key,
                          "The site's client's .pub file (pinned)");
  site_worker->add_flag("!--no-encryption", sopts.group.encrypt,
                        "Over tcp: authenticate the ranks but send plaintext (trusted fabrics)");
  site_worker->add_flag("--insecure", sopts.group.insecure,
                        "Over tcp: no authentication, plaintext (trusted networks only)");

  // keygen
  auto* keygen = app.add_subcommand("keygen", "Write an identity key pair (NAME.key, NAME.pub)");
  std::string key_dir, key_name;
  keygen->add_option("--out", key_dir, "Directory for the key files")->required();
  keygen->add_option("--name", key_name, "Key name, e.g. coordinator or client-000")->required();

  // partition
  auto* part = app.add_subcommand("partition", "Split a dataset into client shard files");
  cohort::cli::PartitionOptions popts;
  part->add_option("--format", popts.format, "idx, csv or synthetic");
  part->add_option("--train-images", popts.train_images, "IDX training images (.gz ok)");
  part->add_option("--train-labels", popts.train_labels, "IDX training labels");
  part->add_option("--test-images", popts.test_images, "IDX test images");
  part->add_option("--test-labels", popts.test_labels, "IDX test labels");
  part->add_option("--train", popts.train_csv, "CSV training file");
  part->add_option("--test", popts.test_csv, "CSV test file");
  part->add_option("--label-column", popts.label_column, "CSV label column (0-based)");
  part->add_option("--samples", popts.samples, "synthetic: training samples");
  part->add_option("--test-samples", popts.test_samples, "synthetic: test samples");
  part->add_option("--features", popts.features, "synthetic: features");
  part->add_option("--classes", popts.classes, "synthetic: classes");
  part->add_option("--clients", popts.clients, "Number of client shards")
      ->check(CLI::Range(1, 1000000));
  part->add_option("--scheme", popts.scheme, "iid, dirichlet:ALPHA, shards:K, quantity:ALPHA");
  part->add_option("--seed", popts.seed, "Partition seed");
  part->add_option("--assignment", popts.assignment,
                   "Explicit split: one line of sample indices per client (overrides --scheme, "
                   "--clients)");
  part->add_option("--out", popts.out, "Output directory")->required();
  part->add_option("--encoding", popts.encoding, "auto, float32 or uint8");

  // worker and launch (mode: DATA_PARALLEL)
  auto* worker = app.add_subcommand("worker", "Run one rank of a data-parallel run");
  cohort::worker::WorkerOptions wopts;
  worker->add_option("--config", wopts.config, "A DATA_PARALLEL run configuration")->required();
  worker->add_option("--run-dir", wopts.run_dir, "Run directory (rank 0 writes run.db)")
      ->required();
  worker->add_option("--rank", wopts.rank,
                     "This rank (default: RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID)");
  worker->add_option("--world-size", wopts.world_size,
                     "Ranks in all (default: WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS)");
  worker->add_option("--master", wopts.master,
                     "Rank 0's rendezvous address, tcp://HOST:PORT or ipc://PATH (default: "
                     "MASTER_ADDR and MASTER_PORT)");
  worker->add_option("--local-rank", wopts.local_rank,
                     "This rank's index on its host (default: LOCAL_RANK, "
                     "OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID): --device cuda or auto then "
                     "takes that GPU (modulo the host's)");
  worker->add_option("--host", wopts.host, "The address other ranks reach this one at")
      ->capture_default_str();
  worker
      ->add_option("--device", wopts.device,
                   "cpu, cuda, cuda:N or auto (cuda and auto: the local rank's GPU)")
      ->capture_default_str();
  worker
      ->add_option("--transport", wopts.transport,
                   "shm (one host), tcp, mpi (under mpirun), or auto: shm with an ipc:// "
                   "master")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "mpi"}))
      ->capture_default_str();
  worker
      ->add_option("--collectives", wopts.collectives,
                   "Who sums the gradients: host (the transport), device (the backend: NCCL "
                   "on CUDA), or auto (device with a GPU backend and more than one rank)")
      ->check(CLI::IsMember({"auto", "host", "device"}))
      ->capture_default_str();
  worker->add_option("--identity", wopts.identity, "This rank's key file (cohort keygen)");
  worker->add_option("--allow", wopts.allow, "Directory of the group's .pub files");
  worker->add_option("--master-key", wopts.master_key, "Rank 0's .pub file (pinned)");
  worker->add_flag("!--no-encryption", wopts.encrypt,
                   "Over tcp: authenticate the ranks but send plaintext (trusted fabrics)");
  worker->add_flag("--insecure", wopts.insecure,
                   "Over tcp: no authentication, plaintext (trusted networks only)");
  worker->add_option("--fault-perturb-at-step", wopts.fault_perturb_step,
                     "Testing: change one weight of this rank's model after this global step");
  worker->add_option("--fault-kill-at-step", wopts.fault_kill_step,
                     "Testing: kill this rank (SIGKILL) before this global step");
  auto* launch = app.add_subcommand("launch", "Start N local data-parallel workers");
  cohort::worker::LaunchOptions lopts;
  launch->add_option("--nproc", lopts.nproc, "Workers to start")->check(CLI::Range(1, 256));
  launch->add_option("--config", lopts.config, "A DATA_PARALLEL run configuration")->required();
  launch->add_option("--run-dir", lopts.run_dir, "Run directory")->required();
  launch
      ->add_option("--max-restarts", lopts.max_restarts,
                   "Restart the group from the last checkpoint this many times")
      ->check(CLI::Range(0, 100));
  launch->add_option("--device", lopts.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  launch->add_option("--transport", lopts.transport, "auto (shared memory), shm or tcp")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  launch->add_option("--collectives", lopts.collectives, "auto, host or device (see worker)")
      ->check(CLI::IsMember({"auto", "host", "device"}))
      ->capture_default_str();
  launch->add_option("--fault-rank", lopts.fault_rank, "Testing: this rank fails once");
  launch->add_option("--fault-step", lopts.fault_step, "Testing: at this global step");

  // simulate
  auto* simulate = app.add_subcommand(
      "simulate", "A federated run with every client in this process (the daemons' protocol)");
  cohort::sim::SimOptions simopts;
  std::string sim_config;
  uint32_t sim_rounds = 0, sim_per_round = 0;
  simulate->add_option("--config", sim_config, "A FEDERATED run configuration")->required();
  simulate->add_option("--run-dir", simopts.run_dir, "Run directory")->required();
  simulate->add_option("--shards", simopts.shards,
                       "Directory of the clients' client-*.shard files (cohort partition); "
                       "default: the config's data.partition, split in memory");
  simulate->add_option("--clients", simopts.clients,
                       "With data.partition: split over this many clients instead");
  simulate
      ->add_option("--devices", simopts.devices,
                   "The executors' devices, round-robin: cpu, auto (a GPU if usable), all (every "
                   "usable GPU), cuda:N, or a list such as cuda:0,1")
      ->capture_default_str();
  auto* executors_flag =
      simulate
          ->add_option("--executors,--threads", simopts.executors,
                       "Clients trained at once, one backend each (default: one per device)")
          ->check(CLI::Range(1, 1024));
  simulate->add_option("--rounds", sim_rounds, "Override rounds.num_rounds");
  simulate->add_option("--per-round", sim_per_round,
                       "Clients per round: overrides rounds.fraction and max_clients_per_round");
  simulate
      ->add_option("--dropout", simopts.dropout,
                   "Probability that a selected client drops out of a round, at a stage drawn "
                   "from the seed")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  simulate
      ->add_option("--sample-ms", simopts.sample_ms,
                   "Virtual training time per sample and local epoch (0: none)")
      ->check(CLI::NonNegativeNumber);
  simulate
      ->add_option("--speed-sigma", simopts.speed_sigma,
                   "Spread of the clients' slowness: exp(sigma N(0,1)) each, from the seed")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--latency-ms", simopts.latency_ms, "Virtual link latency, each way")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--availability", simopts.availability,
                       "Fraction of the time each client is online (spells from the seed)");
  simulate->add_option("--availability-period-s", simopts.availability_period_s,
                       "Mean length of an online plus an offline spell, virtual seconds");
  simulate
      ->add_option("--latency-sigma", simopts.latency_sigma,
                   "Spread of the clients' link latencies: latency_ms exp(sigma N(0,1)) each")
      ->check(CLI::NonNegativeNumber);
  simulate->add_flag("--json", simopts.json,
                     "One JSON object per committed round on stdout (cohort status --json's)");

  // status
  auto* status = app.add_subcommand("status", "Print the rounds of a run");
  std::string status_dir;
  bool json = false;
  status->add_option("--run-dir", status_dir, "Run directory")->required();
  status->add_flag("--json", json, "One JSON object per round");

  CLI11_PARSE(app, argc, argv);
  InstallSignalHandlers();

  if (coord->parsed()) {
    cohort::InitLogging("coordinator", "", log_level);
    auto config = LoadConfig(config_path, rounds_flag);
    if (!config.ok()) return Report(config.status(), "config");
    cohort::coordinator::DaemonOptions opts;
    opts.config = *config;
    opts.run_dir = run_dir;
    opts.bind = bind;
    opts.endpoint_file = endpoint_file.empty() ? run_dir + "/coordinator.endpoint" : endpoint_file;
    opts.identity = coord_identity;
    opts.allowlist = allow_dir;
    opts.insecure = coord_insecure;
    opts.dump_sums = dump_sums;
    return Report(cohort::coordinator::RunCoordinator(opts, g_stop), "coordinator");
  }
  if (worker->parsed()) {
    cohort::Status resolved = cohort::worker::ResolveRank(wopts);
    cohort::InitLogging(resolved.ok() ? "rank " + std::to_string(wopts.rank) : "worker", "",
                        log_level);
    if (!resolved.ok()) return Report(resolved, "worker");
    // A stopped worker stops at once: its peers notice by their deadline.
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    return Report(cohort::worker::RunWorker(wopts, g_stop), "worker");
  }
  if (site_worker->parsed()) {
    cohort::InitLogging("site rank " + std::to_string(sopts.group.rank), "", log_level);
    // A stopped worker stops at once: the site's client notices.
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    return Report(cohort::client::RunSiteWorker(sopts), "site-worker");
  }
  if (simulate->parsed()) {
    cohort::InitLogging("simulate", "", log_level);
    auto config = LoadConfig(sim_config, sim_rounds);
    if (!config.ok()) return Report(config.status(), "config");
    if (sim_per_round != 0) {
      config->mutable_rounds()->set_fraction(1.0f);
      config->mutable_rounds()->set_max_clients_per_round(sim_per_round);
      auto valid = cohort::config::ValidateRunConfig(*config);
      if (!valid.ok()) return Report(valid.WithContext("--per-round"), "config");
    }
    simopts.config = *config;
    if (executors_flag->count() == 0) simopts.executors = 0;  // One per device.
    return Report(cohort::sim::RunSimulation(simopts, g_stop), "simulate");
  }
  if (launch->parsed()) {
    cohort::InitLogging("launch", "", log_level);
    return Report(cohort::worker::RunLaunch(lopts, g_stop), "launch");
  }
  if (client->parsed()) {
    if (copts.name.empty()) copts.name = std::filesystem::path(copts.data).stem().string();
    if (pause_round != 0) {
      copts.fault_stage = "masked_input";
      copts.fault_round = pause_round;
    }
    if (!fault.empty()) {
      static const std::set<std::string> kStages = {
          "commit_seed",     "advertise_keys", "share_keys",  "check_shares",
          "confirm_checked", "masked_input",   "consistency", "unmasking"};
      const size_t colon = fault.find(':');
      char* end = nullptr;
      const std::string stage = fault.substr(0, colon);
      const unsigned long round =
          colon == std::string::npos ? 0 : std::strtoul(fault.c_str() + colon + 1, &end, 10);
      if (kStages.count(stage) == 0 || round == 0 || round > 1000000 || end == nullptr ||
          *end != '\0') {
        std::fprintf(stderr,
                     "client: --fault-stop-before: expected STAGE:ROUND with STAGE one of "
                     "commit_seed, advertise_keys, share_keys, check_shares, confirm_checked, "
                     "masked_input, consistency, unmasking; got "
                     "\"%s\"\n",
                     fault.c_str());
        return 2;
      }
      copts.fault_stage = stage;
      copts.fault_round = static_cast<uint32_t>(round);
    }
    if (!copts.fault_misbehave.empty() &&
        std::find(std::begin(cohort::client::kMisbehaviours),
                  std::end(cohort::client::kMisbehaviours),
                  copts.fault_misbehave) == std::end(cohort::client::kMisbehaviours)) {
      std::fprintf(stderr, "client: --fault-misbehave: unknown behaviour \"%s\"\n",
                   copts.fault_misbehave.c_str());
      return 2;
    }
    cohort::InitLogging("client", copts.name, log_level);
    return Report(cohort::client::RunClient(copts, g_stop), "client");
  }
  if (part->parsed()) {
    cohort::InitLogging("partition", "", log_level);
    return Report(cohort::cli::RunPartition(popts), "partition");
  }
  if (keygen->parsed()) {
    cohort::InitLogging("keygen", "", log_level);
    cohort::Status st = cohort::crypto::WriteIdentity(key_dir, key_name);
    if (st.ok())
      std::printf("%s/%s.key (secret) and %s/%s.pub written\n", key_dir.c_str(), key_name.c_str(),
                  key_dir.c_str(), key_name.c_str());
    return Report(st, "keygen");
  }
  if (status->parsed()) {
    cohort::InitLogging("status", "", log_level);
    return Report(cohort::cli::RunStatus(status_dir, json), "status");
  }
  return 2;
}
