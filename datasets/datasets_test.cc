#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/bytes.h"
#include "datasets/csv.h"
#include "datasets/idx.h"
#include "datasets/partition.h"
#include "datasets/shard.h"
#include "datasets/split.h"
#include "datasets/standardize.h"
#include "datasets/synthetic.h"

namespace cohort::datasets {
namespace {

class DatasetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cohort_datasets_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  void WriteFile(const std::string& name, const std::string& text) {
    std::ofstream(Path(name)) << text;
  }
  void WriteGz(const std::string& path, const std::string& bytes) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  }
  static std::string Be32(uint32_t v) {
    return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  }
  std::filesystem::path dir_;
};

TEST_F(DatasetsTest, IdxReadsGzipImagesAndLabels) {
  std::string images = Be32(0x803) + Be32(3) + Be32(2) + Be32(2);
  for (int i = 0; i < 12; ++i) images += char(i * 20);
  std::string labels = Be32(0x801) + Be32(3) + std::string("\x01\x00\x09", 3);
  WriteGz(Path("img.gz"), images);
  WriteGz(Path("lab.gz"), labels);
  auto data = ReadIdx(Path("img.gz"), Path("lab.gz"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 3u);
  EXPECT_EQ(data->num_features, 4u);
  EXPECT_EQ(data->labels[2], 9);
  EXPECT_FLOAT_EQ(data->features[11], 220 / 255.0f);
}

TEST_F(DatasetsTest, IdxErrorsNameTheFileAndProblem) {
  std::string images = Be32(0x803) + Be32(3) + Be32(2) + Be32(2) + std::string(12, 'x');
  WriteGz(Path("img.gz"), images);
  WriteGz(Path("bad_magic.gz"), Be32(0x802) + Be32(3) + "abc");
  auto data = ReadIdx(Path("img.gz"), Path("bad_magic.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("bad_magic.gz"), std::string::npos);
  EXPECT_NE(data.status().message().find("magic"), std::string::npos);

  WriteGz(Path("two.gz"), Be32(0x801) + Be32(2) + "ab");
  data = ReadIdx(Path("img.gz"), Path("two.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("3 images but"), std::string::npos) << data.status();

  WriteGz(Path("short.gz"), Be32(0x801) + Be32(3) + "a");
  data = ReadIdx(Path("img.gz"), Path("short.gz"));
  EXPECT_NE(data.status().message().find("promises 3 bytes"), std::string::npos) << data.status();
}

// A gzip bomb: the header states 12 bytes of pixels, the file inflates to
// 32 MiB more. It is refused at the first byte past the stated 12, so the
// reader never reaches the end of the stream, whose checksum this file
// gets wrong on purpose: reading it whole would fail on that instead.
TEST_F(DatasetsTest, IdxGzipBombIsRefusedAtTheFirstByteBeyondItsHeader) {
  std::string images = Be32(0x803) + Be32(3) + Be32(2) + Be32(2) + std::string(12, 'x');
  images.append(size_t{32} << 20, '\0');
  WriteGz(Path("bomb.gz"), images);
  std::string gz;
  {
    std::ifstream in(Path("bomb.gz"), std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_LT(gz.size(), size_t{1} << 20);  // A bomb: far smaller than what it inflates to.
  gz[gz.size() - 8] ^= 0x55;              // The gzip trailer's CRC-32.
  { std::ofstream(Path("bomb.gz"), std::ios::binary | std::ios::trunc) << gz; }
  WriteGz(Path("lab.gz"), Be32(0x801) + Be32(3) + std::string("\x01\x00\x01", 3));
  auto data = ReadIdx(Path("bomb.gz"), Path("lab.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(data.status().message().find("bomb.gz: more data than the 12 bytes its header states"),
            std::string::npos)
      << data.status();
}

TEST_F(DatasetsTest, IdxHeaderStatingTooMuchDataIsRefusedBeforeReading) {
  // 65535^3 bytes (256 TiB) stated, none there: refused on the header.
  WriteGz(Path("huge.gz"), Be32(0x803) + Be32(65535) + Be32(65535) + Be32(65535));
  WriteGz(Path("lab.gz"), Be32(0x801) + Be32(1) + std::string("\x01", 1));
  auto data = ReadIdx(Path("huge.gz"), Path("lab.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(data.status().message().find("huge.gz: header states more than 4 GiB of data"),
            std::string::npos)
      << data.status();
  // No images: their size per image is no one's to know.
  WriteGz(Path("none.gz"), Be32(0x803) + Be32(0) + Be32(65535) + Be32(65535));
  WriteGz(Path("nolab.gz"), Be32(0x801) + Be32(0));
  data = ReadIdx(Path("none.gz"), Path("nolab.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("none.gz: holds no images"), std::string::npos)
      << data.status();
}

// A header that states 1 GiB of pixels over a file of 12: the truncation is
// named, and the reader's memory grows with the data that arrives, not with
// what the header claims (checked under a 512 MiB address-space cap, in a
// death test's child).
void ReadLyingIdxUnderHalfAGiB(const std::string& images, const std::string& labels) {
  const rlimit cap = {size_t{512} << 20, size_t{512} << 20};
  setrlimit(RLIMIT_AS, &cap);
  auto data = ReadIdx(images, labels);
  std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
  std::_Exit(data.status().code() == StatusCode::kDataLoss ? 0 : 1);
}

TEST_F(DatasetsTest, IdxHeaderThatOverstatesItsDataCostsOnlyTheDataThere) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the cap allows";
#endif
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  WriteGz(Path("liar.gz"),
          Be32(0x803) + Be32(1024) + Be32(1024) + Be32(1024) + std::string(12, 'x'));
  WriteGz(Path("lab.gz"), Be32(0x801) + Be32(1024) + std::string(1024, '\x01'));
  EXPECT_EXIT(ReadLyingIdxUnderHalfAGiB(Path("liar.gz"), Path("lab.gz")),
              ::testing::ExitedWithCode(0),
              "liar.gz: header promises 1073741824 bytes of data, file has 12");
}

// A FIFO named like a data file would block the open until a writer came.
// The test holds a writer open (so that a reader that did open it would not
// block either) and expects a refusal that names the file, before any read.
TEST_F(DatasetsTest, AFifoIsRefusedAsADataFile) {
  ASSERT_EQ(::mkfifo(Path("client-000.shard").c_str(), 0600), 0);
  const int writer = ::open(Path("client-000.shard").c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(writer, 0);
  const std::string junk(64, 'j');
  ASSERT_EQ(::write(writer, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  const std::string expected =
      Path("client-000.shard") + ": is a FIFO (named pipe), not a regular file";
  auto shard = ReadShard(Path("client-000.shard"));
  ASSERT_FALSE(shard.ok());
  EXPECT_EQ(shard.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shard.status().message().find(expected), std::string::npos) << shard.status();
  auto csv = ReadCsv(Path("client-000.shard"));
  EXPECT_NE(csv.status().message().find(expected), std::string::npos) << csv.status();
  auto idx = ReadIdx(Path("client-000.shard"), Path("client-000.shard"));
  EXPECT_NE(idx.status().message().find(expected), std::string::npos) << idx.status();
  ::close(writer);
  auto dir = ReadShard(dir_.string());
  EXPECT_NE(dir.status().message().find("is a directory, not a regular file"), std::string::npos)
      << dir.status();
}

TEST_F(DatasetsTest, CsvReadsAndReportsLineOfBadValue) {
  {
    std::ofstream f(Path("ok.csv"));
    f << "label,a,b\n1,0.5,2\n0,1.5,-3\n2,0,0\n";
  }
  auto data = ReadCsv(Path("ok.csv"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 3u);
  EXPECT_EQ(data->num_features, 2u);
  EXPECT_EQ(data->num_classes, 3u);
  EXPECT_FLOAT_EQ(data->features[3], -3.0f);
  {
    std::ofstream f(Path("bad.csv"));
    f << "1,0.5,2\n0,1.5,oops\n";
  }
  data = ReadCsv(Path("bad.csv"));
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("bad.csv:2"), std::string::npos) << data.status();
  EXPECT_NE(data.status().message().find("oops"), std::string::npos);
  {
    std::ofstream f(Path("ragged.csv"));
    f << "1,0.5,2\n0,1.5\n";
  }
  data = ReadCsv(Path("ragged.csv"));
  EXPECT_EQ(data.status().message(),
            Path("ragged.csv") + ":2, column 3: missing (2 columns, expected 3 as on line 1)");
  WriteFile("long.csv", "a,b,c\n1,0.5,2\n0,1.5,3,4\n");
  EXPECT_EQ(ReadCsv(Path("long.csv")).status().message(),
            Path("long.csv") + ":3, column 4: extra (4 columns, expected 3 as on line 2)");
}

// The message a person gets instead of "no samples" for each way a file
// can fail to hold any.
TEST_F(DatasetsTest, CsvWithoutSamplesSaysWhy) {
  WriteFile("empty.csv", "\n\n");
  EXPECT_EQ(ReadCsv(Path("empty.csv")).status().message(),
            Path("empty.csv") + ": no samples: the file has no lines");
  WriteFile("header.csv", "label,x,y\n");
  EXPECT_EQ(ReadCsv(Path("header.csv")).status().message(),
            Path("header.csv") +
                ": no samples: line 1 is a header (a feature field that is not a number) and no "
                "line follows it");
}

TEST_F(DatasetsTest, CsvWithSemicolonsOrTabsNamesTheDelimiter) {
  const std::string hint = ", but Cohort reads comma-separated values only";
  WriteFile("semi.csv", "label;x;y\n1;0.5;2\n");
  auto data = ReadCsv(Path("semi.csv"));
  EXPECT_EQ(data.status().message(), Path("semi.csv") +
                                         ":1: one field; the delimiter looks like ';'" + hint +
                                         " (convert the file, e.g. with tr)");
  WriteFile("tabs.csv", "1\t0.5\t2\n0\t1\t2\n");
  data = ReadCsv(Path("tabs.csv"));
  EXPECT_NE(data.status().message().find(Path("tabs.csv") + ":1: one field; the delimiter "
                                                            "looks like a tab"),
            std::string::npos)
      << data.status();
  // A decimal comma with ';' between fields: the first bad field says so.
  WriteFile("euro.csv", "label;x;y\n1,5;2,0;3\n");
  CsvOptions label_last;
  label_last.label_column = 2;
  data = ReadCsv(Path("euro.csv"), label_last);
  EXPECT_NE(
      data.status().message().find(Path("euro.csv") + ":2, column 2: not a finite number: "
                                                      "\"5;2\"; the delimiter looks like ';'"),
      std::string::npos)
      << data.status();
}

TEST_F(DatasetsTest, CsvStringLabelsAreSortedClassIndicesAndTheTestFileUsesThem) {
  WriteFile("train.csv", "species,x,y\ndog,1,2\ncat,3,4\n\"emu\",5,6\ndog,7,8\n");
  auto train = ReadCsvTable(Path("train.csv"));
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->class_names, (std::vector<std::string>{"cat", "dog", "emu"}));
  EXPECT_EQ(train->data.labels, (std::vector<int32_t>{1, 0, 2, 1}));
  EXPECT_EQ(train->data.num_classes, 3u);
  EXPECT_EQ(train->data.features[2], 3.0f);
  // Without a header, and with the names in another order: the same indices.
  WriteFile("plain.csv", "emu,5,6\ncat,3,4\ndog,1,2\n");
  auto plain = ReadCsvTable(Path("plain.csv"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->class_names, train->class_names);
  EXPECT_EQ(plain->data.labels, (std::vector<int32_t>{2, 0, 1}));

  CsvOptions test_options;
  test_options.num_classes = 3;
  test_options.class_names = train->class_names;
  WriteFile("test.csv", "species,x,y\nemu,1,1\ncat,2,2\n");
  auto test = ReadCsvTable(Path("test.csv"), test_options);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->data.labels, (std::vector<int32_t>{2, 0}));
  WriteFile("unseen.csv", "emu,1,1\nyak,2,2\n");
  EXPECT_EQ(ReadCsv(Path("unseen.csv"), test_options).status().message(),
            Path("unseen.csv") +
                ":2, column 1: label \"yak\" is not a class of the training file (cat, dog, emu)");
}

TEST_F(DatasetsTest, CsvLabelsMixingNamesAndIndicesAreAnError) {
  WriteFile("mixed.csv", "0,1,2\n1,3,4\nl0,5,6\n");
  EXPECT_EQ(ReadCsv(Path("mixed.csv")).status().message(),
            Path("mixed.csv") +
                ":3, column 1: label \"l0\" is a name, but line 1's label \"0\" is a class "
                "index: a file's labels are all class indices or all names");
  WriteFile("mixed2.csv", "cat,1,2\ndog,3,4\n0,5,6\n");
  EXPECT_EQ(ReadCsv(Path("mixed2.csv")).status().message(),
            Path("mixed2.csv") +
                ":3, column 1: label \"0\" is a class index, but line 1's label \"cat\" is a "
                "name: a file's labels are all class indices or all names");
  // A first line whose label is a name over numeric column names, followed
  // by class indices, is a header.
  WriteFile("numeric_header.csv", "label,0,1\n1,3,4\n0,5,6\n");
  auto data = ReadCsv(Path("numeric_header.csv"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->labels, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(data->features, (std::vector<float>{3, 4, 5, 6}));
  WriteFile("nolabel.csv", "a,1,2\n ,3,4\n");
  EXPECT_EQ(ReadCsv(Path("nolabel.csv")).status().message(),
            Path("nolabel.csv") + ":2, column 1: the label is empty");
}

TEST_F(DatasetsTest, CsvProgressGoesWhereItIsToldForLargeFiles) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += std::to_string(i % 3) + ",0.5,1.5\n";
  WriteFile("big.csv", text);
  CsvOptions options;
  options.progress = std::tmpfile();
  options.progress_min_bytes = 1000;
  FILE* out = options.progress;
  auto data = ReadCsv(Path("big.csv"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  std::rewind(out);
  std::string printed(4096, '\0');
  printed.resize(std::fread(printed.data(), 1, printed.size(), out));
  std::fclose(out);
  EXPECT_NE(printed.find("reading " + Path("big.csv") + ": 50% ("), std::string::npos) << printed;
  EXPECT_NE(printed.find("reading " + Path("big.csv") + ": done, 0.0 MiB in "), std::string::npos)
      << printed;
  EXPECT_NE(printed.find(" 2000 lines\n"), std::string::npos) << printed;
  // Below the size: nothing.
  options.progress = out = std::tmpfile();
  options.progress_min_bytes = CsvOptions().progress_min_bytes;
  ASSERT_TRUE(ReadCsv(Path("big.csv"), options).ok());
  EXPECT_EQ(std::ftell(out), 0);
  std::fclose(out);
}

TEST(StandardizeTest, TrainingFiguresScaleEverySetAndConstantFeaturesStay) {
  Dataset train{
      .num_features = 3, .num_classes = 2, .features = {1, 5, 10, 3, 5, 20}, .labels = {0, 1}};
  const Standardization s = FitStandardization(train);
  EXPECT_EQ(s.rows, 2u);
  EXPECT_EQ(s.mean, (std::vector<double>{2, 0, 15}));
  EXPECT_EQ(s.std, (std::vector<double>{1, 1, 5}));
  EXPECT_EQ(s.constant, (std::vector<uint32_t>{1}));
  ASSERT_TRUE(ApplyStandardization(s, train).ok());
  EXPECT_EQ(train.features, (std::vector<float>{-1, 5, -1, 1, 5, 1}));
  Dataset test{.num_features = 3, .num_classes = 2, .features = {4, 7, 25}, .labels = {1}};
  ASSERT_TRUE(ApplyStandardization(s, test).ok());
  EXPECT_EQ(test.features, (std::vector<float>{2, 7, 2}));
  Dataset other{.num_features = 2, .num_classes = 2, .features = {1, 2}, .labels = {0}};
  EXPECT_FALSE(ApplyStandardization(s, other).ok());
}

TEST_F(DatasetsTest, ShardRoundTripsBothEncodings) {
  Dataset data = MakeSynthetic({.num_samples = 50, .num_features = 7, .num_classes = 3});
  ASSERT_TRUE(WriteShard(data, Path("f.shard")).ok());
  auto back = ReadShard(Path("f.shard"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->features, data.features);
  EXPECT_EQ(back->labels, data.labels);

  for (float& v : data.features)
    v = static_cast<float>(static_cast<int>(std::fabs(v) * 30) % 256) / 255.0f;
  ASSERT_TRUE(WriteShard(data, Path("u.shard"), FeatureEncoding::kUint8).ok());
  back = ReadShard(Path("u.shard"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->features, data.features);
  EXPECT_LT(std::filesystem::file_size(Path("u.shard")),
            std::filesystem::file_size(Path("f.shard")));
}

TEST_F(DatasetsTest, CorruptShardsGiveClearErrors) {
  Dataset data = MakeSynthetic({.num_samples = 20, .num_features = 4, .num_classes = 2});
  ASSERT_TRUE(WriteShard(data, Path("s.shard")).ok());
  const auto size = std::filesystem::file_size(Path("s.shard"));
  auto flip = [&](size_t offset, const std::string& name, char mask = 0x40) {
    std::filesystem::copy_file(Path("s.shard"), Path(name));
    std::fstream f(Path(name), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c;
    f.get(c);
    f.seekp(offset);
    f.put(static_cast<char>(c ^ mask));
  };
  flip(size - 3, "feat.shard");
  auto r = ReadShard(Path("feat.shard"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("feat.shard"), std::string::npos);
  EXPECT_NE(r.status().message().find("feature section checksum"), std::string::npos);

  // A label changed to another valid class (0 <-> 1): only the label
  // section's checksum can tell.
  flip(kShardHeaderBytes, "label.shard", 0x01);
  r = ReadShard(Path("label.shard"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("label.shard: label section checksum mismatch"),
            std::string::npos)
      << r.status();

  flip(20, "head.shard");
  r = ReadShard(Path("head.shard"));
  EXPECT_NE(r.status().message().find("header checksum"), std::string::npos) << r.status();

  std::filesystem::copy_file(Path("s.shard"), Path("trunc.shard"));
  std::filesystem::resize_file(Path("trunc.shard"), size - 10);
  r = ReadShard(Path("trunc.shard"));
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status();

  { std::ofstream(Path("junk.shard")) << "this is not a shard file at all, just some text......"; }
  r = ReadShard(Path("junk.shard"));
  EXPECT_NE(r.status().message().find("bad magic"), std::string::npos) << r.status();
  EXPECT_EQ(ReadShard(Path("missing.shard")).status().code(), StatusCode::kNotFound);
}

TEST_F(DatasetsTest, ShardWithNoSamplesIsAnError) {
  Dataset empty;
  empty.num_features = 4;
  empty.num_classes = 2;
  auto written = WriteShard(empty, Path("empty.shard"));
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.message().find("no samples"), std::string::npos) << written;
  // A file that says 0 samples (header CRC and all) is refused on reading.
  Dataset one = MakeSynthetic({.num_samples = 1, .num_features = 4, .num_classes = 2});
  ASSERT_TRUE(WriteShard(one, Path("one.shard")).ok());
  std::string bytes;
  {
    std::ifstream in(Path("one.shard"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Header: magic[8], version, encoding, samples (u64), features, classes,
  // label CRC, feature CRC, header CRC (of the 40 bytes before it), pad.
  std::string header = bytes.substr(0, 40);
  std::memset(header.data() + 16, 0, 8);
  header.replace(32, 4, std::string(4, '\0'));  // CRC of no labels...
  header.replace(36, 4, std::string(4, '\0'));  // ...and of no features: 0.
  const uint32_t crc = Crc32({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
  header.append(reinterpret_cast<const char*>(&crc), 4);
  header.append(4, '\0');
  { std::ofstream(Path("zero.shard"), std::ios::binary) << header; }
  auto r = ReadShard(Path("zero.shard"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("samples 0"), std::string::npos) << r.status();
}

// Sizes from the command line (cohort partition --format synthetic) are
// bounded as data.partition's are: before, 2^32-1 samples plus one test
// sample wrapped to 0 and crashed, and 2^32-1 features or classes aborted
// on std::bad_alloc.
TEST(SplitTest, SyntheticSizesFromTheCommandLineAreBounded) {
  struct Case {
    uint32_t samples, test_samples, features, classes;
    std::string says;
  } cases[] = {
      {4294967295u, 1, 20, 4, "--samples 4294967295 is outside [1, 67108864]"},
      {0, 1, 20, 4, "--samples 0 is outside [1, 67108864]"},
      {100, 4294967295u, 20, 4, "--test-samples 4294967295 is outside [0, 67108864]"},
      {100, 10, 4294967295u, 4, "--features 4294967295 is outside [1, 65536]"},
      {100, 10, 20, 4294967295u, "--classes 4294967295 is outside [2, 65536]"},
      {100, 10, 20, 1, "--classes 1 is outside [2, 65536]"},
  };
  for (const Case& c : cases) {
    SplitOptions o;
    o.format = "synthetic";
    o.samples = c.samples;
    o.test_samples = c.test_samples;
    o.features = c.features;
    o.classes = c.classes;
    auto split = LoadAndSplit(o);
    ASSERT_FALSE(split.ok()) << c.says;
    EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(split.status().message().find("format synthetic: " + c.says), std::string::npos)
        << split.status();
  }
  SplitOptions o;  // The largest sizes still allowed split fine when small.
  o.format = "synthetic";
  o.samples = 200;
  o.test_samples = 0;
  o.features = 3;
  o.classes = 65536;
  o.clients = 2;
  auto split = LoadAndSplit(o);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->train.size(), 200u);
  EXPECT_FALSE(split->has_test);
}

// In a death test's child: splits 16 TiB of synthetic data with the
// address space capped at 1 GiB; exits 0 on kResourceExhausted.
void SplitUnderOneGiB() {
  const rlimit cap = {size_t{1} << 30, size_t{1} << 30};
  setrlimit(RLIMIT_AS, &cap);
  SplitOptions o;
  o.format = "synthetic";
  o.samples = kMaxSyntheticSamples;
  o.test_samples = 0;
  o.features = kMaxSyntheticFeatures;
  auto split = LoadAndSplit(o);
  std::fprintf(stderr, "%s\n", split.status().ToString().c_str());
  std::_Exit(split.status().code() == StatusCode::kResourceExhausted ? 0 : 1);
}

// Within the bounds a split can still be more than the machine has:
// 2^26 samples of 65536 features are 16 TiB. Run in a child whose address
// space is capped at 1 GiB, it is a kResourceExhausted that says so, not
// an abort.
TEST(SplitTest, ASplitTooLargeForMemoryIsAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the cap allows";
#endif
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      SplitUnderOneGiB(), ::testing::ExitedWithCode(0),
      "out of memory loading the data: format synthetic, 67108864 samples of 65536 features "
      "\\(16777216 MiB\\): use fewer --samples or --features");
}

TEST_F(DatasetsTest, AssignmentFilesAreCheckedLineByLine) {
  WriteFile("ok.txt", "3 1 2\n\n0 4\n");
  auto parts = ReadAssignment(Path("ok.txt"), 5);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(*parts, (std::vector<std::vector<uint32_t>>{{1, 2, 3}, {0, 4}}));
  WriteFile("dup.txt", "0 1\n1 2\n");
  EXPECT_NE(ReadAssignment(Path("dup.txt"), 5)
                .status()
                .message()
                .find("dup.txt:2: index 1 assigned twice"),
            std::string::npos);
  WriteFile("range.txt", "0 9\n");
  EXPECT_NE(ReadAssignment(Path("range.txt"), 5).status().message().find(">= 5"),
            std::string::npos);
  WriteFile("junk.txt", "0 x1\n");
  EXPECT_NE(ReadAssignment(Path("junk.txt"), 5).status().message().find("not a sample index"),
            std::string::npos);
}

void ExpectDisjointCover(const std::vector<std::vector<uint32_t>>& parts, size_t n) {
  std::set<uint32_t> seen;
  for (const auto& p : parts) {
    for (uint32_t i : p) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " twice";
  }
  EXPECT_EQ(seen.size(), n);
}

TEST(PartitionTest, SpecsParseAndBadOnesSayWhy) {
  EXPECT_EQ(ParsePartitionSpec("dirichlet:0.5")->alpha, 0.5);
  EXPECT_EQ(ParsePartitionSpec("shards:2")->classes, 2u);
  EXPECT_FALSE(ParsePartitionSpec("dirichlet:-1").ok());
  EXPECT_FALSE(ParsePartitionSpec("dirichlet").ok());
  EXPECT_FALSE(ParsePartitionSpec("shards:x").ok());
  auto bad = ParsePartitionSpec("zipf:1");
  EXPECT_NE(bad.status().message().find("unknown scheme"), std::string::npos);
}

TEST(PartitionTest, IidIsEqualDisjointAndSeeded) {
  Dataset data = MakeSynthetic({.num_samples = 1003, .num_features = 2, .num_classes = 10});
  auto parts = Partition(data.labels, 10, 10, *ParsePartitionSpec("iid"), 1);
  ASSERT_TRUE(parts.ok());
  ExpectDisjointCover(*parts, 1003);
  for (const auto& p : *parts) EXPECT_TRUE(p.size() == 100 || p.size() == 101);
  EXPECT_EQ(*parts, *Partition(data.labels, 10, 10, *ParsePartitionSpec("iid"), 1));
  EXPECT_NE(*parts, *Partition(data.labels, 10, 10, *ParsePartitionSpec("iid"), 2));
}

TEST(PartitionTest, DirichletSkewsLabelsButKeepsTenPerClient) {
  Dataset data = MakeSynthetic({.num_samples = 6000, .num_features = 2, .num_classes = 10});
  auto parts = Partition(data.labels, 10, 10, *ParsePartitionSpec("dirichlet:0.1"), 0);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ExpectDisjointCover(*parts, 6000);
  double max_share = 0;
  for (const auto& p : *parts) {
    EXPECT_GE(p.size(), 10u);
    std::vector<int> counts(10, 0);
    for (uint32_t i : p) ++counts[data.labels[i]];
    max_share = std::max(
        max_share, *std::max_element(counts.begin(), counts.end()) / static_cast<double>(p.size()));
  }
  EXPECT_GT(max_share, 0.5);  // alpha 0.1: some client is dominated by one class.
}

TEST(PartitionTest, ShardsGiveEachClientKClasses) {
  Dataset data = MakeSynthetic({.num_samples = 5000, .num_features = 2, .num_classes = 10});
  auto parts = Partition(data.labels, 10, 20, *ParsePartitionSpec("shards:2"), 0);
  ASSERT_TRUE(parts.ok());
  for (const auto& p : *parts) {
    std::set<int32_t> classes;
    for (uint32_t i : p) classes.insert(data.labels[i]);
    EXPECT_EQ(classes.size(), 2u);
  }
}

TEST(PartitionTest, QuantitySkewVariesSizes) {
  Dataset data = MakeSynthetic({.num_samples = 5000, .num_features = 2, .num_classes = 10});
  auto parts = Partition(data.labels, 10, 10, *ParsePartitionSpec("quantity:0.5"), 0);
  ASSERT_TRUE(parts.ok());
  ExpectDisjointCover(*parts, 5000);
  size_t lo = SIZE_MAX, hi = 0;
  for (const auto& p : *parts) {
    lo = std::min(lo, p.size());
    hi = std::max(hi, p.size());
  }
  EXPECT_GE(lo, 10u);
  EXPECT_GT(hi, 2 * lo);
}

TEST(PartitionTest, ImpossibleSplitsAreErrors) {
  std::vector<int32_t> labels(5, 0);
  EXPECT_FALSE(Partition(labels, 2, 10, *ParsePartitionSpec("iid"), 0).ok());
  std::vector<int32_t> more(50, 0);
  EXPECT_FALSE(Partition(more, 2, 10, *ParsePartitionSpec("dirichlet:0.5"), 0).ok());
}

}  // namespace
}  // namespace cohort::datasets
