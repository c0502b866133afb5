// Reading and checking `cohort provision`'s project file
// (proto/provision.proto) and the state a kits folder keeps of it.
#ifndef COHORT_PROVISION_PROJECT_H_
#define COHORT_PROVISION_PROJECT_H_

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "proto/provision.pb.h"

namespace cohort::provision {

// The coordinator's kit: its folder and key name.
inline constexpr char kCoordinatorKit[] = "coordinator";
// The file that makes a folder a kits folder (a KitsState in text format).
inline constexpr char kStateFile[] = "kits.textproto";

// Parses a project in text format. A syntax error or an unknown field is
// kInvalidArgument naming `source`, the line and the column; then Check().
// Leaves the run configs unread (LoadProject reads them).
StatusOr<Project> ParseProject(std::string_view text, std::string_view source);

// Reads `path` (at most 1 MiB), parses and checks it, and reads its run
// configs: a config_file relative to the project file's folder, or the
// inline config rendered as text. The result holds the project and, for
// each config, its text (KitsState's coordinator_config and group_config);
// `revoked` is empty. Errors name the file and the field.
StatusOr<KitsState> LoadProject(const std::string& path);

// The rules the .proto states, each error naming the field
// ("site[1].name: \"a\" is also site[0].name"): names, hosts, ports,
// ranks, one run config each, words that a start script and a unit can
// carry, absolute systemd paths, and unique kit names.
Status CheckProject(const Project& project);

// Every kit the project makes, in order: the coordinator, each site
// followed by its worker ranks (NAME-rank-K), each group's ranks.
std::vector<std::string> KitNames(const Project& project);

// A name as the .proto allows it (1 to 48 of [A-Za-z0-9._-], not starting
// with '.' or '-'); the error names `field`.
Status CheckName(std::string_view field, const std::string& name);

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_PROJECT_H_
