#include "provision/kits.h"

#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "crypto/key_files.h"
#include "provision/kit_plan.h"
#include "provision/project.h"
#include "provision/tarball.h"

namespace cohort::provision {
namespace {

namespace fs = std::filesystem;

// Folders and single key files a kit may hold; those its plan does not name
// (any more) are removed, so a kit never keeps a stale allowlist.
constexpr const char* kKeyDirs[] = {"allow", "peers", "site-allow"};
constexpr const char* kKeyCopies[] = {"coordinator.pub", "master.pub"};

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

Status MakeDir(const fs::path& dir, mode_t mode) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || ::chmod(dir.c_str(), mode) != 0) {
    return UnavailableError(dir.string() + ": cannot create folder" +
                            (ec ? ": " + ec.message() : ""));
  }
  return OkStatus();
}

// The state OUT holds: none for a new or empty folder. Creates OUT (0700).
StatusOr<std::optional<KitsState>> OpenKitsDir(const std::string& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) {
    COHORT_RETURN_IF_ERROR(MakeDir(out, 0700));
    return std::optional<KitsState>();
  }
  if (!fs::is_directory(out, ec)) {
    return FailedPreconditionError("--out " + out + ": exists and is not a folder");
  }
  const fs::path state_path = fs::path(out) / kStateFile;
  if (!fs::exists(state_path, ec)) {
    if (!fs::is_empty(out, ec)) {
      return FailedPreconditionError("--out " + out + ": exists and is not a kits folder (no " +
                                     kStateFile + "); give a new or an empty folder");
    }
    COHORT_RETURN_IF_ERROR(MakeDir(out, 0700));
    return std::optional<KitsState>();
  }
  std::ifstream in(state_path);
  std::ostringstream text;
  text << in.rdbuf();
  KitsState state;
  if (!in || !google::protobuf::TextFormat::ParseFromString(text.str(), &state) ||
      state.format() != 1) {
    return FailedPreconditionError(state_path.string() +
                                   ": not a kits state this cohort can read (written by "
                                   "`cohort provision`, format 1)");
  }
  return std::optional<KitsState>(std::move(state));
}

std::vector<std::string> SiteNames(const Project& project) {
  std::vector<std::string> names;
  for (const SiteSpec& s : project.site()) names.push_back(s.name());
  return names;
}

StatusOr<KitsState> AddSite(const ProvisionRequest& r, KitsState state) {
  COHORT_RETURN_IF_ERROR(CheckName("--add-site", r.add_site));
  const std::vector<std::string> kits = KitNames(state.project());
  if (std::find(kits.begin(), kits.end(), r.add_site) != kits.end()) {
    return InvalidArgumentError("--add-site " + r.add_site + ": " + r.out +
                                " already holds a kit of that name");
  }
  auto& revoked = *state.mutable_revoked();
  revoked.erase(std::remove(revoked.begin(), revoked.end(), r.add_site), revoked.end());
  SiteSpec* site = state.mutable_project()->add_site();
  site->set_name(r.add_site);
  if (!r.add_site_data.empty()) site->set_data(r.add_site_data);
  COHORT_RETURN_IF_ERROR(CheckProject(state.project()).WithContext("--add-site " + r.add_site));
  return state;
}

StatusOr<KitsState> RevokeSite(const ProvisionRequest& r, KitsState state) {
  const auto& revoked = state.revoked();
  if (std::find(revoked.begin(), revoked.end(), r.revoke) != revoked.end()) {
    return InvalidArgumentError("--revoke " + r.revoke + ": was revoked already");
  }
  auto* sites = state.mutable_project()->mutable_site();
  auto it = std::find_if(sites->begin(), sites->end(),
                         [&r](const SiteSpec& s) { return s.name() == r.revoke; });
  if (it == sites->end()) {
    return InvalidArgumentError(
        "--revoke " + r.revoke + ": " + r.out +
        " has no site of that name (its sites: " + Join(SiteNames(state.project())) + ")");
  }
  if (sites->size() == 1) {
    return InvalidArgumentError("--revoke " + r.revoke + ": the last site of " + r.out +
                                "; a federation needs one");
  }
  sites->erase(it);
  state.add_revoked(r.revoke);
  return state;
}

