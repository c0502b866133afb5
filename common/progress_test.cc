#include "common/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace cohort {
namespace {

// What a Progress wrote, read back from a temporary file (not a terminal).
class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override { file_ = std::tmpfile(); }
  void TearDown() override { std::fclose(file_); }
  std::string Written() {
    std::fflush(file_);
    std::rewind(file_);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), file_)) > 0) s.append(buf, n);
    return s;
  }
  static size_t Count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  }
  // A clock the test moves by hand.
  Progress::Options Opts(Progress::Mode mode) {
    Progress::Options o;
    o.unit = "rows";
    o.mode = mode;
    o.clock = [this] { return now_; };
    return o;
  }

  FILE* file_ = nullptr;
  double now_ = 100.0;
};

TEST_F(ProgressTest, AFileGetsPlainLinesEveryTenPercentAndADoneLine) {
  EXPECT_EQ(Progress::AutoMode(file_), Progress::Mode::kLines);
  Progress p("reading x.csv", 1000, file_, Opts(Progress::Mode::kAuto));
  for (uint64_t i = 1; i <= 1000; ++i) {
    now_ += 0.01;
    p.Update(i);
  }
  p.Finish("3 classes");
  const std::string out = Written();
  EXPECT_EQ(Count(out, "\n"), 10u) << out;  // 10 %, ..., 90 %, done.
  EXPECT_EQ(Count(out, "\r"), 0u) << out;
  EXPECT_NE(out.find("reading x.csv: 10% (100/1000 rows, 100 rows/s, ETA 0:09)\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("reading x.csv: 90% (900/1000 rows"), std::string::npos) << out;
  EXPECT_NE(out.find("reading x.csv: done, 1000 rows in 10.0s (100 rows/s) 3 classes\n"),
            std::string::npos)
      << out;
}

TEST_F(ProgressTest, ABarIsOneLineRedrawnWithCarriageReturnsAndRateLimited) {
  Progress::Options o = Opts(Progress::Mode::kBar);
  o.scale = 1 << 20;
  o.unit = "MiB";
  const uint64_t total = uint64_t{50} << 20;
  Progress p("reading big.csv", total, file_, o);
  // A million updates within 1.25 s of clock: at most one redraw per 0.1 s.
  for (uint64_t i = 1; i <= 1000000; ++i) {
    if (i % 200000 == 0) now_ += 0.25;
    p.Update(i * (total / 2) / 1000000, "extra");
  }
  EXPECT_LE(Count(Written(), "\r"), 6u);
  EXPECT_EQ(Count(Written(), "\n"), 0u);
  EXPECT_NE(Written().find("]  50%  25.0/50.0 MiB  20.0 MiB/s  ETA 0:01  extra"), std::string::npos)
      << Written();
  now_ += 0.75;
  p.Finish();
  const std::string out = Written();
  EXPECT_EQ(Count(out, "\n"), 1u) << out;
  EXPECT_EQ(out.back(), '\n');
  EXPECT_NE(out.find("\rreading big.csv [==============================] 100%  50.0 MiB in 2.0s "
                     "(25.0 MiB/s)"),
            std::string::npos)
      << out;
}

TEST_F(ProgressTest, AShorterRedrawBlanksTheLongerLineBeforeIt) {
  Progress p("r", 100, file_, Opts(Progress::Mode::kBar));
  now_ += 1;
  p.Update(10, "a long extra text");
  now_ += 1;
  p.Update(20);
  const std::string out = Written();
  const size_t second = out.rfind('\r');
  ASSERT_NE(second, std::string::npos);
  EXPECT_EQ(out.size() - second, out.find('\r', 1)) << out;  // Both lines as wide.
}

TEST_F(ProgressTest, UnknownTotalAndOffAndDestroyedBar) {
  {
    Progress p("rounds", 0, file_, Opts(Progress::Mode::kLines));
    for (uint64_t i = 1; i <= 50; ++i) p.Update(i);
    now_ += 5;
    p.Finish();
  }
  EXPECT_EQ(Written(), "rounds: done, 50 rows in 5.0s (10 rows/s)\n");
  {
    Progress p("off", 10, file_, Opts(Progress::Mode::kOff));
    p.Update(5);
    p.Finish();
    Progress q("nowhere", 10, nullptr, Opts(Progress::Mode::kBar));
    q.Update(5);
    q.Finish();
  }
  EXPECT_EQ(Count(Written(), "\n"), 1u);
  {
    Progress p("bar", 10, file_, Opts(Progress::Mode::kBar));
    p.Update(5);
  }  // An error return: the half-drawn bar's line is ended.
  const std::string out = Written();
  EXPECT_EQ(out.back(), '\n') << out;
  EXPECT_NE(out.find("\rbar [===============>              ]  50%  5/10 rows"), std::string::npos)
      << out;
}

}  // namespace
}  // namespace cohort
