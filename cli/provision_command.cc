// `cohort provision`: startup kits for a federation (provision/kits.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "provision/kits.h"
#include "provision/kubernetes.h"

namespace cohort::cli {
namespace {

// What was written, and what to do with it.
void PrintReport(const provision::ProvisionRequest& r, const provision::ProvisionReport& report) {
  for (const auto& kit : report.kits) {
    std::printf("%s/%s/ and %s.tar.gz (%s)\n", r.out.c_str(), kit.name.c_str(), kit.name.c_str(),
                kit.new_key ? "new key" : "key kept");
  }
  for (const auto& name : report.removed) {
    std::printf("%s/%s/ removed (revoked)\n", r.out.c_str(), name.c_str());
  }
  if (!r.revoke.empty()) {
    std::printf(
        "%s is revoked: copy the coordinator's allow/ to its host and reload it "
        "(systemctl reload cohort-coordinator, or kill -HUP its pid) to refuse the key at once; "
        "give each site its new peers/\n",
        r.revoke.c_str());
  } else if (!r.add_site.empty()) {
    std::printf(
        "%s added: copy the coordinator's allow/ to its host and reload it (systemctl reload "
        "cohort-coordinator, or kill -HUP its pid); give each site its new peers/\n",
        r.add_site.c_str());
  }
}

// What a kits folder holds beside the kits: nothing more, or Kubernetes
// overlays (provision/kubernetes.h), kept current once there.
int WriteFormats(const provision::ProvisionRequest& r, const std::string& format) {
  if (format != "kubernetes" && !provision::HasKubernetes(r.out)) return 0;
  const Status written = provision::WriteKubernetes(r.out);
  if (written.ok()) {
    std::printf("%s/%s/ (Kubernetes: kubectl apply -k %s/%s/NAME)\n", r.out.c_str(),
                provision::kKubernetesDir, r.out.c_str(), provision::kKubernetesDir);
  }
  return Report(written, "provision --format kubernetes");
}

int RunProvisionCommand(provision::ProvisionRequest& r, const std::string& format,
                        const std::string& log_level) {
  InitLogging("provision", "", log_level);
  if (format != "kits" && format != "kubernetes") {
    std::fprintf(stderr, "provision: --format %s: not a format (kits, kubernetes)\n",
                 format.c_str());
    return 2;
  }
  while (r.out.size() > 1 && r.out.back() == '/') r.out.pop_back();  // kits/ prints as kits.
  const bool change = !r.add_site.empty() || !r.revoke.empty();
  if (!r.add_site.empty() && !r.revoke.empty()) {
    std::fprintf(stderr, "provision: --add-site and --revoke: one at a time\n");
    return 2;
  }
  if (change && !r.project.empty()) {
    std::fprintf(stderr,
                 "provision: --add-site and --revoke change the kits folder's own project (%s/"
                 "kits.textproto); leave out --project\n",
                 r.out.c_str());
    return 2;
  }
  if (!change && r.project.empty()) {
    std::fprintf(stderr, "provision: --project is required (or --add-site or --revoke)\n");
    return 2;
  }
  if (!r.add_site_data.empty() && r.add_site.empty()) {
    std::fprintf(stderr, "provision: --data goes with --add-site\n");
    return 2;
  }
  auto report = provision::Provision(r);
  if (!report.ok()) return Report(report.status(), "provision");
  PrintReport(r, *report);
  return WriteFormats(r, format);
}

}  // namespace

Command AddProvisionCommand(CLI::App& app, const std::string& log_level) {
  auto* provision = app.add_subcommand(
      "provision",
      "Write a startup kit per participant of a federation (keys, allowlists, config, start "
      "script, systemd unit), or add or revoke a site");
  auto r = std::make_shared<provision::ProvisionRequest>();
  auto format = std::make_shared<std::string>("kits");
  provision->add_option("--project", r->project,
                        "The project file (text format; proto/provision.proto)");
  provision->add_option("--out", r->out, "The kits folder (new, empty, or written before)")
      ->required();
  provision->add_option("--add-site", r->add_site,
                        "Add a site to the kits folder's project, keeping every key");
  provision->add_option("--data", r->add_site_data,
                        "With --add-site: the new site's training shard (default train.shard)");
  provision->add_option("--revoke", r->revoke,
                        "Remove a site: its kit is deleted, the allowlists and --peers copies "
                        "rewritten");
  provision->add_option("--format", *format,
                        "kits (the default), or kubernetes: the kits and OUT/kubernetes/, a "
                        "kustomization per participant with its keys in Secrets (kept current "
                        "by every later provision)");
  return {provision,
          [r, format, &log_level] { return RunProvisionCommand(*r, *format, log_level); }};
}

}  // namespace cohort::cli