// The whole project again: keys kept, revoked sites stay out.
StatusOr<KitsState> Reprovision(const ProvisionRequest& r, const std::optional<KitsState>& old) {
  COHORT_ASSIGN_OR_RETURN(KitsState next, LoadProject(r.project));
  if (!old) return next;
  *next.mutable_revoked() = old->revoked();
  for (const SiteSpec& s : next.project().site()) {
    const auto& revoked = old->revoked();
    if (std::find(revoked.begin(), revoked.end(), s.name()) != revoked.end()) {
      return FailedPreconditionError(r.project + ": site " + s.name() + " was revoked (" + r.out +
                                     "/" + kStateFile +
                                     "): take it out of the project, or --add-site " + s.name() +
                                     " to admit it again with a new key");
    }
  }
  return next;
}

StatusOr<KitsState> NextState(const ProvisionRequest& r, const std::optional<KitsState>& old) {
  if (r.add_site.empty() && r.revoke.empty()) return Reprovision(r, old);
  if (!old || !old->has_project()) {
    return FailedPreconditionError(std::string(r.add_site.empty() ? "--revoke" : "--add-site") +
                                   ": " + r.out +
                                   " holds no kits yet; provision a project "
                                   "first (--project)");
  }
  return r.add_site.empty() ? RevokeSite(r, *old) : AddSite(r, *old);
}

// The kits OUT held before that `next` no longer plans: only a revoke may
// drop kits (its site's), so an edited project never silently re-keys.
StatusOr<std::vector<std::string>> DroppedKits(const ProvisionRequest& r,
                                               const std::optional<KitsState>& old,
                                               const KitsState& next) {
  if (!old || !old->has_project()) return std::vector<std::string>();
  const std::vector<std::string> now = KitNames(next.project());
  std::vector<std::string> dropped, unexpected;
  for (const std::string& name : KitNames(old->project())) {
    if (std::find(now.begin(), now.end(), name) != now.end()) continue;
    dropped.push_back(name);
    const bool revoked =
        !r.revoke.empty() && (name == r.revoke || name.rfind(r.revoke + "-rank-", 0) == 0);
    if (!revoked) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    return FailedPreconditionError(r.out +
                                   " holds kits the project no longer plans: " + Join(unexpected) +
                                   ". Put them back in the project, or --revoke their site");
  }
  return dropped;
}

// NAME.key kept when there is one (its .pub rewritten from it), else made.
// Returns the .pub text; `made` says which.
StatusOr<std::string> EnsureKey(const fs::path& dir, const std::string& name, bool before,
                                bool& made) {
  COHORT_RETURN_IF_ERROR(MakeDir(dir, 0700));
  const fs::path key = dir / (name + ".key");
  std::error_code ec;
  made = !fs::exists(key, ec);
  if (made && before) {
    return FailedPreconditionError(key.string() + ": missing, and " + name +
                                   " was provisioned before: restore its kit (its key must "
                                   "not change), or revoke it and add it again");
  }
  if (made) COHORT_RETURN_IF_ERROR(crypto::WriteIdentity(dir.string(), name));
  COHORT_ASSIGN_OR_RETURN(crypto::Ed25519KeyPair identity, crypto::LoadIdentity(key.string()));
  const std::string pub = crypto::PublicKeyText(identity.public_key);
  COHORT_RETURN_IF_ERROR(WriteKitFile(dir / (name + ".pub"), pub, 0644));
  return pub;
}

// DIR/sub/ holds exactly the .pub files of `names`. Returns the tarball's
// entries (the folder, then its files).
StatusOr<std::vector<std::string>> SyncKeyDir(const fs::path& dir, const std::string& sub,
                                              const std::vector<std::string>& names,
                                              const std::map<std::string, std::string>& pubs) {
  COHORT_RETURN_IF_ERROR(MakeDir(dir / sub, 0755));
  std::set<std::string> wanted;
  for (const auto& n : names) wanted.insert(n + ".pub");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir / sub, ec)) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() == ".pub" && !wanted.count(file)) fs::remove(entry.path(), ec);
  }
  std::vector<std::string> entries = {sub};
  for (const std::string& file : wanted) {  // Sorted: the tarball's order.
    const std::string name = file.substr(0, file.size() - 4);
    COHORT_RETURN_IF_ERROR(WriteKitFile(dir / sub / file, pubs.at(name), 0644));
    entries.push_back(sub + "/" + file);
  }
  return entries;
}

