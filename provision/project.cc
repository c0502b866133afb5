#include "provision/project.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "proto/config_io.h"

namespace cohort::provision {
namespace {

constexpr size_t kMaxNameChars = 48;
constexpr size_t kMaxHostChars = 253;
constexpr size_t kMaxWordChars = 4096;
constexpr uint32_t kMaxRanks = 1024;
constexpr uintmax_t kMaxProjectBytes = 1 << 20;

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

// A host or bind address: the characters of names, IPv4 and bracketed IPv6.
Status CheckHost(const std::string& field, const std::string& host, bool may_be_any) {
  if (host.empty()) return InvalidArgumentError(field + ": missing (a host name or an address)");
  if (may_be_any && host == "*") return OkStatus();
  const bool bad =
      host.size() > kMaxHostChars || host.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789.-_:[]") != std::string::npos;
  if (bad) {
    return InvalidArgumentError(field + ": " + Quoted(host) + " is not a host name or an address" +
                                (may_be_any ? " (or \"*\": every interface)" : ""));
  }
  return OkStatus();
}

Status CheckPort(const std::string& field, uint32_t port) {
  if (port == 0 || port > 65535) {
    return InvalidArgumentError(field + ": must be in [1, 65535], got " + std::to_string(port));
  }
  return OkStatus();
}

// A word a start script carries inside double quotes and a unit's ExecStart
// in its own quoting: printable ASCII without quotes, backslash, '$' and '`'.
Status CheckWord(const std::string& field, const std::string& word) {
  if (word.empty()) return InvalidArgumentError(field + ": empty");
  if (word.size() > kMaxWordChars) return InvalidArgumentError(field + ": too long");
  for (char c : word) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\'' || c == '\\' || c == '$' || c == '`') {
      return InvalidArgumentError(field + ": " + Quoted(word) +
                                  " holds a character a start script or a systemd unit "
                                  "cannot carry safely (quotes, backslash, $, ` or a control "
                                  "character)");
    }
  }
  return OkStatus();
}

Status CheckWords(const std::string& field,
                  const google::protobuf::RepeatedPtrField<std::string>& words) {
  for (int i = 0; i < words.size(); ++i) {
    COHORT_RETURN_IF_ERROR(CheckWord(field + "[" + std::to_string(i) + "]", words[i]));
  }
  return OkStatus();
}

Status CheckRanks(const std::string& field, uint32_t ranks) {
  if (ranks == 0 || ranks > kMaxRanks) {
    return InvalidArgumentError(field + ": must be in [1, " + std::to_string(kMaxRanks) +
                                "], got " + std::to_string(ranks));
  }
  return OkStatus();
}

Status CheckCoordinator(const Project& project) {
  if (!project.has_coordinator()) {
    return InvalidArgumentError("coordinator: missing (its host, port and run config)");
  }
  const CoordinatorSpec& c = project.coordinator();
  COHORT_RETURN_IF_ERROR(CheckHost("coordinator.host", c.host(), false));
  COHORT_RETURN_IF_ERROR(CheckPort("coordinator.port", c.port()));
  COHORT_RETURN_IF_ERROR(CheckHost("coordinator.bind", c.bind(), true));
  if (c.run_config_case() == CoordinatorSpec::RUN_CONFIG_NOT_SET) {
    return InvalidArgumentError("coordinator: set config_file or config (the run configuration)");
  }
  if (c.has_config_file())
    COHORT_RETURN_IF_ERROR(CheckWord("coordinator.config_file", c.config_file()));
  return CheckWords("coordinator.extra_args", c.extra_args());
}

Status CheckSite(int i, const SiteSpec& s) {
  const std::string at = "site[" + std::to_string(i) + "]";
  COHORT_RETURN_IF_ERROR(CheckName(at + ".name", s.name()));
  COHORT_RETURN_IF_ERROR(CheckWord(at + ".data", s.data()));
  COHORT_RETURN_IF_ERROR(CheckRanks(at + ".ranks", s.ranks()));
  if (s.ranks() > 1) {
    COHORT_RETURN_IF_ERROR(CheckHost(at + ".site_host", s.site_host(), false));
    COHORT_RETURN_IF_ERROR(CheckPort(at + ".site_port", s.site_port()));
  } else if (s.has_site_host() || s.rank_host_size() > 0) {
    return InvalidArgumentError(at + ": site_host and rank_host are for a site of ranks > 1");
  }
  if (s.rank_host_size() > 0 && static_cast<uint32_t>(s.rank_host_size()) != s.ranks() - 1) {
    return InvalidArgumentError(at + ".rank_host: one host per worker rank (" +
                                std::to_string(s.ranks() - 1) + "), got " +
                                std::to_string(s.rank_host_size()));
  }
  for (int k = 0; k < s.rank_host_size(); ++k) {
    COHORT_RETURN_IF_ERROR(
        CheckHost(at + ".rank_host[" + std::to_string(k) + "]", s.rank_host(k), false));
  }
  return CheckWords(at + ".extra_args", s.extra_args());
}

