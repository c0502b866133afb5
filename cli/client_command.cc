// `cohort client`: the client daemon (client/daemon.h), and the checks of
// its testing flags.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>

#include "aggregation/secagg_stage.h"
#include "cli/command.h"
#include "client/daemon.h"
#include "client/session.h"
#include "common/logging.h"

namespace cohort::cli {
namespace {

struct ClientFlags {
  client::ClientOptions options;
  uint32_t pause_round = 0;  // --fault-pause-before-update-round
  std::string fault;         // --fault-stop-before STAGE:ROUND
  MetricsFlags metrics;
};

// Where, with whom and on what this client trains.
void AddConnectionFlags(CLI::App* client, client::ClientOptions& o) {
  client->add_option("--coordinator", o.coordinator, "Coordinator endpoint")->required();
  client->add_option("--data", o.data, "This client's shard file")->required();
  client
      ->add_option("--test-data", o.test_data,
                   "This client's own test split (a shard file), for federated evaluation")
      ->check(CLI::ExistingFile);
  client->add_option("--name", o.name,
                     "Client name (default: the --identity key file's name, else the shard "
                     "file's)");
  client->add_option("--threads", o.threads, "BLAS threads for training")
      ->check(CLI::Range(1, 256));
  client
      ->add_option("--device", o.device,
                   "Where to train: cpu, cuda, cuda:N or auto (a GPU where one is usable, "
                   "else the CPU)")
      ->capture_default_str();
}

void AddFaultFlags(CLI::App* client, ClientFlags& f) {
  client->add_option("--fault-pause-before-update-round", f.pause_round,
                     "Testing: withhold the update of this round");
  client->add_option("--fault-stop-before", f.fault,
                     "Testing: STAGE:ROUND; send nothing from that secure-aggregation stage of "
                     "that round on (commit_seed, advertise_keys, share_keys, check_shares, "
                     "confirm_checked, masked_input, consistency, unmasking)");
  client->add_option("--fault-misbehave", f.options.fault_misbehave,
                     "Testing: play a malicious client in every round (low_order_key, "
                     "garbage_shares, bad_unmask_share, rehello_weight, huge_update; "
                     "sign_flip, scale10, sign_flip_scale10: a plain update times -1, 10, -10)");
  client->add_option("--dump-inputs", f.options.dump_inputs,
                     "Debugging: write each secure round's encoded input to this directory");
}

void AddSecurityFlags(CLI::App* client, client::ClientOptions& o) {
  client->add_option("--identity", o.identity, "This client's key file (cohort keygen)");
  client->add_option("--peers", o.peers,
                     "Directory of .pub files: the only identity keys accepted in a "
                     "secure-aggregation cohort (default: trust the coordinator's list)");
  client->add_flag("--require-secure", o.require_secure,
                   "Refuse any task that is not securely aggregated (implied by --peers)");
  CLI::Option* state_dir = client->add_option(
      "--state-dir", o.state_dir,
      "Directory for this client's state across restarts (SCAFFOLD's control variate, "
      "train.scaffold; distributed DP's ledger of noised rounds); created if missing");
  client->add_flag("--share-label-counts", o.share_label_counts,
                   "Tell the coordinator how many training samples of each class this client "
                   "has (the run report's label skew); off by default: it reveals the client's "
                   "label distribution");
  client
      ->add_option("--corrupt-fraction", o.corrupt_fraction,
                   "The fraction of a secure cohort this client assumes may collude with the "
                   "coordinator: it refuses any threshold weaker than that implies. 0 admits "
                   "cohorts of two, which hide each input from the coordinator only: the other "
                   "client learns it from the sum (and without --peers could be the "
                   "coordinator's own; with --peers cohorts under 3 are refused)")
      ->check(CLI::Range(0.0, 0.49))
      ->capture_default_str();
  client
      ->add_option("--dp-noise-multiplier", o.dp_noise_multiplier,
                   "Distributed DP: the noise multiplier this client insists on. It refuses a "
                   "round whose cohort's noise shares, all summed, carry less than this times "
                   "the clip norm (a smaller cohort or a smaller share than claimed). 0: no "
                   "check")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  client
      ->add_option("--dp-max-rounds", o.dp_max_rounds,
                   "Distributed DP: the most rounds this client ever adds noise to, counted in "
                   "--state-dir's ledger over every run and coordinator. A coordinator that "
                   "renumbers or renames rounds to average the noise away gets at most this "
                   "many noised copies; later rounds are left as dropouts. 0: no cap")
      ->check(CLI::Range(0u, 1000000000u))
      ->needs(state_dir)
      ->capture_default_str();
  client->add_option("--coordinator-key", o.coordinator_key,
                     "The coordinator's .pub file (pinned)");
  client->add_flag("--insecure", o.insecure, "No CURVE: plaintext (local development only)");
}

// A site that is data-parallel inside (client/site.h).
void AddSiteFlags(CLI::App* client, client::ClientOptions& o) {
  client->add_option("--site-master", o.site_master,
                     "A site that is data-parallel inside: where its workers meet this client "
                     "(ipc://PATH on one host, tcp://HOST:PORT)");
  client->add_option("--site-size", o.site_size, "Ranks of the site, this client included")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  client
      ->add_option("--site-transport", o.site_transport,
                   "shm, tcp, or auto (shm with an ipc:// site master)")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  client->add_option("--site-host", o.site_host, "Where the site's workers reach this client (tcp)")
      ->capture_default_str();
  client->add_option("--site-allow", o.site_allow,
                     "Over tcp: directory of the site's .pub files (its workers' and this "
                     "client's --identity); the workers pin this client's key");
  client->add_flag("!--site-no-encryption", o.site_encrypt,
                   "Over tcp: the site's ranks authenticate but send plaintext (trusted fabrics)");
  client->add_flag("--site-insecure", o.site_insecure,
                   "Over tcp: the site's ranks do not authenticate (trusted networks only)");
}

// --fault-stop-before STAGE:ROUND into `o`; false (the error printed) when
// it is not one.
bool ParseFaultStopBefore(const std::string& fault, client::ClientOptions& o) {
  const size_t colon = fault.find(':');
  char* end = nullptr;
  const auto stage = aggregation::ParseSecAggStage(fault.substr(0, colon));
  const unsigned long round =
      colon == std::string::npos ? 0 : std::strtoul(fault.c_str() + colon + 1, &end, 10);
  if (!stage || round == 0 || round > 1000000 || end == nullptr || *end != '\0') {
    std::string names;
    for (aggregation::SecAggStage s : aggregation::kSecAggStages) {
      names += std::string(names.empty() ? "" : ", ") + aggregation::StageName(s);
    }
    std::fprintf(stderr,
                 "client: --fault-stop-before: expected STAGE:ROUND with STAGE one of %s; got "
                 "\"%s\"\n",
                 names.c_str(), fault.c_str());
    return false;
  }
  o.fault_stage = *stage;
  o.fault_round = static_cast<uint32_t>(round);
  return true;
}

int RunClientCommand(ClientFlags& f, const std::string& log_level) {
  client::ClientOptions& o = f.options;
  // The allowlist names a client by its key file: so does the client.
  if (o.name.empty()) {
    o.name = std::filesystem::path(o.identity.empty() ? o.data : o.identity).stem().string();
  }
  if (f.pause_round != 0) {
    o.fault_stage = aggregation::SecAggStage::kMaskedInput;
    o.fault_round = f.pause_round;
  }
  if (!f.fault.empty() && !ParseFaultStopBefore(f.fault, o)) return 2;
  if (!o.fault_misbehave.empty() &&
      std::find(std::begin(client::kMisbehaviours), std::end(client::kMisbehaviours),
                o.fault_misbehave) == std::end(client::kMisbehaviours)) {
    std::fprintf(stderr, "client: --fault-misbehave: unknown behaviour \"%s\"\n",
                 o.fault_misbehave.c_str());
    return 2;
  }
  InitLogging("client", o.name, log_level);
  auto metrics = StartMetrics(f.metrics);
  if (!metrics.ok()) return Report(metrics.status(), "client");
  o.metrics = metrics->get();
  const Status result = client::RunClient(o, StopFlag());
  return Report(LingerForScrape(result, o.metrics, f.metrics), "client");
}

}  // namespace

Command AddClientCommand(CLI::App& app, const std::string& log_level) {
  auto* client = app.add_subcommand("client", "Run a client daemon");
  auto f = std::make_shared<ClientFlags>();
  AddConnectionFlags(client, f->options);
  AddFaultFlags(client, *f);
  AddSecurityFlags(client, f->options);
  AddSiteFlags(client, f->options);
  AddMetricsFlags(client, f->metrics);
  return {client, [f, &log_level] { return RunClientCommand(*f, log_level); }};
}

}  // namespace cohort::cli
