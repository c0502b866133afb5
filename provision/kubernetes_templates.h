// deploy/kubernetes/base's coordinator and client, embedded at build time
// (provision/embed_templates.py) for `cohort provision --format kubernetes`.
#ifndef COHORT_PROVISION_KUBERNETES_TEMPLATES_H_
#define COHORT_PROVISION_KUBERNETES_TEMPLATES_H_

namespace cohort::provision {

extern const char kKubernetesCoordinatorKustomization[];  // base/coordinator/kustomization.yaml
extern const char kKubernetesCoordinator[];               // base/coordinator/coordinator.yaml
extern const char kKubernetesClientKustomization[];       // base/client/kustomization.yaml
extern const char kKubernetesClient[];                    // base/client/client.yaml

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_KUBERNETES_TEMPLATES_H_