Status CheckGroup(int i, const GroupSpec& g) {
  const std::string at = "group[" + std::to_string(i) + "]";
  COHORT_RETURN_IF_ERROR(CheckName(at + ".name", g.name()));
  COHORT_RETURN_IF_ERROR(CheckRanks(at + ".ranks", g.ranks()));
  COHORT_RETURN_IF_ERROR(CheckHost(at + ".master_host", g.master_host(), false));
  COHORT_RETURN_IF_ERROR(CheckPort(at + ".master_port", g.master_port()));
  if (g.host_size() > 0 && static_cast<uint32_t>(g.host_size()) != g.ranks()) {
    return InvalidArgumentError(at + ".host: one host per rank (" + std::to_string(g.ranks()) +
                                "), got " + std::to_string(g.host_size()));
  }
  for (int k = 0; k < g.host_size(); ++k) {
    COHORT_RETURN_IF_ERROR(CheckHost(at + ".host[" + std::to_string(k) + "]", g.host(k), false));
  }
  if (g.run_config_case() == GroupSpec::RUN_CONFIG_NOT_SET) {
    return InvalidArgumentError(at + ": set config_file or config (a DATA_PARALLEL run config)");
  }
  if (g.has_config_file()) COHORT_RETURN_IF_ERROR(CheckWord(at + ".config_file", g.config_file()));
  return CheckWords(at + ".extra_args", g.extra_args());
}

Status CheckSystemd(const SystemdSpec& s) {
  for (const auto& [field, path] :
       {std::pair<std::string, std::string>{"systemd.binary", s.binary()},
        {"systemd.kit_root", s.kit_root()}}) {
    COHORT_RETURN_IF_ERROR(CheckWord(field, path));
    if (path.front() != '/' || path.find(' ') != std::string::npos) {
      return InvalidArgumentError(field + ": " + Quoted(path) +
                                  " must be an absolute path without spaces");
    }
  }
  return CheckName("systemd.user", s.user());
}

// Every kit name once: "coordinator", the sites, their ranks, the groups'.
Status CheckUniqueKits(const Project& project) {
  std::map<std::string, std::string> owner = {{kCoordinatorKit, "the coordinator"}};
  auto claim = [&owner](const std::string& kit, const std::string& field) -> Status {
    auto [it, inserted] = owner.emplace(kit, field);
    if (inserted) return OkStatus();
    return InvalidArgumentError(field + ": kit name " + Quoted(kit) + " is also " + it->second +
                                "'s; every site, group and rank needs its own name");
  };
  for (int i = 0; i < project.site_size(); ++i) {
    const SiteSpec& s = project.site(i);
    const std::string at = "site[" + std::to_string(i) + "]";
    COHORT_RETURN_IF_ERROR(claim(s.name(), at + ".name"));
    for (uint32_t k = 1; k < s.ranks(); ++k) {
      COHORT_RETURN_IF_ERROR(claim(s.name() + "-rank-" + std::to_string(k), at + ".ranks"));
    }
  }
  for (int i = 0; i < project.group_size(); ++i) {
    const GroupSpec& g = project.group(i);
    for (uint32_t k = 0; k < g.ranks(); ++k) {
      COHORT_RETURN_IF_ERROR(
          claim(g.name() + "-rank-" + std::to_string(k), "group[" + std::to_string(i) + "]"));
    }
  }
  return OkStatus();
}

StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return NotFoundError(path + ": cannot open " + what + (ec ? ": " + ec.message() : ""));
  }
  if (std::filesystem::is_directory(status)) {
    return InvalidArgumentError(path + ": is a directory, not a " + what);
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxProjectBytes) {
    return InvalidArgumentError(path + ": larger than 1 MiB, not a " + what);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return NotFoundError(path + ": cannot read " + what);
  return text.str();
}

