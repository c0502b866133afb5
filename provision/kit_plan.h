// What each startup kit holds, as data: the plan provision/kits.cc writes,
// and the renderings of a kit's command as a start script (paths relative
// to the kit, so it can be moved) and as a systemd unit (absolute paths
// where the kit is installed). Pure functions: no file is touched here.
#ifndef COHORT_PROVISION_KIT_PLAN_H_
#define COHORT_PROVISION_KIT_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/provision.pb.h"

namespace cohort::provision {

// One word of a command line after the executable.
struct Word {
  enum class Kind {
    kLiteral,    // `value` as is.
    kKitPath,    // `value` relative to the kit.
    kStatePath,  // `value` relative to the state directory (the unit's);
                 // a start script keeps it in the kit.
  };
  Kind kind = Kind::kLiteral;
  std::string value;
  // When set, the start script takes the word from this environment
  // variable when it is set (e.g. COHORT_BIND); the unit never does.
  std::string env;
};

// A kit: the files provision writes into OUT/NAME/.
struct KitPlan {
  std::string name;           // Kit folder and key name (NAME.key, NAME.pub).
  std::string role;           // coordinator, client, site-worker or worker.
  std::string what;           // One line for the start script's and unit's header.
  std::vector<Word> command;  // The subcommand and its flags.
  // Folders of .pub files: folder -> the kits whose public keys it holds.
  std::map<std::string, std::vector<std::string>> key_dirs;
  // Single public keys: file name -> the kit whose key it is.
  std::map<std::string, std::string> key_copies;
  std::string config_text;              // config.textproto.
  std::string unit_file;                // cohort-NAME.service
  const char* unit_template = nullptr;  // deploy/systemd/*.service.in
};

// The kits of `state`'s project, in KitNames() order. Every client's
// peers/ holds every site's key, the coordinator's allow/ the same.
std::vector<KitPlan> PlanKits(const KitsState& state);

// The kit's start.sh: POSIX sh, the exact cohort command, paths relative to
// the script's folder, each Word::env honoured, "$@" passed on.
std::string StartScript(const Project& project, const KitPlan& kit);

// The kit's systemd unit: its template with the @PLACEHOLDERS@ filled in
// for the kit installed at systemd.kit_root/NAME, the state (run) folder
// /var/lib/cohort/NAME.
std::string SystemdUnit(const Project& project, const KitPlan& kit);

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_KIT_PLAN_H_
