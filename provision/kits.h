// `cohort provision`: startup kits for a federation, written from a project
// file (proto/provision.proto) into a kits folder:
//
//   OUT/kits.textproto     what was provisioned (KitsState): the next run,
//                          --add-site and --revoke start from it
//   OUT/NAME/ (0700)       one kit per participant: NAME.key (0600) and
//                          NAME.pub, its config.textproto, start.sh,
//                          cohort-NAME.service, and the public keys it needs
//                          (a client: coordinator.pub and peers/, its
//                          --peers; the coordinator: allow/, its --allow)
//   OUT/NAME.tar.gz (0600) the same kit, for carrying to its host
//
// Keys are made once. Provisioning again (the same or an edited project)
// keeps every existing key byte for byte and rewrites everything else, so
// the same inputs give the same files, tarballs included. Not thread-safe;
// one provision per kits folder at a time.
#ifndef COHORT_PROVISION_KITS_H_
#define COHORT_PROVISION_KITS_H_

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace cohort::provision {

struct ProvisionRequest {
  std::string project;  // The project file; empty with add_site or revoke.
  std::string out;      // The kits folder.
  // At most one of these: a new site (its training shard `add_site_data`,
  // empty: the default), or a site to remove. Both work on OUT's own
  // project (kits.textproto) and take no project file.
  std::string add_site;
  std::string add_site_data;
  std::string revoke;
};

struct KitReport {
  std::string name;
  bool new_key = false;  // Made now; else kept.
};

struct ProvisionReport {
  std::vector<KitReport> kits;       // Every kit now in OUT, in plan order.
  std::vector<std::string> removed;  // Kits deleted (a revoked site's).
};

// kInvalidArgument: a bad project (naming file, line, column or field), a
// request that mixes modes, an --add-site of a name in use, a --revoke of
// a name that is not a site of OUT (the error lists them). kFailedPrecondition:
// OUT exists and is not a kits folder (no kits.textproto) nor empty; the
// project drops a kit OUT holds (revoke it) or lists a revoked site; a kit
// provisioned before has lost its key. Other errors name the file.
StatusOr<ProvisionReport> Provision(const ProvisionRequest& request);

// Replaces `path` atomically (a temporary beside it, then a rename) with
// `bytes`, mode `mode` whatever the umask: every file provision writes.
Status WriteKitFile(const std::filesystem::path& path, std::string_view bytes, mode_t mode);

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_KITS_H_
