#include "provision/kubernetes.h"

#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <vector>

#include "common/secret_bytes.h"
#include "provision/kit_plan.h"
#include "provision/kits.h"
#include "provision/kubernetes_templates.h"
#include "provision/project.h"

namespace cohort::provision {
namespace {

namespace fs = std::filesystem;

// Where the pods mount what a kit holds (deploy/kubernetes/base).
constexpr char kIdentityDir[] = "/etc/cohort/identity/";
constexpr char kStateDir[] = "/var/lib/cohort/";
constexpr char kDataDir[] = "/data/";
// The port the coordinator's container listens on; the project's port is
// the Service's.
constexpr uint32_t kContainerPort = 7000;
constexpr size_t kMaxKeyFile = 1024;

constexpr char kKustomization[] =
    "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n";

// Text that holds key material: joined only into a SecretBytes, so no
// std::string ever holds a private key.
class SecretText {
 public:
  void Add(std::string text) { pieces_.push_back({std::move(text), SecretBytes()}); }
  void Add(SecretBytes secret) { pieces_.push_back({"", std::move(secret)}); }
  SecretBytes Join() const {
    size_t size = 0;
    for (const Piece& p : pieces_) size += p.secret.empty() ? p.text.size() : p.secret.size();
    SecretBytes out(size);
    size_t at = 0;
    for (const Piece& p : pieces_) {
      if (!p.secret.empty()) {
        std::memcpy(out.bytes().data() + at, p.secret.bytes().data(), p.secret.size());
        at += p.secret.size();
      } else if (!p.text.empty()) {
        std::memcpy(out.bytes().data() + at, p.text.data(), p.text.size());
        at += p.text.size();
      }
    }
    return out;
  }

