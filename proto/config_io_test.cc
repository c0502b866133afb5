#include "proto/config_io.h"

#include <gtest/gtest.h>

namespace cohort::config {
namespace {

TEST(ConfigTest, TextFormatWithDefaults) {
  auto c = ParseRunConfig(R"(
    name: "fmnist"
    seed: 3
    model { arch: "mlp" hidden: 200 hidden: 200 }
    rounds { num_rounds: 5 min_clients: 4 }
  )",
                          "run.textproto");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->seed(), 3u);
  EXPECT_EQ(c->model().hidden_size(), 2);
  EXPECT_EQ(c->train().batch_size(), 32u);  // Default.
  EXPECT_FLOAT_EQ(c->train().learning_rate(), 0.05f);
}

TEST(ConfigTest, UnknownFieldNamesLineAndField) {
  auto c = ParseRunConfig("name: \"x\"\nrounds {\n  num_rouns: 5\n}\n", "bad.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("bad.textproto"), std::string::npos);
  EXPECT_NE(c.status().message().find("line 3"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("num_rouns"), std::string::npos) << c.status();
}

TEST(ConfigTest, BadValueNamesTheField) {
  auto c = ParseRunConfig("train { batch_size: 0 }", "x.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("train.batch_size"), std::string::npos) << c.status();
  c = ParseRunConfig("model { arch: \"transformer\" }", "x.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.arch"), std::string::npos) << c.status();
  c = ParseRunConfig("rounds { min_clients: 5 max_clients_per_round: 2 }", "x.textproto");
  EXPECT_NE(c.status().message().find("rounds.max_clients_per_round"), std::string::npos);
}

TEST(ConfigTest, JsonIsAccepted) {
  auto c = ParseRunConfig(R"({"name": "j", "rounds": {"numRounds": 7}})", "run.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rounds().num_rounds(), 7u);
  auto bad = ParseRunConfig(R"({"name": "j", "roundz": {}})", "run.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("roundz"), std::string::npos) << bad.status();
}

TEST(ConfigTest, DataParallelIsNotSilentlyIgnored) {
  auto c = ParseRunConfig("mode: DATA_PARALLEL", "x");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
}

TEST(ConfigTest, MissingFileIsNotFound) {
  auto c = LoadRunConfig("/nonexistent/run.textproto");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::config
