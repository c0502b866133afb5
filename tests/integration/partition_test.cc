// `cohort partition` as a person meets it (issue 31): the defaults it used,
// the CSV format in its --help, class names, delimiters, --standardize and
// progress on large inputs. Each test runs the real binary and asserts what
// it printed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "datasets/shard.h"
#include "tests/integration/harness.h"

namespace cohort::testing {
namespace {

class PartitionTest : public ::testing::Test {
 protected:
  // Runs `cohort partition ARGS`; stdout into out_, stderr into err_.
  int Partition(std::vector<std::string> args) {
    args.insert(args.begin(), "partition");
    std::filesystem::remove(dir_ / "err.log");
    const int code = RunCohort(args, &out_, dir_ / "err.log");
    err_ = ReadFile(dir_ / "err.log");
    return code;
  }
  void ExpectErr(const std::string& text) {
    EXPECT_NE(err_.find(text), std::string::npos) << "stderr:\n" << err_;
  }
  void ExpectOut(const std::string& text) {
    EXPECT_NE(out_.find(text), std::string::npos) << "stdout:\n" << out_ << "stderr:\n" << err_;
  }
  static std::string Be32(uint32_t v) {
    return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  }

  TempDir dir_{"partition"};
  std::string out_, err_;
};

TEST_F(PartitionTest, DefaultsItUsedAreSaid) {
  ASSERT_EQ(Partition({"--format", "synthetic", "--samples", "200", "--test-samples", "0", "--out",
                       dir_ / "a"}),
            0)
      << err_;
  ExpectErr(
      "--clients not given: split over the default 10 clients; choose the number with "
      "--clients N\n");
  ExpectErr(
      "split iid with seed 0, the default scheme and seed; choose with --scheme "
      "iid|dirichlet:ALPHA|shards:K|quantity:ALPHA and --seed S\n");
  ExpectErr("no test.shard written: --test-samples is 0\n");
  EXPECT_TRUE(std::filesystem::exists(dir_ / "a/client-009.shard"));

  ASSERT_EQ(Partition({"--format", "synthetic", "--samples", "200", "--clients", "4", "--seed", "3",
                       "--out", dir_ / "b"}),
            0)
      << err_;
  EXPECT_EQ(err_.find("--clients not given"), std::string::npos) << err_;
  ExpectErr(
      "split iid with seed 3, the default scheme; choose with --scheme "
      "iid|dirichlet:ALPHA|shards:K|quantity:ALPHA\n");
  EXPECT_EQ(err_.find("test.shard"), std::string::npos) << err_;

  ASSERT_EQ(Partition({"--format", "synthetic", "--samples", "200", "--clients", "4", "--scheme",
                       "dirichlet:0.5", "--out", dir_ / "c"}),
            0)
      << err_;
  ExpectErr("split dirichlet:0.5 with seed 0, the default seed; choose with --seed S\n");
}

TEST_F(PartitionTest, MissingTestFilesAreSaidWithTheFlagsThatWouldWriteOne) {
  WriteFile(dir_ / "train.csv", "0,1,2\n1,3,4\n0,5,6\n1,7,8\n");
  ASSERT_EQ(Partition({"--format", "csv", "--train", dir_ / "train.csv", "--clients", "2",
                       "--scheme", "iid", "--seed", "0", "--out", dir_ / "csv"}),
            0)
      << err_;
  EXPECT_EQ(err_, "no test.shard written: give --test FILE to write one\n");

  // A tiny IDX pair: 4 images of 2x2 pixels, labels 0..3.
  std::string images = Be32(0x803) + Be32(4) + Be32(2) + Be32(2) + std::string(16, '\x10');
  std::string labels = Be32(0x801) + Be32(4) + std::string("\x00\x01\x02\x03", 4);
  WriteFile(dir_ / "img", images);
  WriteFile(dir_ / "lab", labels);
  ASSERT_EQ(
      Partition({"--format", "idx", "--train-images", dir_ / "img", "--train-labels", dir_ / "lab",
                 "--clients", "2", "--scheme", "iid", "--seed", "0", "--out", dir_ / "idx"}),
      0)
      << err_;
  EXPECT_EQ(err_, "no test.shard written: give --test-images and --test-labels to write one\n");
}

TEST_F(PartitionTest, HelpDocumentsTheCsvFormat) {
  ASSERT_EQ(Partition({"--help"}), 0);
  ExpectOut("CSV input (--format csv --train FILE [--test FILE]):");
  ExpectOut("fields separated by commas");
  ExpectOut("';', tabs or '|' are refused");
  ExpectOut("The first line is a header");
  ExpectOut("--label-column (0-based, default 0)");
  ExpectOut("Names are numbered in\n    sorted order");
  ExpectOut("a finite decimal number");
  ExpectOut("OUT/standardize.csv");
}

TEST_F(PartitionTest, StringLabelsAreMappedAndTheMappingPrinted) {
  WriteFile(dir_ / "train.csv", "animal,w,h\ndog,1,2\ncat,3,4\ndog,5,6\ncat,7,8\n");
  // Only dogs: by the training file's numbering they are class 1.
  WriteFile(dir_ / "test.csv", "animal,w,h\ndog,1,1\ndog,2,2\n");
  ASSERT_EQ(Partition({"--format", "csv", "--train", dir_ / "train.csv", "--test",
                       dir_ / "test.csv", "--clients", "2", "--out", dir_ / "s"}),
            0)
      << err_;
  EXPECT_EQ(out_.substr(0, out_.find('\n')), "labels: cat=0 dog=1");
  datasets::Dataset test = OrThrow(datasets::ReadShard(dir_ / "s/test.shard"), "test.shard");
  EXPECT_EQ(test.labels, (std::vector<int32_t>{1, 1}));

  WriteFile(dir_ / "unseen.csv", "cat,1,1\nemu,2,2\n");
  EXPECT_EQ(Partition({"--format", "csv", "--train", dir_ / "train.csv", "--test",
                       dir_ / "unseen.csv", "--out", dir_ / "u"}),
            1);
  ExpectErr(dir_ / "unseen.csv" +
            ":2, column 1: label \"emu\" is not a class of the training file (cat, dog)");

  WriteFile(dir_ / "indices.csv", "0,1,2\n1,3,4\n");
  EXPECT_EQ(Partition({"--format", "csv", "--train", dir_ / "indices.csv", "--test",
                       dir_ / "test.csv", "--out", dir_ / "u"}),
            1);
  ExpectErr(dir_ / "test.csv" + ": labels are names (\"dog\"), but " + dir_ / "indices.csv" +
            "'s are class indices");
}

TEST_F(PartitionTest, BadCsvLinesAreNamedNeverJustNoSamples) {
  WriteFile(dir_ / "semi.csv", "label;x;y\n0;1,5;2\n1;2,5;3\n");
  EXPECT_EQ(Partition({"--format", "csv", "--train", dir_ / "semi.csv", "--out", dir_ / "o"}), 1);
  ExpectErr(dir_ / "semi.csv" + ":1: one field; the delimiter looks like ';'");
  WriteFile(dir_ / "word.csv", "0,1,2\n1,3,four\n");
  EXPECT_EQ(Partition({"--format", "csv", "--train", dir_ / "word.csv", "--out", dir_ / "o"}), 1);
  ExpectErr(dir_ / "word.csv" + ":2, column 3: not a finite number: \"four\"");
  WriteFile(dir_ / "short.csv", "0,1,2\n1,3\n");
  EXPECT_EQ(Partition({"--format", "csv", "--train", dir_ / "short.csv", "--out", dir_ / "o"}), 1);
  ExpectErr(dir_ / "short.csv" + ":2, column 3: missing (2 columns, expected 3 as on line 1)");
  EXPECT_EQ(err_.find("no samples"), std::string::npos) << err_;
}

TEST_F(PartitionTest, StandardizeUsesTrainingFiguresEverywhereAndStoresThem) {
  // Feature x: mean 20, std 10 over the training rows; feature k constant.
  WriteFile(dir_ / "train.csv", "y,x,k\n0,10,7\n1,30,7\n0,10,7\n1,30,7\n");
  WriteFile(dir_ / "test.csv", "y,x,k\n0,40,7\n");
  ASSERT_EQ(Partition({"--format", "csv", "--train", dir_ / "train.csv", "--test",
                       dir_ / "test.csv", "--clients", "2", "--standardize", "--out", dir_ / "z"}),
            0)
      << err_;
  ExpectOut(
      "standardize: mean and std of 2 features from the 4 training rows, applied to every "
      "shard and test.shard; written to " +
      dir_ / "z/standardize.csv\n");
  ExpectOut("standardize: 1 features have std 0 and are left unscaled (features 1)\n");
  EXPECT_EQ(ReadFile(dir_ / "z/standardize.csv"), "feature,column,mean,std\n0,1,20,10\n1,2,0,1\n");
  datasets::Dataset test = OrThrow(datasets::ReadShard(dir_ / "z/test.shard"), "test.shard");
  EXPECT_EQ(test.features, (std::vector<float>{2, 7}));
  datasets::Dataset c0 = OrThrow(datasets::ReadShard(dir_ / "z/client-000.shard"), "shard");
  for (size_t i = 0; i < c0.size(); ++i) EXPECT_EQ(std::fabs(c0.features[2 * i]), 1.0f);

  // Without the flag: nothing scaled, nothing written, and a hint when the
  // features are large.
  WriteFile(dir_ / "big.csv", "0,1000,1\n1,3000,2\n");
  ASSERT_EQ(Partition({"--format", "csv", "--train", dir_ / "big.csv", "--clients", "1", "--out",
                       dir_ / "n"}),
            0)
      << err_;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "n/standardize.csv"));
  EXPECT_EQ(out_.find("standardize"), std::string::npos) << out_;
  ExpectErr(
      "the features are not scaled (feature 0 reaches 3000): if training stays at the "
      "majority class, partition again with --standardize\n");
  datasets::Dataset raw = OrThrow(datasets::ReadShard(dir_ / "n/client-000.shard"), "shard");
  EXPECT_EQ(raw.features, (std::vector<float>{1000, 1, 3000, 2}));
}