 private:
  struct Piece {
    std::string text;
    SecretBytes secret;
  };
  std::vector<Piece> pieces_;
};

// Base64 (standard alphabet, padded: what a Secret's `data:` takes).
SecretBytes Base64(std::span<const uint8_t> bytes) {
  const size_t size = sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  SecretBytes buffer(size);
  sodium_bin2base64(reinterpret_cast<char*>(buffer.bytes().data()), size, bytes.data(),
                    bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  SecretBytes out(size - 1);  // Without the NUL.
  std::memcpy(out.bytes().data(), buffer.bytes().data(), size - 1);
  return out;
}

// A file's bytes, read(2) straight into a SecretBytes.
StatusOr<SecretBytes> ReadSecretFile(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    return NotFoundError(path.string() + ": cannot open: " + why);
  }
  SecretBytes buffer(kMaxKeyFile + 1);
  size_t size = 0;
  while (size < buffer.size()) {
    const ssize_t n = ::read(fd, buffer.bytes().data() + size, buffer.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    size += static_cast<size_t>(n);
  }
  ::close(fd);
  if (size == 0 || size > kMaxKeyFile) {
    return FailedPreconditionError(path.string() + ": not a key file (empty, or over 1 KiB)");
  }
  SecretBytes out(size);
  std::memcpy(out.bytes().data(), buffer.bytes().data(), size);
  return out;
}

Status WriteText(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return UnavailableError(path.parent_path().string() + ": cannot create: " + ec.message());
  return WriteKitFile(path, text, 0644);
}

// A YAML double-quoted scalar (JSON's string syntax, which YAML reads).
std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

StatusOr<KitsState> ReadState(const std::string& out) {
  const fs::path path = fs::path(out) / kStateFile;
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  KitsState state;
  if (!in || !google::protobuf::TextFormat::ParseFromString(text.str(), &state) ||
      !state.has_project()) {
    return FailedPreconditionError(path.string() +
                                   ": not a kits state (run `cohort provision` "
                                   "with --project first)");
  }
  return state;
}

// Kubernetes takes lower-case names ([a-z0-9.-], starting and ending with a
// letter or digit) where the project takes more.
Status CheckKubernetesName(const std::string& what, const std::string& name) {
  const bool ok =
      !name.empty() && std::isalnum(static_cast<unsigned char>(name.front())) &&
      std::isalnum(static_cast<unsigned char>(name.back())) &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-") == std::string::npos;
  if (ok) return OkStatus();
  return InvalidArgumentError(what + " " + name +
                              ": --format kubernetes names objects after it, and Kubernetes "
                              "takes lower-case letters, digits, '-' and '.' only (starting and "
                              "ending with a letter or digit)");
}

Status CheckSupported(const Project& p) {
  for (const SiteSpec& s : p.site()) {
    COHORT_RETURN_IF_ERROR(CheckKubernetesName("site", s.name()));
    if (s.ranks() > 1) {
      return InvalidArgumentError("site " + s.name() + ": ranks " + std::to_string(s.ranks()) +
                                  ": --format kubernetes writes single-rank sites only (the "
                                  "kits are written; its site workers are not in Kubernetes)");
    }
  }
  if (p.group_size() > 0) {
    return InvalidArgumentError("group " + p.group(0).name() +
                                ": --format kubernetes writes no data-parallel groups yet (the "
                                "kits are written; deploy/kubernetes/base/pytorchjob runs one)");
  }
  return OkStatus();
}

// A kit's file as the pod sees it (deploy/kubernetes/base's mounts).
StatusOr<std::string> PodPath(const KitPlan& kit, const Word& w) {
  if (w.kind == Word::Kind::kStatePath) return kStateDir + w.value;
  if (w.kind == Word::Kind::kLiteral) {
    if (w.env == "COHORT_DATA") return kDataDir + fs::path(w.value).filename().string();
    if (w.env == "COHORT_BIND") {
      // The container's own port; the Service maps the project's onto it.
      const std::string host = w.value.substr(0, w.value.rfind(':'));
      return host + ":" + std::to_string(kContainerPort);
    }
    return w.value;
  }
  static const std::map<std::string, std::string> kMounts = {
      {"config.textproto", "/etc/cohort/config/config.textproto"},
      {"allow", "/etc/cohort/allow"},
      {"peers", "/etc/cohort/peers"},
      {"coordinator.pub", "/etc/cohort/coordinator/coordinator.pub"}};
  auto mount = kMounts.find(w.value);
  if (mount != kMounts.end()) return mount->second;
  if (w.value == kit.name + ".key") return kIdentityDir + w.value;
  return InvalidArgumentError(kit.name + ": " + w.value +
                              ": no place for it in the Kubernetes recipes");
}

// The container's args: the kit's command, one quoted word a line.
StatusOr<std::string> Args(const KitPlan& kit, const std::vector<std::string>& more,
                           const std::string& indent) {
  std::string out = indent + "args:\n";
  for (const Word& w : kit.command) {
    COHORT_ASSIGN_OR_RETURN(std::string word, PodPath(kit, w));
    out += indent + "  - " + Quoted(word) + "\n";
  }
  for (const std::string& w : more) out += indent + "  - " + Quoted(w) + "\n";
  return out;
}

// One Secret: `files` are (key, path of a file whose bytes it holds).
StatusOr<SecretText> SecretManifest(const std::string& name, const std::string& component,
                                    const std::vector<std::pair<std::string, fs::path>>& files) {
  SecretText text;
  text.Add("---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: " + name +
           "\n  labels:\n    app.kubernetes.io/name: cohort\n    app.kubernetes.io/component: " +
           component + "\ntype: Opaque\ndata:\n");
  for (const auto& [key, path] : files) {
    COHORT_ASSIGN_OR_RETURN(SecretBytes bytes, ReadSecretFile(path));
    text.Add("  " + key + ": ");
    text.Add(Base64(bytes.bytes()));
    text.Add("\n");
  }
  return text;
}

// secrets.yaml (0600): the Secrets of one participant, in order.
Status WriteSecrets(const fs::path& path, std::vector<SecretText> secrets) {
  SecretText all;
  all.Add(
      "# Written by `cohort provision --format kubernetes`: this participant's keys, as in\n"
      "# its kit. The private key makes this file a secret: keep it 0600, out of version\n"
      "# control. Provisioning again rewrites it.\n");
  for (SecretText& s : secrets) all.Add(s.Join());
  const SecretBytes bytes = all.Join();
  return WriteKitFile(
      path, {reinterpret_cast<const char*>(bytes.bytes().data()), bytes.bytes().size()}, 0600);
}

std::vector<std::pair<std::string, fs::path>> SitePubs(const fs::path& out, const Project& p) {
  std::vector<std::pair<std::string, fs::path>> files;
  for (const SiteSpec& s : p.site()) {
    files.push_back({s.name() + ".pub", out / s.name() / (s.name() + ".pub")});
  }
  return files;
}

std::vector<std::pair<std::string, fs::path>> Identity(const fs::path& out,
                                                       const std::string& kit) {
  return {{kit + ".key", out / kit / (kit + ".key")}, {kit + ".pub", out / kit / (kit + ".pub")}};
}

std::string Header(const Project& p, const std::string& what) {
  return "# Written by `cohort provision --format kubernetes` (project " + p.name() + "): " + what +
         ".\n# Provisioning again rewrites it.\n";
}

Status WriteCoordinator(const fs::path& out, const fs::path& dir, const KitsState& state,
                        const KitPlan& kit) {
  const Project& p = state.project();
  COHORT_RETURN_IF_ERROR(WriteText(dir / "config.textproto", state.coordinator_config()));
  COHORT_RETURN_IF_ERROR(WriteText(
      dir / "kustomization.yaml",
      Header(p, "the coordinator") + kKustomization +
          "bases:\n  - ../base/coordinator\nresources:\n  - secrets.yaml\n"
          "configMapGenerator:\n  - name: cohort-config\n    files:\n      - config.textproto\n"
          "patchesStrategicMerge:\n  - statefulset-patch.yaml\n"
          "patchesJson6902:\n  - target:\n      version: v1\n      kind: Service\n"
          "      name: cohort-coordinator\n    path: service-patch.yaml\n"));
  COHORT_ASSIGN_OR_RETURN(std::string args,
                          Args(kit, {"--metrics-addr", "0.0.0.0:9464"}, "          "));
  COHORT_RETURN_IF_ERROR(WriteText(
      dir / "statefulset-patch.yaml",
      Header(p, "the coordinator's command, as in its kit's start.sh") +
          "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: cohort-coordinator\n"
          "spec:\n  template:\n    spec:\n      containers:\n        - name: coordinator\n" +
          args));
  COHORT_RETURN_IF_ERROR(
      WriteText(dir / "service-patch.yaml",
                Header(p, "where the clients reach the coordinator (coordinator.port)") +
                    "- op: replace\n  path: /spec/ports/0/port\n  value: " +
                    std::to_string(p.coordinator().port()) + "\n"));
  std::vector<SecretText> secrets;
  COHORT_ASSIGN_OR_RETURN(
      secrets.emplace_back(),
      SecretManifest("cohort-coordinator-identity", "coordinator", Identity(out, kCoordinatorKit)));
  COHORT_ASSIGN_OR_RETURN(secrets.emplace_back(),
                          SecretManifest("cohort-allow", "coordinator", SitePubs(out, p)));
  return WriteSecrets(dir / "secrets.yaml", std::move(secrets));
}

std::string InstanceLabel(const std::string& site, const std::string& indent) {
  return indent + "app.kubernetes.io/instance: " + site + "\n";
}

// The client may open the coordinator's port as the project gives it (an
// address outside the cluster) and as its pod listens (through the Service).
std::string ClientEgress(const Project& p) {
  std::string ports =
      "        - protocol: TCP\n          port: " + std::to_string(p.coordinator().port()) + "\n";
  if (p.coordinator().port() != kContainerPort) {
    ports += "        - protocol: TCP\n          port: " + std::to_string(kContainerPort) + "\n";
  }
  return "  egress:\n    - ports:\n" + ports +
         "    - ports:\n        - protocol: UDP\n          port: 53\n"
         "        - protocol: TCP\n          port: 53\n";
}

Status WriteSitePatches(const fs::path& dir, const Project& p, const KitPlan& kit) {
  const std::string& site = kit.name;
  COHORT_ASSIGN_OR_RETURN(std::string args, Args(kit, {}, "          "));
  COHORT_RETURN_IF_ERROR(
      WriteText(dir / "deployment-patch.yaml",
                Header(p, "site " + site + "'s client, its command as in its kit's start.sh") +
                    "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: cohort-client\n"
                    "  labels:\n" +
                    InstanceLabel(site, "    ") + "spec:\n  selector:\n    matchLabels:\n" +
                    InstanceLabel(site, "      ") + "  template:\n    metadata:\n      labels:\n" +
                    InstanceLabel(site, "        ") +
                    "    spec:\n      containers:\n        - name: client\n" + args +
                    "      volumes:\n        - name: data\n          persistentVolumeClaim:\n"
                    "            claimName: cohort-data-" +
                    site + "\n            readOnly: true\n"));
  return WriteText(dir / "networkpolicy-patch.yaml",
                   Header(p, "site " + site + "'s client: the coordinator's port only") +
                       "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n"
                       "  name: cohort-client\n  labels:\n" +
                       InstanceLabel(site, "    ") + "spec:\n  podSelector:\n    matchLabels:\n" +
                       InstanceLabel(site, "      ") + ClientEgress(p));
}

Status WriteSite(const fs::path& out, const fs::path& dir, const Project& p, const KitPlan& kit) {
  COHORT_RETURN_IF_ERROR(WriteText(
      dir / "kustomization.yaml",
      Header(p, "site " + kit.name + "'s client") + kKustomization +
          "bases:\n  - ../base/client\nnameSuffix: -" + kit.name +
          "\nresources:\n  - secrets.yaml\n"
          "patchesStrategicMerge:\n  - deployment-patch.yaml\n  - networkpolicy-patch.yaml\n"));
  COHORT_RETURN_IF_ERROR(WriteSitePatches(dir, p, kit));
  std::vector<SecretText> secrets;
  COHORT_ASSIGN_OR_RETURN(secrets.emplace_back(), SecretManifest("cohort-client-identity", "client",
                                                                 Identity(out, kit.name)));
  COHORT_ASSIGN_OR_RETURN(
      secrets.emplace_back(),
      SecretManifest("cohort-coordinator-key", "client",
                     {{"coordinator.pub", out / kCoordinatorKit / "coordinator.pub"}}));
  COHORT_ASSIGN_OR_RETURN(secrets.emplace_back(),
                          SecretManifest("cohort-peers", "client", SitePubs(out, p)));
  return WriteSecrets(dir / "secrets.yaml", std::move(secrets));
}

Status WriteBase(const fs::path& dir) {
  COHORT_RETURN_IF_ERROR(
      WriteText(dir / "coordinator/kustomization.yaml", kKubernetesCoordinatorKustomization));
  COHORT_RETURN_IF_ERROR(WriteText(dir / "coordinator/coordinator.yaml", kKubernetesCoordinator));
  COHORT_RETURN_IF_ERROR(
      WriteText(dir / "client/kustomization.yaml", kKubernetesClientKustomization));
  return WriteText(dir / "client/client.yaml", kKubernetesClient);
}

}  // namespace

Status WriteKubernetes(const std::string& out) {
  COHORT_ASSIGN_OR_RETURN(KitsState state, ReadState(out));
  const Project& p = state.project();
  COHORT_RETURN_IF_ERROR(CheckSupported(p));
  // Written whole into a fresh folder, then swapped in: a revoked site's
  // overlay (and its keys) never survives, and a failure leaves the last one.
  const fs::path root = fs::path(out) / kKubernetesDir;
  const fs::path next = fs::path(out) / (std::string(kKubernetesDir) + ".new");
  std::error_code ec;
  fs::remove_all(next, ec);
  if (::mkdir(next.c_str(), 0700) != 0) {
    const std::string why = std::strerror(errno);
    return UnavailableError(next.string() + ": cannot create: " + why);
  }
  COHORT_RETURN_IF_ERROR(WriteBase(next / "base"));
  std::string everyone = "bases:\n";
  for (const KitPlan& kit : PlanKits(state)) {
    if (kit.role == "coordinator") {
      COHORT_RETURN_IF_ERROR(WriteCoordinator(out, next / kit.name, state, kit));
    } else {
      COHORT_RETURN_IF_ERROR(WriteSite(out, next / kit.name, p, kit));
    }
    everyone += "  - " + kit.name + "\n";
  }
  COHORT_RETURN_IF_ERROR(
      WriteText(next / "kustomization.yaml",
                Header(p,
                       "every participant, in one namespace (each site's overlay alone "
                       "is what goes to its cluster)") +
                    kKustomization + everyone));
  fs::remove_all(root, ec);
  fs::rename(next, root, ec);
  if (ec) return UnavailableError(root.string() + ": cannot replace: " + ec.message());
  return OkStatus();
}

bool HasKubernetes(const std::string& out) {
  std::error_code ec;
  return fs::is_directory(fs::path(out) / kKubernetesDir, ec);
}

}  // namespace cohort::provision
