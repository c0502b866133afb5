#include "provision/kubernetes.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "provision/kits.h"

namespace cohort::provision {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void Write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::map<std::string, std::string> Snapshot(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), root).string()] = Read(e.path());
  }
  return files;
}

std::string Base64(const std::string& text) {
  std::string out(sodium_base64_ENCODED_LEN(text.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(text.data()),
                    text.size(), sodium_base64_VARIANT_ORIGINAL);
  out.pop_back();
  return out;
}

class KubernetesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cohort-kubernetes-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    WriteProject(
        "site { name: \"a\" data: \"/srv/a.shard\" }\nsite { name: \"b\" }\n"
        "site { name: \"c\" }\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteProject(const std::string& sites) {
    Write(dir_ / "project.textproto",
          "name: \"p\"\ncoordinator { host: \"coord.example\" port: 7100 config {\n"
          "  name: \"t\" model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
          "  rounds { num_rounds: 2 min_clients: 3 } } }\n" +
              sites + "client_args: \"--corrupt-fraction\"\nclient_args: \"0\"\n");
  }

  void Provision(ProvisionRequest r = {}) {
    if (r.add_site.empty() && r.revoke.empty()) r.project = (dir_ / "project.textproto").string();
    r.out = out().string();
    ASSERT_TRUE(provision::Provision(r).ok());
    const Status s = WriteKubernetes(r.out);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  fs::path out() const { return dir_ / "kits"; }
  fs::path k8s() const { return out() / kKubernetesDir; }

  fs::path dir_;
};

TEST_F(KubernetesTest, SecretsHoldTheKitsKeysBase64AndAre0600) {
  Provision();
  const std::string secrets = Read(k8s() / "a/secrets.yaml");
  EXPECT_NE(secrets.find("  a.key: " + Base64(Read(out() / "a/a.key")) + "\n"), std::string::npos)
      << secrets;
  EXPECT_NE(
      secrets.find("  coordinator.pub: " + Base64(Read(out() / "coordinator/coordinator.pub"))),
      std::string::npos);
  for (const char* peer : {"a", "b", "c"}) {
    const std::string pub = Base64(Read(out() / peer / (std::string(peer) + ".pub")));
    EXPECT_NE(secrets.find(std::string("  ") + peer + ".pub: " + pub), std::string::npos) << peer;
  }
  // A site's overlay holds no other site's private key.
  EXPECT_EQ(secrets.find(Base64(Read(out() / "b/b.key"))), std::string::npos);
  struct stat st = {};
  ASSERT_EQ(::stat((k8s() / "a/secrets.yaml").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string coordinator = Read(k8s() / "coordinator/secrets.yaml");
  EXPECT_NE(
      coordinator.find("  coordinator.key: " + Base64(Read(out() / "coordinator/coordinator.key"))),
      std::string::npos);
}

TEST_F(KubernetesTest, CommandsAreTheKitsWithThePodsPaths) {
  Provision();
  const std::string client = Read(k8s() / "a/deployment-patch.yaml");
  for (const char* word :
       {"\"client\"", "\"--coordinator\"", "\"tcp://coord.example:7100\"", "\"/data/a.shard\"",
        "\"/etc/cohort/identity/a.key\"", "\"/etc/cohort/coordinator/coordinator.pub\"",
        "\"/etc/cohort/peers\"", "\"--corrupt-fraction\"", "claimName: cohort-data-a"}) {
    EXPECT_NE(client.find(word), std::string::npos) << word << "\n" << client;
  }
  const std::string coordinator = Read(k8s() / "coordinator/statefulset-patch.yaml");
  for (const char* word : {"\"tcp://*:7000\"", "\"/var/lib/cohort/run\"",
                           "\"/etc/cohort/config/config.textproto\"", "\"/etc/cohort/allow\""}) {
    EXPECT_NE(coordinator.find(word), std::string::npos) << word << "\n" << coordinator;
  }
  EXPECT_NE(Read(k8s() / "coordinator/service-patch.yaml").find("value: 7100"), std::string::npos);
  EXPECT_EQ(Read(k8s() / "coordinator/config.textproto"),
            Read(out() / "coordinator/config.textproto"));
  EXPECT_NE(Read(k8s() / "kustomization.yaml").find("  - coordinator\n  - a\n  - b\n  - c\n"),
            std::string::npos);
}

TEST_F(KubernetesTest, ProvisioningTwiceWritesTheSameBytes) {
  Provision();
  const auto first = Snapshot(k8s());
  Provision();
  EXPECT_EQ(Snapshot(k8s()), first);
}

TEST_F(KubernetesTest, ARevokedSitesOverlayGoes) {
  Provision();
  ASSERT_TRUE(fs::exists(k8s() / "c/secrets.yaml"));
  ProvisionRequest revoke;
  revoke.revoke = "c";
  Provision(revoke);
  EXPECT_FALSE(fs::exists(k8s() / "c"));
  EXPECT_EQ(Read(k8s() / "coordinator/secrets.yaml").find("c.pub"), std::string::npos);
  EXPECT_EQ(Read(k8s() / "kustomization.yaml").find("  - c\n"), std::string::npos);
}

TEST_F(KubernetesTest, RefusesWhatItCannotWriteNamingIt) {
  WriteProject("site { name: \"Upper\" }\nsite { name: \"b\" }\n");
  ProvisionRequest r;
  r.project = (dir_ / "project.textproto").string();
  r.out = out().string();
  ASSERT_TRUE(provision::Provision(r).ok());
  Status s = WriteKubernetes(r.out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("site Upper: --format kubernetes"), std::string::npos) << s.message();

  fs::remove_all(out());
  WriteProject("site { name: \"a\" }\nsite { name: \"b\" ranks: 2 site_host: \"10.0.0.2\" }\n");
  ASSERT_TRUE(provision::Provision(r).ok());
  s = WriteKubernetes(r.out);
  EXPECT_NE(s.message().find("site b: ranks 2"), std::string::npos) << s.message();
  EXPECT_FALSE(HasKubernetes(r.out));

  const Status none = WriteKubernetes((dir_ / "nothing").string());
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
}

// The README's command: deploy/kubernetes/project.textproto gives every
// overlay; deploy/project.textproto, with its data-parallel site, is
// refused by name.
TEST_F(KubernetesTest, TheExampleProjectsAreProvisionedOrRefusedAsTheReadmeSays) {
  const char* deploy = std::getenv("COHORT_DEPLOY");
  if (deploy == nullptr) GTEST_SKIP() << "COHORT_DEPLOY not set (run through meson test)";
  ProvisionRequest r;
  r.project = std::string(deploy) + "/kubernetes/project.textproto";
  r.out = out().string();
  ASSERT_TRUE(provision::Provision(r).ok());
  const Status s = WriteKubernetes(r.out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const char* overlay : {"base/coordinator", "base/client", "coordinator", "hospital-a",
                              "hospital-b", "hospital-c"}) {
    EXPECT_TRUE(fs::exists(k8s() / overlay / "kustomization.yaml")) << overlay;
  }
  EXPECT_NE(Read(k8s() / "hospital-a/kustomization.yaml").find("hospital-a"), std::string::npos);
  r.project = std::string(deploy) + "/project.textproto";
  r.out = (dir_ / "kits-dp").string();
  ASSERT_TRUE(provision::Provision(r).ok());
  const Status refused = WriteKubernetes(r.out);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("site hospital-c: ranks 2: --format kubernetes writes "
                                   "single-rank sites only"),
            std::string::npos)
      << refused.ToString();
}

}  // namespace
}  // namespace cohort::provision
