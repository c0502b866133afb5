// `cohort simulate`: a federated run with every client in this process
// (sim/simulator.h), or over the ranks of `mpirun -np N cohort simulate`
// (sim/mpi_executors.h).
#include <CLI/CLI.hpp>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "proto/config_io.h"
#include "sim/simulator.h"

namespace cohort::cli {
namespace {

struct SimulateFlags {
  sim::SimOptions options;
  std::string config;
  uint32_t rounds = 0, per_round = 0;
  CLI::Option* executors = nullptr;  // Whether --executors was given.
};

// The run, its clients and the executors that train them.
void AddRunFlags(CLI::App* simulate, SimulateFlags& f) {
  sim::SimOptions& o = f.options;
  simulate->add_option("--config", f.config, "A FEDERATED run configuration")->required();
  simulate->add_option("--run-dir", o.run_dir, "Run directory")->required();
  simulate->add_option("--shards", o.shards,
                       "Directory of the clients' client-*.shard files (cohort partition); "
                       "default: the config's data.partition, split in memory");
  simulate->add_option("--clients", o.clients,
                       "With data.partition: split over this many clients instead");
  simulate
      ->add_option("--devices", o.devices,
                   "The executors' devices, round-robin: cpu, auto (a GPU if usable), all (every "
                   "usable GPU), cuda:N, or a list such as cuda:0,1")
      ->capture_default_str();
  f.executors = simulate
                    ->add_option("--executors,--threads", o.executors,
                                 "Clients trained at once, one backend each (default: one per "
                                 "device); under mpirun, on each hosting rank")
                    ->check(CLI::Range(1, 1024));
  simulate->add_option("--rounds", f.rounds, "Override rounds.num_rounds");
  simulate->add_option("--per-round", f.per_round,
                       "Clients per round: overrides rounds.fraction and max_clients_per_round");
}

// Faults, availability and the virtual clock's heterogeneity; the output.
void AddWorldFlags(CLI::App* simulate, sim::SimOptions& o) {
  simulate
      ->add_option("--dropout", o.dropout,
                   "Probability that a selected client drops out of a round, at a stage drawn "
                   "from the seed")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  simulate
      ->add_option("--sample-ms", o.sample_ms,
                   "Virtual training time per sample and local epoch (0: none)")
      ->check(CLI::NonNegativeNumber);
  simulate
      ->add_option("--speed-sigma", o.speed_sigma,
                   "Spread of the clients' slowness: exp(sigma N(0,1)) each, from the seed")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--latency-ms", o.latency_ms, "Virtual link latency, each way")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--availability", o.availability,
                       "Fraction of the time each client is online (spells from the seed)");
  simulate->add_option("--availability-period-s", o.availability_period_s,
                       "Mean length of an online plus an offline spell, virtual seconds");
  simulate
      ->add_option("--latency-sigma", o.latency_sigma,
                   "Spread of the clients' link latencies: latency_ms exp(sigma N(0,1)) each")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--fault-misbehave", o.misbehave,
                       "Testing: what the misbehaving clients do in every round (cohort client "
                       "--fault-misbehave's behaviours, e.g. sign_flip, scale10)");
  simulate->add_option("--fault-misbehave-fraction", o.misbehave_fraction,
                       "Testing: the fraction of the clients that misbehave (drawn from the seed)");
  simulate->add_flag("--json", o.json,
                     "One JSON object per committed round on stdout (cohort status --json's)");
}

int RunSimulateCommand(SimulateFlags& f, const std::string& log_level) {
  InitLogging("simulate", "", log_level);
  auto config = LoadConfig(f.config, f.rounds);
  if (!config.ok()) return Report(config.status(), "config");
  if (f.per_round != 0) {
    config->mutable_rounds()->set_fraction(1.0f);
    config->mutable_rounds()->set_max_clients_per_round(f.per_round);
    auto valid = config::ValidateRunConfig(*config);
    if (!valid.ok()) return Report(valid.WithContext("--per-round"), "config");
  }
  f.options.config = *config;
  if (f.executors->count() == 0) f.options.executors = 0;  // One per device.
  return Report(sim::RunSimulation(f.options, StopFlag()), "simulate");
}

}  // namespace

Command AddSimulateCommand(CLI::App& app, const std::string& log_level) {
  auto* simulate = app.add_subcommand(
      "simulate",
      "A federated run with every client in this process (the daemons' protocol); under "
      "`mpirun -np N`, rank 0 runs the rounds and ranks 1..N-1 train the clients");
  auto f = std::make_shared<SimulateFlags>();
  AddRunFlags(simulate, *f);
  AddWorldFlags(simulate, f->options);
  return {simulate, [f, &log_level] { return RunSimulateCommand(*f, log_level); }};
}

}  // namespace cohort::cli
