#include "train/npz.h"

#include <gtest/gtest.h>
#include <zip.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

namespace cohort::train {
namespace {

// tests/data/initial_model.npz is numpy.savez of conv.weight = arange(6)/4
// as float32 (2, 3), conv.bias = [0.5, -1.5] float32 and
// bn.num_batches_tracked = int64 7 (0-d); initial_model_compressed.npz is
// numpy.savez_compressed of the weight as float64 and the bias as float16.
const std::string kData = COHORT_TEST_DATA;
const std::vector<float> kWeights = {0, 0.25, 0.5, 0.75, 1, 1.25, 0.5, -1.5};

config::ExternalModel External(uint64_t n) {
  config::ExternalModel m;
  m.set_num_params(n);
  return m;
}

void AddTensor(config::ExternalModel* m, const std::string& name, std::vector<uint64_t> shape) {
  auto* t = m->add_layout();
  t->set_name(name);
  for (uint64_t d : shape) t->add_shape(d);
}

// A .npy of `header` (the dict literal) and `data`, version 1.
std::string Npy(const std::string& header, const std::string& data) {
  std::string h = header;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + data;
}

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

using Entries = std::vector<std::pair<std::string, std::string>>;

// An .npz in a temporary file, of (entry name, bytes) pairs.
class NpzFile {
 public:
  explicit NpzFile(const Entries& entries) {
    path_ = (std::filesystem::temp_directory_path() /
             ("npz_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".npz"))
                .string();
    int error = 0;
    zip_t* z = zip_open(path_.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
    for (const auto& [name, bytes] : entries) {
      keep_.push_back(bytes);
      zip_source_t* src = zip_source_buffer(z, keep_.back().data(), keep_.back().size(), 0);
      zip_file_add(z, name.c_str(), src, ZIP_FL_OVERWRITE);
    }
    zip_close(z);
  }
  ~NpzFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
  std::vector<std::string> keep_;
};

TEST(NpzTest, ReadsNumpysSavezInArchiveOrderWithDtypesAndShapes) {
  auto arrays = ReadNpz(kData + "/initial_model.npz", 1000);
  ASSERT_TRUE(arrays.ok()) << arrays.status().ToString();
  ASSERT_EQ(arrays->size(), 3u);
  EXPECT_EQ((*arrays)[0].name, "conv.weight");
  EXPECT_EQ((*arrays)[0].dtype, "<f4");
  EXPECT_EQ((*arrays)[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ((*arrays)[1].values, (std::vector<float>{0.5, -1.5}));
  EXPECT_EQ((*arrays)[2].name, "bn.num_batches_tracked");
  EXPECT_FALSE((*arrays)[2].floating);
  EXPECT_TRUE((*arrays)[2].shape.empty());
  EXPECT_EQ((*arrays)[2].values, std::vector<float>{7});
}

TEST(NpzTest, WithoutALayoutTheFloatingArraysInOrderAreTheModel) {
  auto flat = LoadInitialModel(kData + "/initial_model.npz", External(8));
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ(*flat, kWeights);  // num_batches_tracked left out.
  // Deflated float64 and float16 arrays read as the same float32 values.
  auto compressed = LoadInitialModel(kData + "/initial_model_compressed.npz", External(8));
  ASSERT_TRUE(compressed.ok()) << compressed.status().ToString();
  EXPECT_EQ(*compressed, kWeights);
}

TEST(NpzTest, ALayoutPicksArraysByNameInItsOrderAndChecksShapes) {
  config::ExternalModel m = External(8);
  AddTensor(&m, "conv.bias", {2});
  AddTensor(&m, "conv.weight", {2, 3});
  auto flat = LoadInitialModel(kData + "/initial_model.npz", m);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ(*flat, (std::vector<float>{0.5, -1.5, 0, 0.25, 0.5, 0.75, 1, 1.25}));

  config::ExternalModel wrong_shape = External(8);
  AddTensor(&wrong_shape, "conv.weight", {3, 2});
  AddTensor(&wrong_shape, "conv.bias", {2});
  Status s = LoadInitialModel(kData + "/initial_model.npz", wrong_shape).status();
  EXPECT_NE(
      s.message().find("array 'conv.weight' has shape (2, 3); model.external.layout says (3, 2)"),
      std::string::npos)
      << s.ToString();

  config::ExternalModel missing = External(8);
  AddTensor(&missing, "fc.weight", {8});
  s = LoadInitialModel(kData + "/initial_model.npz", missing).status();
  EXPECT_NE(s.message().find("holds no array 'fc.weight'"), std::string::npos) << s.ToString();
}

TEST(NpzTest, ASizeOtherThanTheRunsNamesBoth) {
  Status s = LoadInitialModel(kData + "/initial_model.npz", External(10)).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("initial_model.npz holds 8 values"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("the run's model has 10"), std::string::npos) << s.ToString();
}

TEST(NpzTest, NonFiniteValuesAreNamedByArrayAndIndex) {
  NpzFile f(Entries{{"w.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                                  Floats({1, std::numeric_limits<float>::quiet_NaN(), 2}))}});
  Status s = LoadInitialModel(f.path(), External(3)).status();
  EXPECT_NE(s.message().find("array 'w' value 1 is not finite"), std::string::npos) << s.ToString();
}

TEST(NpzTest, MissingAndNonZipFilesAreNamed) {
  Status s = ReadNpz("/nonexistent/init.npz", 100).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("/nonexistent/init.npz"), std::string::npos);
  s = ReadNpz(kData + "/optimizer_golden.txt", 100).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("not an .npz"), std::string::npos) << s.ToString();
}

TEST(NpzTest, MalformedEntriesAreRefusedNamingTheEntry) {
  const std::string ok_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  struct Case {
    std::string name, bytes, expect;
  } cases[] = {
      {"a.npy", "\x93NUMPZ\x01\x00\x00\x00", "no \\x93NUMPY magic"},
      {"a.npy", Npy(ok_header, Floats({1})), "needs 8 bytes of data, the entry has 4"},
      {"a.npy", Npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", Floats({1})),
       "big-endian"},
      {"a.npy", Npy("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", Floats({1, 1})),
       "not supported"},
      {"a.npy", Npy("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", Floats({1})),
       "Fortran order"},
      {"a.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", ""),
       "holds more than"},
      {"a.npy", Npy("{'descr': '<f4', 'fortran_order': False, }", ""), "header has no 'shape'"},
      {"a.txt", Npy(ok_header, Floats({1, 2})), "entry 'a.txt' is not an .npy array"},
  };
  for (const Case& c : cases) {
    NpzFile f(Entries{{c.name, c.bytes}});
    Status s = ReadNpz(f.path(), 1000).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(f.path()), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace cohort::train
