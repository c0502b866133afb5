// `cohort site-worker`: a rank >= 1 of a site that is data-parallel inside
// (client/site.h).
#include <CLI/CLI.hpp>
#include <csignal>
#include <memory>

#include "cli/command.h"
#include "client/site.h"
#include "common/logging.h"

namespace cohort::cli {
namespace {

int RunSiteWorkerCommand(const client::SiteWorkerOptions& o, const std::string& log_level) {
  InitLogging("site rank " + std::to_string(o.group.rank), "", log_level);
  // A stopped worker stops at once: the site's client notices.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  return Report(client::RunSiteWorker(o), "site-worker");
}

}  // namespace

Command AddSiteWorkerCommand(CLI::App& app, const std::string& log_level) {
  auto* site_worker = app.add_subcommand(
      "site-worker", "Train with a site's client, on this worker's shard (a site's rank >= 1)");
  auto o = std::make_shared<client::SiteWorkerOptions>();
  site_worker->add_option("--site-master", o->group.master, "The site's meeting address")
      ->required();
  site_worker->add_option("--rank", o->group.rank, "This worker's rank, 1 .. size-1")->required();
  site_worker->add_option("--site-size", o->group.size, "Ranks of the site, its client included")
      ->required()
      ->check(CLI::Range(2, 1024));
  site_worker->add_option("--transport", o->group.transport, "shm, tcp or auto")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  site_worker->add_option("--host", o->group.host, "Where the other ranks reach this one (tcp)")
      ->capture_default_str();
  site_worker->add_option("--data", o->data, "This worker's shard file")->required();
  site_worker->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")
      ->capture_default_str();
  site_worker->add_option("--threads", o->threads, "BLAS threads for training")
      ->capture_default_str();
  site_worker->add_option("--identity", o->identity, "This worker's key file (cohort keygen)");
  site_worker->add_option("--allow", o->allow, "Directory of the site's .pub files");
  site_worker->add_option("--master-key", o->master_key, "The site's client's .pub file (pinned)");
  site_worker->add_flag("!--no-encryption", o->group.encrypt,
                        "Over tcp: authenticate the ranks but send plaintext (trusted fabrics)");
  site_worker->add_flag("--insecure", o->group.insecure,
                        "Over tcp: no authentication, plaintext (trusted networks only)");
  return {site_worker, [o, &log_level] { return RunSiteWorkerCommand(*o, log_level); }};
}

}  // namespace cohort::cli
