// The client daemon: registers with the coordinator, trains on its private
// shard when given a task, sends back the model delta and its metrics.
// Survives coordinator restarts (re-registers by itself).
#ifndef COHORT_CLIENT_DAEMON_H_
#define COHORT_CLIENT_DAEMON_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "aggregation/secagg_stage.h"
#include "client/local_trainer.h"
#include "common/status.h"
#include "net/metrics_endpoint.h"

namespace cohort::client {

struct ClientOptions {
  std::string coordinator;  // e.g. "tcp://127.0.0.1:7000"
  std::string data;         // Shard file; never leaves this process.
  // This client's own test split (a shard file), for the coordinator's
  // federated evaluation (rounds.federated_eval_every). Empty: it does not
  // evaluate (its updates say so and it trains as usual).
  std::string test_data;
  std::string name;  // Client name; [A-Za-z0-9._-]{1,64}.
  int threads = 1;   // BLAS threads for local training.
  // Where to train: cpu | cuda | cuda:N | auto (a GPU where one is usable,
  // else the CPU, logged once).
  std::string device = "auto";
  // Fault injection for tests (see client::FaultPlan): in round
  // `fault_round`, send nothing from stage `fault_stage` on. 0: off.
  aggregation::SecAggStage fault_stage = aggregation::SecAggStage::kNone;
  uint32_t fault_round = 0;
  std::string fault_misbehave;  // Testing: see client::kMisbehaviours.
  // Debugging: write each securely aggregated round's encoded input (before
  // masking) to DIR/NAME.round-N.u32. The file stays on this site.
  std::string dump_inputs;
  // Transport security: this client's identity key file and the
  // coordinator's .pub file (pinned). `insecure`: no CURVE (plaintext); the
  // identity that signs secure aggregation is then `identity` if given, else
  // a fresh key for this process.
  std::string identity;
  std::string coordinator_key;
  bool insecure = false;
  // Directory of .pub files: the only identity keys this client accepts in
  // a secure-aggregation cohort. Empty: trust the coordinator's list.
  std::string peers;
  // Refuse every task that is not securely aggregated (implied by peers): a
  // coordinator could otherwise ask for this client's update in the clear.
  bool require_secure = false;
  // Send the coordinator this client's training samples per class (Hello's
  // label_counts): its label distribution, for the run report's label
  // skew. Off by default: it tells the coordinator about the data.
  bool share_label_counts = false;
  // SCAFFOLD (train.scaffold): the directory that keeps this client's
  // control variate c_i across restarts (client/control_variate.h); created
  // if missing. Empty: c_i lives in this process only.
  std::string state_dir;
  // The fraction of a cohort this client assumes may collude with the
  // coordinator; it refuses a threshold weaker than that implies. Two-client
  // cohorts need 0: with one other client, that client is the only one
  // who could collude.
  double corrupt_fraction = 0.1;
  // Distributed DP: this client's own noise multiplier (Session::
  // set_dp_noise_multiplier); it refuses a round whose cohort, or whose
  // survivor list, is smaller than the survivors its noise share assumes.
  // 0: no check.
  double dp_noise_multiplier = 0;
  // Distributed DP: the most noised updates this client makes, ever, as
  // counted in state_dir's ledger (Session::set_dp_max_rounds); needs state_dir
  // (RunClient refuses it without one). 0: no cap.
  uint32_t dp_max_rounds = 0;
  // A site that is data-parallel inside (client/site.h): with site_size > 1
  // this daemon is rank 0 of a group that meets at site_master, and its
  // site workers (`cohort site-worker`) train each task with it.
  std::string site_master;
  int site_size = 1;
  std::string site_transport = "auto";
  std::string site_host = "127.0.0.1";  // Where the site's workers reach this client (tcp).
  // Over tcp the site's ranks authenticate each other with their identity
  // keys: the directory of the site's .pub files (this client's among
  // them), or `site_insecure` for plaintext on a trusted network.
  std::string site_allow;
  bool site_encrypt = true;  // Over ZeroMQ CURVE; else plain TCP (trusted fabrics).
  bool site_insecure = false;
  // --metrics-addr (not owned; null: none): this client's rounds, bytes and
  // training speed go into its registry (client/metrics.h).
  net::MetricsEndpoint* metrics = nullptr;
};

// Runs until the coordinator says the run is finished (OK) or `stop` becomes
// true (kCancelled; a Goodbye tells the coordinator). kFailedPrecondition
// when the coordinator rejects this client or its model does not fit the
// local data. `trainer` (not owned) trains each task, on a worker thread of
// this call; options.data, device, threads and site_* are the native
// trainer's and are not read here.
Status RunClient(const ClientOptions& options, LocalTrainer& trainer,
                 const std::atomic<bool>& stop);

// The native client: RunClient with NewNativeTrainer(options).
Status RunClient(const ClientOptions& options, const std::atomic<bool>& stop);

}  // namespace cohort::client

#endif  // COHORT_CLIENT_DAEMON_H_
