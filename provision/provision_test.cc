#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "crypto/key_files.h"
#include "provision/kit_plan.h"
#include "provision/kits.h"
#include "provision/project.h"

namespace cohort::provision {
namespace {

namespace fs = std::filesystem;

constexpr char kRunConfig[] =
    "name: \"t\"\nmodel { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
    "rounds { num_rounds: 2 min_clients: 3 }\n";

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void Write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

mode_t Mode(const fs::path& path) {
  struct stat st = {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Every file under `root` (relative path -> bytes).
std::map<std::string, std::string> Snapshot(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), root).string()] = Read(e.path());
  }
  return files;
}

// The names in a .tar.gz, in order, with their modes.
std::vector<std::pair<std::string, int>> TarEntries(const fs::path& path) {
  std::vector<std::pair<std::string, int>> out;
  archive* a = archive_read_new();
  archive_read_support_filter_gzip(a);
  archive_read_support_format_tar(a);
  EXPECT_EQ(archive_read_open_filename(a, path.c_str(), 1 << 16), ARCHIVE_OK);
  archive_entry* e = nullptr;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    out.emplace_back(archive_entry_pathname(e), archive_entry_perm(e));
  }
  archive_read_free(a);
  return out;
}

class ProvisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cohort-provision-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Write(dir_ / "run.textproto", kRunConfig);
    WriteProject({"a", "b", "c"});
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteProject(const std::vector<std::string>& sites, const std::string& more = "") {
    std::string text =
        "name: \"p\"\ncoordinator { host: \"10.0.0.1\" port: 7100 config_file: "
        "\"run.textproto\" }\n";
    for (const auto& s : sites)
      text += "site { name: \"" + s + "\" data: \"/d/" + s + ".shard\" }\n";
    Write(dir_ / "project.textproto", text + more);
  }

  StatusOr<ProvisionReport> Run(ProvisionRequest r = {}) {
    if (r.add_site.empty() && r.revoke.empty()) r.project = (dir_ / "project.textproto").string();
    r.out = (dir_ / "kits").string();
    return Provision(r);
  }

  fs::path kits() const { return dir_ / "kits"; }

  fs::path dir_;
};

TEST(ProjectTest, ATypoNamesTheLineAndColumn) {
  auto p = ParseProject("coordinator {\n  hots: \"x\"\n}\n", "project.textproto");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("project.textproto: line 2, column 7"), std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("hots"), std::string::npos) << p.status().message();
}

TEST(ProjectTest, BadFieldsAreNamed) {
  const std::string head = "coordinator { host: \"h\" config {} }\n";
  const std::pair<std::string, std::string> cases[] = {
      {head + "site { name: \"a\" } site { name: \"a\" }",
       "site[1].name: kit name \"a\" is also site[0].name's"},
      {head + "site { name: \"coordinator\" }", "is also the coordinator's"},
      {head + "site { name: \"-x\" }", "site[0].name: \"-x\" is not a name"},
      {head, "site: the project lists no site"},
      {"coordinator { host: \"h\" } site { name: \"a\" }",
       "coordinator: set config_file or config"},
      {"coordinator { host: \"h\" port: 0 config {} } site { name: \"a\" }",
       "coordinator.port: must be in [1, 65535], got 0"},
      {head + "site { name: \"a\" data: \"x$y\" }", "site[0].data: \"x$y\" holds a character"},
      {head + "site { name: \"a\" ranks: 2 }", "site[0].site_host: missing"},
      {head + "site { name: \"a\" } systemd { kit_root: \"etc\" }",
       "systemd.kit_root: \"etc\" must be an absolute path"},
  };
  for (const auto& [text, want] : cases) {
    auto p = ParseProject(text, "p");
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_NE(p.status().message().find(want), std::string::npos)
        << text << "\n  got: " << p.status().message();
  }
}

