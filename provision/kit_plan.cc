#include "provision/kit_plan.h"

#include <set>

#include "provision/project.h"
#include "provision/unit_templates.h"

namespace cohort::provision {
namespace {

// Where systemd keeps each kit's state: StateDirectory= is relative to it.
constexpr char kStateRoot[] = "/var/lib/";
constexpr char kStatePrefix[] = "cohort/";

Word Lit(std::string value, std::string env = "") {
  return {Word::Kind::kLiteral, std::move(value), std::move(env)};
}
Word Kit(std::string path) { return {Word::Kind::kKitPath, std::move(path), ""}; }

std::string Tcp(const std::string& host, uint32_t port) {
  return "tcp://" + host + ":" + std::to_string(port);
}

std::string RankKit(const std::string& base, uint32_t rank) {
  return base + "-rank-" + std::to_string(rank);
}

void AddFlag(KitPlan& kit, const std::string& flag, Word value) {
  kit.command.push_back(Lit(flag));
  kit.command.push_back(std::move(value));
}

void AddWords(KitPlan& kit, const google::protobuf::RepeatedPtrField<std::string>& words) {
  for (const std::string& w : words) kit.command.push_back(Lit(w));
}

KitPlan NewKit(std::string name, std::string role, std::string what) {
  KitPlan kit;
  kit.name = std::move(name);
  kit.role = std::move(role);
  kit.what = std::move(what);
  return kit;
}

std::vector<std::string> SiteNames(const Project& project) {
  std::vector<std::string> names;
  for (const SiteSpec& s : project.site()) names.push_back(s.name());
  return names;
}

KitPlan CoordinatorKit(const KitsState& state) {
  const Project& p = state.project();
  const CoordinatorSpec& c = p.coordinator();
  KitPlan kit = NewKit(kCoordinatorKit, "coordinator", "The coordinator");
  kit.command.push_back(Lit("coordinator"));
  AddFlag(kit, "--config", Kit("config.textproto"));
  AddFlag(kit, "--run-dir", {Word::Kind::kStatePath, "run", "COHORT_RUN_DIR"});
  AddFlag(kit, "--bind", Lit(Tcp(c.bind(), c.port()), "COHORT_BIND"));
  AddFlag(kit, "--identity", Kit(std::string(kCoordinatorKit) + ".key"));
  AddFlag(kit, "--allow", Kit("allow"));
  AddWords(kit, c.extra_args());
  kit.key_dirs["allow"] = SiteNames(p);
  kit.config_text = state.coordinator_config();
  kit.unit_template = kCoordinatorUnitTemplate;
  return kit;
}

// A site's own allowlist (ranks > 1): its client's key and its workers'.
std::vector<std::string> SiteRankKits(const SiteSpec& s) {
  std::vector<std::string> names = {s.name()};
  for (uint32_t k = 1; k < s.ranks(); ++k) names.push_back(RankKit(s.name(), k));
  return names;
}

KitPlan ClientKit(const KitsState& state, const SiteSpec& s) {
  const Project& p = state.project();
  KitPlan kit = NewKit(s.name(), "client", "Site " + s.name() + "'s client");
  kit.command.push_back(Lit("client"));
  AddFlag(kit, "--coordinator",
          Lit(Tcp(p.coordinator().host(), p.coordinator().port()), "COHORT_COORDINATOR"));
  AddFlag(kit, "--data", Lit(s.data(), "COHORT_DATA"));
  AddFlag(kit, "--identity", Kit(s.name() + ".key"));
  AddFlag(kit, "--coordinator-key", Kit("coordinator.pub"));
  AddFlag(kit, "--peers", Kit("peers"));
  if (s.ranks() > 1) {
    AddFlag(kit, "--site-master", Lit(Tcp(s.site_host(), s.site_port()), "COHORT_SITE_MASTER"));
    AddFlag(kit, "--site-size", Lit(std::to_string(s.ranks())));
    AddFlag(kit, "--site-transport", Lit("tcp"));
    AddFlag(kit, "--site-host", Lit(s.site_host(), "COHORT_SITE_HOST"));
    AddFlag(kit, "--site-allow", Kit("site-allow"));
    kit.key_dirs["site-allow"] = SiteRankKits(s);
  }
  AddWords(kit, p.client_args());
  AddWords(kit, s.extra_args());
  kit.key_dirs["peers"] = SiteNames(p);
  kit.key_copies["coordinator.pub"] = kCoordinatorKit;
  kit.config_text = state.coordinator_config();
  kit.unit_template = kClientUnitTemplate;
  return kit;
}

KitPlan SiteWorkerKit(const KitsState& state, const SiteSpec& s, uint32_t rank) {
  KitPlan kit = NewKit(RankKit(s.name(), rank), "site-worker",
                       "Rank " + std::to_string(rank) + " of site " + s.name());
  const std::string host = s.rank_host_size() > 0 ? s.rank_host(rank - 1) : s.site_host();
  kit.command.push_back(Lit("site-worker"));
  AddFlag(kit, "--site-master", Lit(Tcp(s.site_host(), s.site_port()), "COHORT_SITE_MASTER"));
  AddFlag(kit, "--rank", Lit(std::to_string(rank)));
  AddFlag(kit, "--site-size", Lit(std::to_string(s.ranks())));
  AddFlag(kit, "--transport", Lit("tcp"));
  AddFlag(kit, "--host", Lit(host, "COHORT_HOST"));
  AddFlag(kit, "--data", Lit(s.data(), "COHORT_DATA"));
  AddFlag(kit, "--identity", Kit(kit.name + ".key"));
  AddFlag(kit, "--allow", Kit("site-allow"));
  AddFlag(kit, "--master-key", Kit("master.pub"));
  kit.key_dirs["site-allow"] = SiteRankKits(s);
  kit.key_copies["master.pub"] = s.name();
  kit.config_text = state.coordinator_config();
  kit.unit_template = kWorkerUnitTemplate;
  return kit;
}

KitPlan GroupKit(const KitsState& state, const GroupSpec& g, uint32_t rank) {
  KitPlan kit = NewKit(RankKit(g.name(), rank), "worker",
                       "Rank " + std::to_string(rank) + " of data-parallel group " + g.name());
  const std::string host = g.host_size() > 0 ? g.host(rank) : g.master_host();
  kit.command.push_back(Lit("worker"));
  AddFlag(kit, "--config", Kit("config.textproto"));
  AddFlag(kit, "--run-dir", {Word::Kind::kStatePath, "run", "COHORT_RUN_DIR"});
  AddFlag(kit, "--rank", Lit(std::to_string(rank)));
  AddFlag(kit, "--world-size", Lit(std::to_string(g.ranks())));
  AddFlag(kit, "--master", Lit(Tcp(g.master_host(), g.master_port()), "COHORT_MASTER"));
  AddFlag(kit, "--transport", Lit("tcp"));
  AddFlag(kit, "--host", Lit(host, "COHORT_HOST"));
  AddFlag(kit, "--identity", Kit(kit.name + ".key"));
  AddFlag(kit, "--allow", Kit("allow"));
  AddFlag(kit, "--master-key", Kit("master.pub"));
  AddWords(kit, g.extra_args());
  for (uint32_t k = 0; k < g.ranks(); ++k) kit.key_dirs["allow"].push_back(RankKit(g.name(), k));
  kit.key_copies["master.pub"] = RankKit(g.name(), 0);
  auto config = state.group_config().find(g.name());
  if (config != state.group_config().end()) kit.config_text = config->second;
  kit.unit_template = kWorkerUnitTemplate;
  return kit;
}

// True for a word the shell and systemd both take as it is.
bool Plain(const std::string& s) {
  return !s.empty() && s.find_first_not_of(
                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789_./:@,+=-") == std::string::npos;
}

// A word inside double quotes in start.sh. Words were checked
// (CheckWord): no quote, backslash, '$' or '`' can be in `value`.
std::string ShellWord(const Word& w) {
  std::string inner = w.kind == Word::Kind::kLiteral ? w.value : "$KIT/" + w.value;
  if (!w.env.empty()) inner = "${" + w.env + ":-" + inner + "}";
  if (w.kind == Word::Kind::kLiteral && w.env.empty() && Plain(w.value)) return w.value;
  return "\"" + inner + "\"";
}

// A word of ExecStart=: '%' starts a specifier, so it is doubled.
std::string UnitWord(const Project& project, const KitPlan& kit, const Word& w) {
  std::string value = w.value;
  if (w.kind == Word::Kind::kKitPath) {
    value = project.systemd().kit_root() + "/" + kit.name + "/" + w.value;
  } else if (w.kind == Word::Kind::kStatePath) {
    value = std::string(kStateRoot) + kStatePrefix + kit.name + "/" + w.value;
  }
  std::string escaped;
  for (char c : value) escaped += c == '%' ? std::string("%%") : std::string(1, c);
  return value.find_first_of(" ;") == std::string::npos ? escaped : "\"" + escaped + "\"";
}

// The command's words, a flag and its values on one line each.
template <typename Render>
std::string Lines(const KitPlan& kit, const std::string& continuation, Render render) {
  std::string out;
  for (size_t i = 0; i < kit.command.size(); ++i) {
    const bool flag = kit.command[i].value.rfind("-", 0) == 0 &&
                      kit.command[i].kind == Word::Kind::kLiteral && i > 0;
    out += (flag ? continuation : std::string(" ")) + render(kit.command[i]);
  }
  return out;
}

void Replace(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

}  // namespace

std::vector<KitPlan> PlanKits(const KitsState& state) {
  const Project& p = state.project();
  std::vector<KitPlan> kits = {CoordinatorKit(state)};
  for (const SiteSpec& s : p.site()) {
    kits.push_back(ClientKit(state, s));
    for (uint32_t k = 1; k < s.ranks(); ++k) kits.push_back(SiteWorkerKit(state, s, k));
  }
  for (const GroupSpec& g : p.group()) {
    for (uint32_t k = 0; k < g.ranks(); ++k) kits.push_back(GroupKit(state, g, k));
  }
  for (KitPlan& kit : kits) kit.unit_file = "cohort-" + kit.name + ".service";
  return kits;
}

std::string StartScript(const Project& project, const KitPlan& kit) {
  std::string env_lines;
  std::set<std::string> seen;
  for (const Word& w : kit.command) {
    if (w.env.empty() || !seen.insert(w.env).second) continue;
    const std::string fallback = w.kind == Word::Kind::kLiteral ? w.value : "KIT/" + w.value;
    env_lines += "#   " + w.env + std::string(w.env.size() < 20 ? 20 - w.env.size() : 1, ' ') +
                 "default: " + fallback + "\n";
  }
  return "#!/bin/sh\n# " + kit.what + ", project " + project.name() + ": the exact\n# `cohort " +
         kit.role +
         "` command, with this kit's files found beside this script (KIT),\n"
         "# so the kit may be moved. Written by `cohort provision`; provisioning\n"
         "# again rewrites it.\n#\n"
         "# Environment, each optional:\n"
         "#   COHORT_BIN          default: cohort (on PATH)\n" +
         env_lines + "# Further arguments are passed on to `cohort " + kit.role +
         "`.\nset -eu\n"
         "KIT=$(CDPATH= cd -- \"$(dirname -- \"$0\")\" && pwd)\n"
         "exec \"${COHORT_BIN:-cohort}\"" +
         Lines(kit, " \\\n  ", ShellWord) + " \\\n  \"$@\"\n";
}

std::string SystemdUnit(const Project& project, const KitPlan& kit) {
  const std::string state_name = std::string(kStatePrefix) + kit.name;
  std::string unit = kit.unit_template;
  Replace(unit, "@EXEC_START@",
          project.systemd().binary() +
              Lines(kit, " \\\n    ", [&](const Word& w) { return UnitWord(project, kit, w); }));
  Replace(unit, "@UNIT@", kit.unit_file);
  Replace(unit, "@NAME@", kit.name);
  Replace(unit, "@ROLE@", kit.role == "worker" ? "data-parallel rank" : "site worker");
  Replace(unit, "@PROJECT@", project.name());
  Replace(unit, "@USER@", project.systemd().user());
  Replace(unit, "@KIT_DIR@", project.systemd().kit_root() + "/" + kit.name);
  Replace(unit, "@STATE_NAME@", state_name);
  Replace(unit, "@STATE_DIR@", kStateRoot + state_name);
  return unit;
}

}  // namespace cohort::provision
