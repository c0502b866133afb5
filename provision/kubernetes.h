// `cohort provision --format kubernetes`: beside the startup kits, a
// kustomization per participant (deploy/kubernetes/README.md), built from a
// kits folder that `Provision` (provision/kits.h) has just written:
//
//   OUT/kubernetes/kustomization.yaml  every participant in one namespace
//   OUT/kubernetes/base/               deploy/kubernetes/base's coordinator
//                                      and client, as this cohort embeds them
//   OUT/kubernetes/coordinator/        its StatefulSet's command, run config
//                                      (config.textproto) and Secrets
//   OUT/kubernetes/SITE/               its client's Deployment (suffix -SITE)
//
// Each participant's secrets.yaml (0600) holds its Secrets, the key files
// base64-encoded under `data:` exactly as they are in its kit, and the public
// keys it trusts (the coordinator's allowlist; a client's coordinator.pub and
// --peers). The command lines are the kits' own (start.sh's), with paths
// where the pods mount them. OUT/kubernetes/ is rewritten as a whole each
// time, so the same kits give the same bytes, and a revoked site's folder
// goes. Not thread-safe; one provision per kits folder at a time.
#ifndef COHORT_PROVISION_KUBERNETES_H_
#define COHORT_PROVISION_KUBERNETES_H_

#include <string>

#include "common/status.h"

namespace cohort::provision {

// The folder under the kits folder.
inline constexpr char kKubernetesDir[] = "kubernetes";

// Writes OUT/kubernetes/ from OUT/kits.textproto and the kits' keys.
// kInvalidArgument, naming the site or group, for what it cannot express
// yet: a site of several ranks, a data-parallel group (their kits are
// written all the same). kFailedPrecondition: OUT is not a kits folder.
// Other errors name the file. Never logs a key.
Status WriteKubernetes(const std::string& out);

// True when OUT/kubernetes/ exists: a provision that does not ask for the
// format keeps it current all the same, so it never holds a revoked key.
bool HasKubernetes(const std::string& out);

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_KUBERNETES_H_