TEST_F(ProvisionTest, KitsHoldKeysAllowlistsAndTheCommand) {
  auto report = Run();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->kits.size(), 4u);
  EXPECT_TRUE(report->kits[1].new_key);
  EXPECT_EQ(Mode(kits()), 0700u);
  for (const std::string name : {"coordinator", "a", "b", "c"}) {
    EXPECT_EQ(Mode(kits() / name), 0700u) << name;
    EXPECT_EQ(Mode(kits() / name / (name + ".key")), 0600u) << name;
    EXPECT_EQ(Mode(kits() / (name + ".tar.gz")), 0600u) << name;
    EXPECT_EQ(Mode(kits() / name / "start.sh"), 0755u) << name;
    EXPECT_EQ(Read(kits() / name / "config.textproto"), kRunConfig) << name;
  }
  // The coordinator admits the three sites; each site checks cohorts
  // against the same three and pins the coordinator's key.
  for (const fs::path& dir : {kits() / "coordinator/allow", kits() / "b/peers"}) {
    auto list = crypto::LoadAllowlist(dir.string());
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    ASSERT_EQ(list->size(), 3u);
    EXPECT_EQ((*list)[2].name, "c");
    EXPECT_EQ(Read(dir / "c.pub"), Read(kits() / "c/c.pub"));
  }
  EXPECT_EQ(Read(kits() / "a/coordinator.pub"), Read(kits() / "coordinator/coordinator.pub"));
  const std::string start = Read(kits() / "a/start.sh");
  EXPECT_NE(start.find("exec \"${COHORT_BIN:-cohort}\" client \\\n"
                       "  --coordinator \"${COHORT_COORDINATOR:-tcp://10.0.0.1:7100}\" \\\n"
                       "  --data \"${COHORT_DATA:-/d/a.shard}\" \\\n"
                       "  --identity \"$KIT/a.key\" \\\n"
                       "  --coordinator-key \"$KIT/coordinator.pub\" \\\n"
                       "  --peers \"$KIT/peers\" \\\n  \"$@\"\n"),
            std::string::npos)
      << start;
  const std::string unit = Read(kits() / "coordinator/cohort-coordinator.service");
  EXPECT_NE(unit.find("ExecStart=/usr/local/bin/cohort coordinator \\\n"
                      "    --config /etc/cohort/coordinator/config.textproto \\\n"
                      "    --run-dir /var/lib/cohort/coordinator/run \\\n"
                      "    --bind tcp://*:7100 \\\n"),
            std::string::npos)
      << unit;
  EXPECT_EQ(unit.find('@'), unit.find("@system-service")) << "a placeholder left:\n" << unit;
}

TEST_F(ProvisionTest, TarballsHoldTheKitUnderItsName) {
  ASSERT_TRUE(Run().ok());
  const auto entries = TarEntries(kits() / "b.tar.gz");
  ASSERT_GE(entries.size(), 9u);
  EXPECT_EQ(entries[0], std::make_pair(std::string("b/"), 0700));
  EXPECT_EQ(entries[1], std::make_pair(std::string("b/b.key"), 0600));
  EXPECT_EQ(entries[4], std::make_pair(std::string("b/start.sh"), 0755));
  EXPECT_EQ(entries.back(), std::make_pair(std::string("b/peers/c.pub"), 0644));
  // No time in the gzip header (bytes 4-7), so a later run writes the same.
  const std::string gz = Read(kits() / "b.tar.gz");
  ASSERT_GT(gz.size(), 10u);
  EXPECT_EQ(gz.substr(0, 2), "\x1f\x8b");
  EXPECT_EQ(gz.substr(4, 4), std::string(4, '\0'));
}

TEST_F(ProvisionTest, ProvisioningAgainWritesTheSameBytes) {
  ASSERT_TRUE(Run().ok());
  const auto first = Snapshot(kits());
  auto again = Run();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->kits[0].new_key);
  EXPECT_EQ(Snapshot(kits()), first);  // Keys, public files and tarballs.
}

TEST_F(ProvisionTest, AddSiteKeepsEveryKeyAndRevokeDropsOne) {
  ASSERT_TRUE(Run().ok());
  const auto before = Snapshot(kits());
  ProvisionRequest add;
  add.add_site = "d";
  auto added = Run(add);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  for (const std::string name : {"coordinator", "a", "b", "c"}) {
    EXPECT_EQ(Read(kits() / name / (name + ".key")), before.at(name + "/" + name + ".key"));
  }
  EXPECT_TRUE(fs::exists(kits() / "coordinator/allow/d.pub"));
  EXPECT_TRUE(fs::exists(kits() / "a/peers/d.pub"));
  EXPECT_NE(Read(kits() / "d/start.sh").find("COHORT_DATA:-train.shard"), std::string::npos);

  ProvisionRequest revoke;
  revoke.revoke = "b";
  auto revoked = Run(revoke);
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(revoked->removed, std::vector<std::string>{"b"});
  EXPECT_FALSE(fs::exists(kits() / "b"));
  EXPECT_FALSE(fs::exists(kits() / "b.tar.gz"));
  EXPECT_FALSE(fs::exists(kits() / "coordinator/allow/b.pub"));
  EXPECT_FALSE(fs::exists(kits() / "d/peers/b.pub"));
  EXPECT_EQ(Read(kits() / "a/a.key"), before.at("a/a.key"));

  // The original project still lists b: provisioning it again is refused.
  auto again = Run();
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("site b was revoked"), std::string::npos)
      << again.status().message();
}

