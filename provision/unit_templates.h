// The systemd unit templates of deploy/systemd/, embedded at build time
// (provision/embed_templates.py). Placeholders: @UNIT@, @NAME@, @ROLE@,
// @PROJECT@, @USER@, @KIT_DIR@, @STATE_NAME@, @STATE_DIR@, @EXEC_START@.
#ifndef COHORT_PROVISION_UNIT_TEMPLATES_H_
#define COHORT_PROVISION_UNIT_TEMPLATES_H_

namespace cohort::provision {

extern const char kCoordinatorUnitTemplate[];  // cohort-coordinator.service.in
extern const char kClientUnitTemplate[];       // cohort-client.service.in
extern const char kWorkerUnitTemplate[];       // cohort-worker.service.in

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_UNIT_TEMPLATES_H_
