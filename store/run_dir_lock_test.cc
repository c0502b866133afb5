#include "store/run_dir_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace cohort::store {
namespace {

TEST(RunDirLockTest, OneHolderAtATimeNamedByPidAndRole) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("lock-test-" + std::to_string(::getpid())))
          .string() +
      "/run";
  auto first = RunDirLock::Acquire(dir, "cohort coordinator");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(std::filesystem::is_directory(dir));  // Created.
  auto second = RunDirLock::Acquire(dir, "cohort worker rank 0");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(dir + " is in use by pid " + std::to_string(::getpid()) +
                                           " (cohort coordinator)"),
            std::string::npos)
      << second.status();
  first->reset();  // Released: the next one takes it.
  auto third = RunDirLock::Acquire(dir, "cohort worker rank 0");
  EXPECT_TRUE(third.ok()) << third.status();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

}  // namespace
}  // namespace cohort::store
