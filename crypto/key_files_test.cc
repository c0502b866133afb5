#include "crypto/key_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace cohort::crypto {
namespace {

class KeyFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cohort_key_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/allow");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(KeyFilesTest, KeyUnderTwoNamesIsRefusedNamingBothFiles) {
  ASSERT_TRUE(WriteIdentity(dir_, "alice").ok());
  std::filesystem::copy_file(dir_ + "/alice.pub", dir_ + "/allow/alice.pub");
  ASSERT_TRUE(LoadAllowlist(dir_ + "/allow").ok());
  // The coordinator would map alice's key to whichever name it read last.
  std::filesystem::copy_file(dir_ + "/alice.pub", dir_ + "/allow/bob.pub");
  auto dup = LoadAllowlist(dir_ + "/allow");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("allow/alice.pub"), std::string::npos) << dup.status();
  EXPECT_NE(dup.status().message().find("allow/bob.pub"), std::string::npos) << dup.status();
  EXPECT_NE(dup.status().message().find("same key"), std::string::npos) << dup.status();
}

TEST_F(KeyFilesTest, AllowlistIsSortedByFileName) {
  // Created neither in order nor in reverse order, so neither creation order
  // nor its reverse (what tmpfs and ext4 without an index return) is sorted.
  const std::vector<std::string> names = {"dave", "bob", "erin", "alice", "carol"};
  for (const auto& name : names) {
    ASSERT_TRUE(WriteIdentity(dir_, name).ok());
    std::filesystem::copy_file(dir_ + "/" + name + ".pub", dir_ + "/allow/" + name + ".pub");
  }
  auto list = LoadAllowlist(dir_ + "/allow");
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> loaded;
  for (const auto& entry : *list) loaded.push_back(entry.name);
  EXPECT_EQ(loaded, (std::vector<std::string>{"alice", "bob", "carol", "dave", "erin"}));
}

TEST_F(KeyFilesTest, SecretKeyFileIsCreated0600WhateverTheUmask) {
  const mode_t old = ::umask(0);
  Status written = WriteIdentity(dir_, "alice");
  ::umask(old);
  ASSERT_TRUE(written.ok()) << written;
  struct stat st = {};
  ASSERT_EQ(::stat((dir_ + "/alice.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(LoadIdentity(dir_ + "/alice.key").ok());
  // Never over an existing key, and the existing key is unchanged.
  auto before = LoadIdentity(dir_ + "/alice.key");
  EXPECT_EQ(WriteIdentity(dir_, "alice").code(), StatusCode::kAlreadyExists);
  auto after = LoadIdentity(dir_ + "/alice.key");
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_EQ(before->public_key, after->public_key);
}

TEST_F(KeyFilesTest, WhatIsNotAKeyFileIsRefusedByName) {
  ASSERT_TRUE(WriteIdentity(dir_, "alice").ok());
  // A directory.
  std::filesystem::create_directories(dir_ + "/dir.key");
  auto dir = LoadIdentity(dir_ + "/dir.key");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("dir.key: not a regular file"), std::string::npos)
      << dir.status();
  // A file far larger than a key line.
  {
    std::ofstream big(dir_ + "/big.pub");
    big << "cohort-ed25519-public " << std::string(5000, 'a') << "\n";
  }
  auto big = LoadPublicKey(dir_ + "/big.pub");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("big.pub: larger than 1024 bytes"), std::string::npos)
      << big.status();
  // The wrong tag, and a short key.
  auto swapped = LoadPublicKey(dir_ + "/alice.key");
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.status().message().find("not a cohort-ed25519-public file"), std::string::npos)
      << swapped.status();
  std::ofstream(dir_ + "/short.pub") << "cohort-ed25519-public 12ab\n";
  auto short_key = LoadPublicKey(dir_ + "/short.pub");
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("64 hex characters"), std::string::npos);
  // Missing: the reason is given.
  auto missing = LoadIdentity(dir_ + "/nobody.key");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos) << missing.status();
}

TEST_F(KeyFilesTest, TrailingTextAfterTheKeyIsIgnoredAsBefore) {
  ASSERT_TRUE(WriteIdentity(dir_, "alice").ok());
  auto pub = LoadPublicKey(dir_ + "/alice.pub");
  ASSERT_TRUE(pub.ok());
  std::string line;
  std::getline(std::ifstream(dir_ + "/alice.pub"), line);
  std::ofstream(dir_ + "/commented.pub") << "  " << line << " alice@laptop\n";
  auto commented = LoadPublicKey(dir_ + "/commented.pub");
  ASSERT_TRUE(commented.ok()) << commented.status();
  EXPECT_EQ(*commented, *pub);
}

}  // namespace
}  // namespace cohort::crypto