TEST_F(PartitionTest, StandardizeRefusesWhatItCannotDoNamingTheFlag) {
  EXPECT_EQ(Partition({"--format", "synthetic", "--standardize", "--out", dir_ / "o"}), 1);
  ExpectErr("--standardize: only for --format csv, not synthetic");
  WriteFile(dir_ / "t.csv", "0,0.5\n1,0.25\n");
  EXPECT_EQ(Partition({"--format", "csv", "--train", dir_ / "t.csv", "--standardize", "--encoding",
                       "uint8", "--out", dir_ / "o"}),
            1);
  ExpectErr(
      "--standardize: standardized features are not in [0, 1]; --encoding uint8 cannot "
      "hold them");
  EXPECT_NE(Partition({"--format", "csv", "--train", dir_ / "t.csv", "--standardize=maybe", "--out",
                       dir_ / "o"}),
            0);
  ExpectErr("--standardize");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "o/client-000.shard"));
}

TEST_F(PartitionTest, LargeInputsShowProgressLinesWhenStderrIsNotATerminal) {
  ASSERT_EQ(Partition({"--format", "synthetic", "--samples", "120000", "--features", "2",
                       "--test-samples", "10", "--clients", "10", "--scheme", "iid", "--seed", "1",
                       "--out", dir_ / "p"}),
            0)
      << err_;
  ExpectErr("writing shards: 50% (5/10 shards");
  ExpectErr("writing shards: done, 10 shards in ");
  EXPECT_EQ(err_.find('\r'), std::string::npos) << err_;
  // A small input: no progress at all.
  ASSERT_EQ(Partition({"--format", "synthetic", "--samples", "1000", "--clients", "10", "--scheme",
                       "iid", "--seed", "1", "--out", dir_ / "q"}),
            0)
      << err_;
  EXPECT_EQ(err_, "") << err_;
}

}  // namespace
}  // namespace cohort::testing