// The run config a spec names, as text, checked for `mode`.
template <typename Spec>
StatusOr<std::string> ReadRunConfig(const Spec& spec, const std::string& field,
                                    const std::filesystem::path& base, config::Mode mode) {
  std::string text;
  config::RunConfig parsed;
  if (spec.has_config_file()) {
    std::filesystem::path path = spec.config_file();
    if (path.is_relative()) path = base / path;
    COHORT_ASSIGN_OR_RETURN(text, ReadSmallFile(path.string(), "run config"));
    auto config = config::ParseRunConfig(text, path.string());
    if (!config.ok()) return config.status().WithContext(field + ".config_file");
    parsed = *config;
  } else {
    parsed = spec.config();
    COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(parsed).WithContext(field + ".config"));
    text = config::ToText(parsed);
  }
  if (parsed.mode() != mode) {
    return InvalidArgumentError(field + ": its run config's mode must be " +
                                config::Mode_Name(mode) + ", got " +
                                config::Mode_Name(parsed.mode()));
  }
  return text;
}

}  // namespace

Status CheckName(std::string_view field, const std::string& name) {
  const bool bad = name.empty() || name.size() > kMaxNameChars || name[0] == '.' ||
                   name[0] == '-' ||
                   name.find_first_not_of(
                       "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       "0123456789._-") != std::string::npos;
  if (!bad) return OkStatus();
  return InvalidArgumentError(std::string(field) + ": " + Quoted(name) +
                              " is not a name (1 to 48 of A-Z a-z 0-9 . _ -, not starting with "
                              "'.' or '-')");
}

Status CheckProject(const Project& project) {
  COHORT_RETURN_IF_ERROR(CheckCoordinator(project));
  if (project.site_size() == 0) return InvalidArgumentError("site: the project lists no site");
  for (int i = 0; i < project.site_size(); ++i) {
    COHORT_RETURN_IF_ERROR(CheckSite(i, project.site(i)));
  }
  for (int i = 0; i < project.group_size(); ++i) {
    COHORT_RETURN_IF_ERROR(CheckGroup(i, project.group(i)));
  }
  COHORT_RETURN_IF_ERROR(CheckWords("client_args", project.client_args()));
  COHORT_RETURN_IF_ERROR(CheckName("name", project.name()));
  COHORT_RETURN_IF_ERROR(CheckSystemd(project.systemd()));
  return CheckUniqueKits(project);
}

StatusOr<Project> ParseProject(std::string_view text, std::string_view source) {
  Project project;
  COHORT_RETURN_IF_ERROR(config::ParseTextStrict(text, source, project));
  COHORT_RETURN_IF_ERROR(CheckProject(project).WithContext(source));
  return project;
}

StatusOr<KitsState> LoadProject(const std::string& path) {
  COHORT_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "project file"));
  COHORT_ASSIGN_OR_RETURN(Project project, ParseProject(text, path));
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  KitsState state;
  state.set_format(1);
  auto coordinator = ReadRunConfig(project.coordinator(), "coordinator", base, config::FEDERATED);
  if (!coordinator.ok()) return coordinator.status().WithContext(path);
  state.set_coordinator_config(*coordinator);
  for (int i = 0; i < project.group_size(); ++i) {
    const GroupSpec& g = project.group(i);
    auto text = ReadRunConfig(g, "group[" + std::to_string(i) + "]", base, config::DATA_PARALLEL);
    if (!text.ok()) return text.status().WithContext(path);
    (*state.mutable_group_config())[g.name()] = *text;
  }
  *state.mutable_project() = std::move(project);
  return state;
}

std::vector<std::string> KitNames(const Project& project) {
  std::vector<std::string> names = {kCoordinatorKit};
  for (const SiteSpec& s : project.site()) {
    names.push_back(s.name());
    for (uint32_t k = 1; k < s.ranks(); ++k)
      names.push_back(s.name() + "-rank-" + std::to_string(k));
  }
  for (const GroupSpec& g : project.group()) {
    for (uint32_t k = 0; k < g.ranks(); ++k)
      names.push_back(g.name() + "-rank-" + std::to_string(k));
  }
  return names;
}

}  // namespace cohort::provision