// The public keys a kit needs, stale ones removed. Returns tarball entries.
StatusOr<std::vector<std::string>> WriteKitKeys(const fs::path& dir, const KitPlan& kit,
                                                const std::map<std::string, std::string>& pubs) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (const char* file : kKeyCopies) {
    auto copy = kit.key_copies.find(file);
    if (copy == kit.key_copies.end()) {
      // The coordinator's own key is its coordinator.pub.
      if (file != kit.name + ".pub") fs::remove(dir / file, ec);
      continue;
    }
    COHORT_RETURN_IF_ERROR(WriteKitFile(dir / file, pubs.at(copy->second), 0644));
    entries.push_back(file);
  }
  for (const char* sub : kKeyDirs) {
    auto names = kit.key_dirs.find(sub);
    if (names == kit.key_dirs.end()) {
      fs::remove_all(dir / sub, ec);
      continue;
    }
    COHORT_ASSIGN_OR_RETURN(auto more, SyncKeyDir(dir, sub, names->second, pubs));
    entries.insert(entries.end(), more.begin(), more.end());
  }
  return entries;
}

Status WriteKit(const fs::path& out, const Project& project, const KitPlan& kit,
                const std::map<std::string, std::string>& pubs) {
  const fs::path dir = out / kit.name;
  std::vector<std::string> entries = {kit.name + ".key", kit.name + ".pub"};
  COHORT_ASSIGN_OR_RETURN(auto keys, WriteKitKeys(dir, kit, pubs));
  COHORT_RETURN_IF_ERROR(WriteKitFile(dir / "config.textproto", kit.config_text, 0644));
  COHORT_RETURN_IF_ERROR(WriteKitFile(dir / "start.sh", StartScript(project, kit), 0755));
  COHORT_RETURN_IF_ERROR(WriteKitFile(dir / kit.unit_file, SystemdUnit(project, kit), 0644));
  entries.insert(entries.end(), {"config.textproto", "start.sh", kit.unit_file});
  entries.insert(entries.end(), keys.begin(), keys.end());
  return WriteTarball(dir.string(), kit.name, entries, (out / (kit.name + ".tar.gz")).string());
}

Status WriteState(const fs::path& out, const KitsState& state) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(state, &text)) {
    return InternalError("cannot render the kits state");
  }
  return WriteKitFile(out / kStateFile,
                      "# Written by `cohort provision`: what this kits folder holds. Not for "
                      "editing by hand.\n" +
                          text,
                      0600);
}

}  // namespace

StatusOr<ProvisionReport> Provision(const ProvisionRequest& r) {
  COHORT_ASSIGN_OR_RETURN(std::optional<KitsState> old, OpenKitsDir(r.out));
  COHORT_ASSIGN_OR_RETURN(KitsState next, NextState(r, old));
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> dropped, DroppedKits(r, old, next));
  const fs::path out = r.out;
  // From here on OUT is a kits folder, even if a later step fails.
  if (!old)
    COHORT_RETURN_IF_ERROR(WriteState(out, [] {
      KitsState marker;
      marker.set_format(1);
      return marker;
    }()));
  std::set<std::string> before;
  if (old && old->has_project()) {
    for (const auto& n : KitNames(old->project())) before.insert(n);
  }
  const std::vector<KitPlan> kits = PlanKits(next);
  ProvisionReport report;
  std::map<std::string, std::string> pubs;
  for (const KitPlan& kit : kits) {
    KitReport k{kit.name, false};
    COHORT_ASSIGN_OR_RETURN(
        pubs[kit.name], EnsureKey(out / kit.name, kit.name, before.count(kit.name) > 0, k.new_key));
    report.kits.push_back(k);
  }
  for (const KitPlan& kit : kits) {
    COHORT_RETURN_IF_ERROR(WriteKit(out, next.project(), kit, pubs));
  }
  COHORT_RETURN_IF_ERROR(WriteState(out, next));
  std::error_code ec;
  for (const std::string& name : dropped) {
    fs::remove_all(out / name, ec);
    fs::remove(out / (name + ".tar.gz"), ec);
    report.removed.push_back(name);
  }
  return report;
}

Status WriteKitFile(const fs::path& path, std::string_view bytes, mode_t mode) {
  const std::string tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    return UnavailableError(tmp + ": cannot create: " + why);
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const bool ok = written == bytes.size() && ::fchmod(fd, mode) == 0;
  ::close(fd);
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    ::unlink(tmp.c_str());
    return UnavailableError(path.string() + ": cannot write" + (ec ? ": " + ec.message() : ""));
  }
  return OkStatus();
}

}  // namespace cohort::provision