TEST_F(ProvisionTest, RequestsThatCannotBeMetSaySo) {
  ASSERT_TRUE(Run().ok());
  ProvisionRequest revoke;
  revoke.revoke = "zz";
  auto unknown = Run(revoke);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("has no site of that name (its sites: a, b, c)"),
            std::string::npos)
      << unknown.status().message();

  ProvisionRequest add;
  add.add_site = "a";
  auto taken = Run(add);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("already holds a kit of that name"), std::string::npos);

  WriteProject({"a", "b"});  // c dropped without a revoke.
  auto dropped = Run();
  ASSERT_FALSE(dropped.ok());
  EXPECT_NE(dropped.status().message().find("no longer plans: c"), std::string::npos)
      << dropped.status().message();

  WriteProject({"a", "b", "c"});
  fs::remove(kits() / "b/b.key");
  auto lost = Run();
  ASSERT_FALSE(lost.ok());
  EXPECT_NE(lost.status().message().find("b.key: missing, and b was provisioned before"),
            std::string::npos)
      << lost.status().message();
}

TEST_F(ProvisionTest, AnOutThatIsNotAKitsFolderIsRefused) {
  fs::create_directories(kits());
  Write(kits() / "notes.txt", "mine");
  auto r = Run();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("exists and is not a kits folder (no kits.textproto)"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(Read(kits() / "notes.txt"), "mine");
}

TEST_F(ProvisionTest, SiteRanksAndGroupsGetKitsOfTheirOwn) {
  WriteProject({"a", "b"},
               "site { name: \"s\" ranks: 2 site_host: \"10.0.1.1\" rank_host: \"10.0.1.2\" }\n"
               "group { name: \"g\" ranks: 2 master_host: \"10.0.2.1\" config { mode: "
               "DATA_PARALLEL data { train_shard: \"t.shard\" } model { arch: \"mlp\" input_dim: 4 "
               "num_classes: 2 hidden: 4 } } }\n");
  auto report = Run();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::vector<std::string> names;
  for (const auto& k : report->kits) names.push_back(k.name);
  EXPECT_EQ(names, (std::vector<std::string>{"coordinator", "a", "b", "s", "s-rank-1", "g-rank-0",
                                             "g-rank-1"}));
  EXPECT_EQ(Read(kits() / "s-rank-1/master.pub"), Read(kits() / "s/s.pub"));
  EXPECT_TRUE(fs::exists(kits() / "s/site-allow/s-rank-1.pub"));
  EXPECT_NE(Read(kits() / "s-rank-1/start.sh").find("--host \"${COHORT_HOST:-10.0.1.2}\""),
            std::string::npos);
  EXPECT_EQ(Read(kits() / "g-rank-1/master.pub"), Read(kits() / "g-rank-0/g-rank-0.pub"));
  EXPECT_NE(Read(kits() / "g-rank-1/start.sh").find("--world-size 2"), std::string::npos);
  EXPECT_NE(Read(kits() / "g-rank-0/config.textproto").find("DATA_PARALLEL"), std::string::npos);
  // Only sites are in the federation's allowlist.
  EXPECT_EQ(crypto::LoadAllowlist((kits() / "coordinator/allow").string())->size(), 3u);
}

TEST(ProjectExampleTest, TheExampleProjectLoads) {
  const char* deploy = std::getenv("COHORT_DEPLOY");
  if (deploy == nullptr) GTEST_SKIP() << "COHORT_DEPLOY not set (run through meson test)";
  auto state = LoadProject(std::string(deploy) + "/project.textproto");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(KitNames(state->project()),
            (std::vector<std::string>{"coordinator", "hospital-a", "hospital-b", "hospital-c",
                                      "hospital-c-rank-1"}));
}

}  // namespace
}  // namespace cohort::provision
