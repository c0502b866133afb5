#include "proto/config_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

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

TEST(ConfigTest, JsonEnumNumberOutsideTheEnumIsAnErrorNamingTheField) {
  // proto2 keeps such a number as an unknown field; the stored config would
  // then fail to parse when the run resumes.
  auto bad = ParseRunConfig(R"({"secagg": {"aggregation": 4}})", "run.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("secagg.aggregation"), std::string::npos) << bad.status();
  EXPECT_TRUE(ParseRunConfig(R"({"secagg": {"aggregation": 1}})", "run.json").ok());
}

TEST(ConfigTest, OptimizerSettingsAreCheckedAndNamed) {
  auto ok = ParseRunConfig(
      "train { optimizer: ADAMW learning_rate: 0.001 weight_decay: 0.01 "
      "beta2: 0.98 }",
      "run.textproto");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->train().optimizer(), config::ADAMW);
  EXPECT_TRUE(ParseRunConfig("train { momentum: 0.9 nesterov: true }", "r").ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"train { nesterov: true }", "train.nesterov"},
      {"train { momentum: 0.9 dampening: 0.5 nesterov: true }", "train.nesterov"},
      {"train { optimizer: ADAM nesterov: true }", "train.nesterov"},
      {"train { optimizer: ADAM momentum: 0.9 }", "train.momentum"},
      {"train { dampening: 1.5 }", "train.dampening"},
      {"train { optimizer: ADAMW dampening: 0.5 }", "train.dampening"},
      {"train { optimizer: ADAM beta1: 1 }", "train.beta1"},
      {"train { beta2: -0.1 }", "train.beta2"},
      {"train { eps: 0 }", "train.eps"},
      {"train { optimizer: ADAMW eps: nan }", "train.eps"},
  };
  for (const auto& [text, field] : bad) {
    auto c = ParseRunConfig(text, "run.textproto");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
  }
}

TEST(ConfigTest, TheShippedExamplesAreValid) {
  const char* dir = std::getenv("COHORT_EXAMPLES");
  if (dir == nullptr) GTEST_SKIP() << "COHORT_EXAMPLES not set (run through meson test)";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".textproto") continue;
    auto c = LoadRunConfig(entry.path().string());
    EXPECT_TRUE(c.ok()) << c.status();
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(ConfigTest, DataParallelNeedsItsTrainingSetAndRanges) {
  auto c = ParseRunConfig("mode: DATA_PARALLEL", "x");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("data.train_shard"), std::string::npos) << c.status();
  c = ParseRunConfig("mode: DATA_PARALLEL data { train_shard: \"t.shard\" }", "x");
  EXPECT_TRUE(c.ok()) << c.status();
  c = ParseRunConfig(
      "mode: DATA_PARALLEL data { train_shard: \"t.shard\" } data_parallel { epochs: 0 }", "x");
  EXPECT_NE(c.status().message().find("data_parallel.epochs"), std::string::npos) << c.status();
  c = ParseRunConfig(
      "mode: DATA_PARALLEL data { train_shard: \"t.shard\" } data_parallel { timeout_s: 1e20 }",
      "x");
  EXPECT_NE(c.status().message().find("data_parallel.timeout_s"), std::string::npos) << c.status();
  const std::string dp = "mode: DATA_PARALLEL data { train_shard: \"t.shard\" } data_parallel ";
  c = ParseRunConfig(dp + "{ accumulation_steps: 0 }", "x");
  EXPECT_NE(c.status().message().find("data_parallel.accumulation_steps"), std::string::npos)
      << c.status();
  c = ParseRunConfig(dp + "{ local_sgd_steps: 2000000 }", "x");
  EXPECT_NE(c.status().message().find("data_parallel.local_sgd_steps"), std::string::npos)
      << c.status();
  c = ParseRunConfig(dp + "{ accumulation_steps: 2 local_sgd_steps: 4 }", "x");
  EXPECT_NE(c.status().message().find("cannot be combined"), std::string::npos) << c.status();
  EXPECT_TRUE(ParseRunConfig(dp + "{ accumulation_steps: 4 }", "x").ok());
  EXPECT_TRUE(ParseRunConfig(dp + "{ local_sgd_steps: 8 }", "x").ok());
}

// The error of parsing `text`, which must fail; "" when it parsed.
std::string ErrorOf(const std::string& text) {
  auto c = ParseRunConfig(text, "x.textproto");
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ConfigTest, HugeDurationsAreErrorsNamingFieldAndRange) {
  // 1e20 s overflowed the int64 milliseconds: no round ever started, or the
  // round restarted ~90 times a second.
  for (const char* field : {"round_deadline_s", "client_timeout_s"}) {
    const std::string e = ErrorOf("rounds { " + std::string(field) + ": 1e20 }");
    EXPECT_TRUE(
        Contains(e, std::string("rounds.") + field + ": must be in [0.001, 604800] seconds"))
        << e;
    EXPECT_TRUE(Contains(e, "got 1e+20")) << e;
  }
  std::string e = ErrorOf("secagg { stage_timeout_s: 1e20 }");
  EXPECT_TRUE(Contains(e, "secagg.stage_timeout_s: must be in [0.001, 604800] seconds")) << e;
  e = ErrorOf("net { heartbeat_s: 1e20 }");
  EXPECT_TRUE(Contains(e, "net.heartbeat_s: must be in [0.05, 60] seconds")) << e;
}

TEST(ConfigTest, DurationBoundsAreInclusiveAndNanIsOut) {
  // A week is allowed, a little more is not.
  EXPECT_EQ(ErrorOf("rounds { round_deadline_s: 604800 client_timeout_s: 604800 }"
                    "secagg { stage_timeout_s: 604800 }"),
            "");
  EXPECT_TRUE(Contains(ErrorOf("rounds { round_deadline_s: 604900 }"), "rounds.round_deadline_s"));
  EXPECT_TRUE(Contains(ErrorOf("rounds { client_timeout_s: 604900 }"), "rounds.client_timeout_s"));
  EXPECT_TRUE(Contains(ErrorOf("secagg { stage_timeout_s: 604900 }"), "secagg.stage_timeout_s"));
  // A millisecond is allowed; less rounds to a deadline already past.
  EXPECT_EQ(ErrorOf("rounds { round_deadline_s: 0.001 } secagg { stage_timeout_s: 0.001 }"), "");
  EXPECT_TRUE(Contains(ErrorOf("rounds { round_deadline_s: 0.0001 }"), "rounds.round_deadline_s"));
  EXPECT_TRUE(Contains(ErrorOf("secagg { stage_timeout_s: 0.0001 }"), "secagg.stage_timeout_s"));
  EXPECT_TRUE(Contains(ErrorOf("rounds { round_deadline_s: 0 }"), "rounds.round_deadline_s"));
  const std::string nan = ErrorOf("rounds { round_deadline_s: nan }");
  EXPECT_TRUE(Contains(nan, "rounds.round_deadline_s") && Contains(nan, "nan")) << nan;
  EXPECT_TRUE(Contains(ErrorOf("rounds { client_timeout_s: inf }"), "rounds.client_timeout_s"));
  EXPECT_TRUE(Contains(ErrorOf("rounds { client_timeout_s: -1 }"), "rounds.client_timeout_s"));
  // The heartbeat: what the client would otherwise clamp silently.
  EXPECT_EQ(ErrorOf("net { heartbeat_s: 0.05 }"), "");
  EXPECT_EQ(ErrorOf("net { heartbeat_s: 10 }"), "");  // client_timeout_s 30 = 3 heartbeats.
  EXPECT_EQ(ErrorOf("net { heartbeat_s: 60 } rounds { client_timeout_s: 180 }"), "");
  EXPECT_TRUE(Contains(ErrorOf("net { heartbeat_s: 0.04 }"), "net.heartbeat_s"));
  EXPECT_TRUE(Contains(ErrorOf("net { heartbeat_s: 61 } rounds { client_timeout_s: 1000 }"),
                       "net.heartbeat_s"));
  // Unused under plain aggregation, so not checked there.
  EXPECT_EQ(ErrorOf("secagg { aggregation: PLAIN stage_timeout_s: 1e20 }"), "");
}

TEST(ConfigTest, ClientTimeoutShorterThanThreeHeartbeatsIsAnError) {
  // A live client speaks once a heartbeat: a shorter timeout marks it gone.
  const std::string e = ErrorOf("rounds { client_timeout_s: 2.9 } net { heartbeat_s: 1 }");
  EXPECT_TRUE(Contains(e, "rounds.client_timeout_s: must be at least 3 x net.heartbeat_s (3 "))
      << e;
  EXPECT_TRUE(Contains(e, "got 2.9")) << e;
  EXPECT_EQ(ErrorOf("rounds { client_timeout_s: 3 } net { heartbeat_s: 1 }"), "");
}

TEST(ConfigTest, ModelOverTheParameterCapIsAnErrorNamingTheCap) {
  // 2^20 x (2^24 + 1) + 2 x (2^20 + 1), about 2^44 parameters: std::bad_alloc
  // at start before.
  const std::string e = ErrorOf(
      "model { input_dim: 16777216 hidden: 1048576 num_classes: 2 } train { batch_size: 1 }");
  EXPECT_TRUE(Contains(e,
                       "model: input_dim 16777216, hidden [1048576], num_classes 2 make "
                       "17592189190146 parameters"))
      << e;
  EXPECT_TRUE(Contains(e, "at most 67108864 (2^26)")) << e;
  // Exactly the cap: 4 x (2^24 - 1 + 1). One input more is over.
  EXPECT_EQ(ErrorOf("model { arch: \"logreg\" input_dim: 16777215 num_classes: 4 }"
                    "train { batch_size: 8 }"),
            "");
  EXPECT_TRUE(Contains(ErrorOf("model { arch: \"logreg\" input_dim: 16777216 num_classes: 4 }"
                               "train { batch_size: 8 }"),
                       "make 67108868 parameters"));
  // Every layer counts, not only the first.
  EXPECT_TRUE(Contains(ErrorOf("model { input_dim: 8 hidden: 8192 hidden: 8192 hidden: 8192 }"),
                       "hidden [8192, 8192, 8192]"));
}

TEST(ConfigTest, ParameterCountMatchesTheModelAndOverflowIsRefused) {
  ModelConfig m;
  m.set_input_dim(784);
  m.add_hidden(200);
  m.set_num_classes(10);
  EXPECT_EQ(PlanModel(m)->params, 784u * 200 + 200 + 200u * 10 + 10);  // PyTorch's count.
  m.clear_hidden();
  EXPECT_EQ(PlanModel(m)->params, 7850u);
  // Beyond anything the validator lets through: an error, never a count
  // that wrapped round to a small number.
  m.set_input_dim(UINT32_MAX);
  for (int i = 0; i < 3; ++i) m.add_hidden(UINT32_MAX);
  EXPECT_FALSE(PlanModel(m).ok());
}

TEST(ConfigTest, ZeroWidthLayerNamesTheLayer) {
  const std::string e = ErrorOf("model { hidden: 200 hidden: 0 }");
  EXPECT_TRUE(Contains(e, "model.hidden[1]: must be in [1, 2^20]")) << e;
}

TEST(ConfigTest, EvaluationBatchStaysWithinTheStepCap) {
  ModelConfig small;
  small.set_arch("mlp");
  small.set_input_dim(784);
  small.set_num_classes(10);
  small.add_hidden(200);
  EXPECT_EQ(StepFloatsPerSample(small), 784u + 200 + 10 + 2 * 200);
  EXPECT_EQ(EvalBatchSize(small), 1000u);
  ModelConfig wide = small;  // 2^20 inputs: 1000 samples would be 4 GiB.
  wide.set_input_dim(1u << 20);
  wide.clear_hidden();
  const uint32_t batch = EvalBatchSize(wide);
  EXPECT_LT(batch, 1000u);
  EXPECT_GE(batch, 1u);
  EXPECT_LE(uint64_t{batch} * StepFloatsPerSample(wide), kMaxStepFloats);
  EXPECT_GT(uint64_t{batch + 1} * StepFloatsPerSample(wide), kMaxStepFloats);
}

TEST(ConfigTest, TrainingStepOverOneGibIsAnErrorNamingBatchSize) {
  // 2^25 + 4 parameters pass the cap, but 65536 rows of 2^24 inputs do not
  // fit anywhere.
  const std::string e = ErrorOf(
      "model { arch: \"logreg\" input_dim: 16777216 num_classes: 2 } train { batch_size: 65536 }");
  EXPECT_TRUE(Contains(e, "train.batch_size: 65536 samples x 16777222 floats each")) << e;
  EXPECT_TRUE(Contains(e, "at most 268435456 (2^28, 1 GiB)")) << e;
  // 15 rows of 16777222 floats fit; 16 do not.
  const std::string model = "model { arch: \"logreg\" input_dim: 16777216 num_classes: 2 }";
  EXPECT_EQ(ErrorOf(model + " train { batch_size: 15 }"), "");
  EXPECT_TRUE(Contains(ErrorOf(model + " train { batch_size: 16 }"), "train.batch_size"));
  // Hidden widths count twice more: the two gradient buffers.
  EXPECT_TRUE(Contains(ErrorOf("model { input_dim: 1 hidden: 1048576 num_classes: 2 }"
                               " train { batch_size: 86 }"),
                       "x 3145731 floats each"));
}

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cohort_config_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  }

  std::string dir_;
};

TEST_F(ConfigFileTest, FileIsRead) {
  auto c = LoadRunConfig(Write("run.textproto", "name: \"filed\"\nrounds { num_rounds: 3 }\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name(), "filed");
  EXPECT_EQ(c->rounds().num_rounds(), 3u);
}

TEST_F(ConfigFileTest, DirectoryIsAnErrorNamingThePath) {
  // An ifstream opened it and read nothing: a run on defaults.
  auto c = LoadRunConfig(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), dir_ + ": is a directory, not a config file");
}

TEST_F(ConfigFileTest, EmptyFileIsAnError) {
  for (const char* text : {"", " \n\t\n"}) {
    const std::string path = Write("empty.textproto", text);
    auto c = LoadRunConfig(path);
    ASSERT_FALSE(c.ok());
    EXPECT_TRUE(Contains(std::string(c.status().message()), path + ": config file is empty"))
        << c.status();
  }
  // A comment says the defaults are meant.
  EXPECT_TRUE(LoadRunConfig(Write("comment.textproto", "# all defaults\n")).ok());
}

TEST_F(ConfigFileTest, EndlessOrHugeInputIsAnError) {
  auto c = LoadRunConfig("/dev/zero");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "/dev/zero: config file is larger than 1048576 bytes");
  // Just under the limit is read (and then parsed).
  const std::string padded(1048576 - 20, ' ');
  EXPECT_TRUE(LoadRunConfig(Write("padded.textproto", padded + "name: \"p\"")).ok());
}

TEST_F(ConfigFileTest, UnreadableFileSaysWhy) {
  const std::string path = Write("run.textproto", "name: \"x\"");
  auto c = LoadRunConfig(path + "/inner.textproto");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(),
            path + "/inner.textproto: cannot open config file: Not a directory");
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  ::chmod(path.c_str(), 0);
  c = LoadRunConfig(path);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(c.status().message()), "Permission denied")) << c.status();
}

TEST(ConfigTest, SettingsThatWeakenOrBreakSecureRoundsAreErrors) {
  std::string e = ErrorOf("secagg { consistency_check: false }");
  EXPECT_TRUE(Contains(e, "secagg.consistency_check: must be true")) << e;
  e = ErrorOf("secagg { expected_dropout: 0.5 }");
  EXPECT_TRUE(Contains(e, "secagg.expected_dropout: must be in [0, 0.5)")) << e;
  EXPECT_EQ(ErrorOf("secagg { expected_dropout: 0.45 }"), "");
  e = ErrorOf("server { max_update_norm: -1 }");
  EXPECT_TRUE(Contains(e, "server.max_update_norm")) << e;
  EXPECT_TRUE(Contains(ErrorOf("server { max_update_norm: inf }"), "server.max_update_norm"));
  EXPECT_EQ(ErrorOf("server { max_update_norm: 0 }"), "");
}

TEST(ConfigTest, MissingFileIsNotFound) {
  auto c = LoadRunConfig("/nonexistent/run.textproto");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(),
            "/nonexistent/run.textproto: cannot open config file: No such file or directory");
}

TEST(ConfigTest, LayerListsAndPresetsExpandToOneNet) {
  auto c = ParseRunConfig(
      "model { input_shape { channels: 1 height: 28 width: 28 }"
      " layers { conv2d { out_channels: 6 kernel_size: 5 } } layers { relu {} }"
      " layers { max_pool2d { kernel_size: 2 } }"
      " layers { conv2d { out_channels: 16 kernel_size: 5 } } layers { relu {} }"
      " layers { max_pool2d { kernel_size: 2 } } layers { flatten {} }"
      " layers { linear { out_features: 120 } } layers { relu {} }"
      " layers { linear { out_features: 84 } } layers { relu {} }"
      " layers { linear { out_features: 10 } } }",
      "x.textproto");
  ASSERT_TRUE(c.ok()) << c.status();
  ModelConfig preset;
  preset.set_arch("lenet5");
  auto listed = PlanModel(c->model());
  auto expanded = PlanModel(preset);
  ASSERT_TRUE(listed.ok() && expanded.ok());
  EXPECT_EQ(listed->params, 44426u);
  EXPECT_EQ(expanded->params, 44426u);
  EXPECT_EQ(DescribeNet(*NetFromConfig(c->model())), DescribeNet(*NetFromConfig(preset)));
  // A pool's stride defaults to its kernel, as in PyTorch.
  EXPECT_EQ(listed->layers[2].out.h, 12u);
  ModelConfig mlp;
  mlp.add_hidden(200);
  mlp.add_hidden(200);
  EXPECT_EQ(PlanModel(mlp)->params, 199210u);
}

TEST(ConfigTest, BadLayerListsAreErrorsNamingTheLayer) {
  const std::string image = "model { input_shape { channels: 1 height: 4 width: 4 } ";
  EXPECT_TRUE(Contains(ErrorOf(image + "layers { conv2d { out_channels: 2 kernel_size: 5 } }"
                                       " layers { flatten {} } layers { linear { out_features: 10 "
                                       "} } }"),
                       "model: layers[0] (conv2d): kernel 5 does not fit the input 1x4x4"));
  EXPECT_TRUE(Contains(ErrorOf(image + "layers { linear { out_features: 10 } } }"),
                       "model: layers[0] (linear): takes a flat input, got 1x4x4; put a flatten"));
  EXPECT_TRUE(
      Contains(ErrorOf(image + "layers { flatten {} } layers { linear { out_features: 3 } } }"),
               "the last layer gives 3x1x1 outputs, but num_classes is 10"));
  EXPECT_TRUE(Contains(ErrorOf(image + "layers { conv2d { out_channels: 0 kernel_size: 1 } } }"),
                       "layers[0] (conv2d): out_channels must be in [1, 65536]"));
  EXPECT_TRUE(
      Contains(ErrorOf(image + "layers { conv2d { out_channels: 1 kernel_size: 3 padding: 3 }"
                               " } }"),
               "padding 3 must be smaller than the kernel 3"));
  EXPECT_TRUE(Contains(ErrorOf(image + "layers { max_pool2d { kernel_size: 2 stride: 0 } } }"),
                       "layers[0] (max_pool2d): stride must be in [1, 64]"));
  EXPECT_TRUE(Contains(ErrorOf(image + "layers { } }"), "model.layers[0]: names no layer"));
  EXPECT_TRUE(Contains(ErrorOf("model { arch: \"mlp\" layers { flatten {} } }"),
                       "model.arch: \"mlp\" is a preset"));
  EXPECT_TRUE(
      Contains(ErrorOf("model { input_dim: 100 input_shape { channels: 1 height: 28 width: 28 "
                       "} }"),
               "model.input_shape: 784 features, but input_dim is 100"));
  EXPECT_TRUE(Contains(ErrorOf("model { arch: \"lenet5\" input_dim: 100 }"),
                       "lenet5 on input_dim 100 needs an input_shape"));
  EXPECT_TRUE(Contains(ErrorOf("model { input_shape { channels: 0 } layers { flatten {} } }"),
                       "input_shape 0x1x1"));
  // Too big for memory: parameters, then the step's floats, are capped.
  EXPECT_TRUE(Contains(ErrorOf("model { input_shape { channels: 1 height: 1024 width: 1024 }"
                               " num_classes: 2 layers { conv2d { out_channels: 64 kernel_size: 3 "
                               "padding: 1 } } layers { flatten {} } layers { linear { "
                               "out_features: 2 } } }"),
                       "parameters; at most 67108864 (2^26) are supported"));
  std::string e = ErrorOf(
      "model { input_shape { channels: 1 height: 64 width: 64 } num_classes: 2 "
      "layers { conv2d { out_channels: 64 kernel_size: 3 padding: 1 } } "
      "layers { flatten {} } layers { linear { out_features: 2 } } }"
      " train { batch_size: 4096 }");
  EXPECT_TRUE(Contains(e, "train.batch_size: 4096 samples x")) << e;
}

TEST(ConfigTest, AnExternalModelIsCheckedAndNamed) {
  const std::string layout =
      "model { external { num_params: 8 layout { name: \"w\" shape: 2 shape: 3 } "
      "layout { name: \"b\" shape: 2 } } }";
  auto ok = ParseRunConfig(layout, "x.textproto");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->model().external().layout(1).name(), "b");
  EXPECT_EQ(ErrorOf("model { external { num_params: 100 } }"), "");  // A layout is optional.
  EXPECT_TRUE(Contains(ErrorOf("model { external { num_params: 9 layout { name: \"w\" shape: 2 "
                               "shape: 3 } layout { name: \"b\" shape: 2 } } }"),
                       "model.external.layout: its tensors hold 8 values, but num_params is 9"));
  EXPECT_TRUE(Contains(ErrorOf("model { external { num_params: 0 } }"),
                       "model.external.num_params: must be in [1, 67108864]"));
  EXPECT_TRUE(Contains(ErrorOf("model { external { num_params: 2 layout { name: \"w\" shape: 1 } "
                               "layout { name: \"w\" shape: 1 } } }"),
                       "model.external.layout[1].name: \"w\" is named twice"));
  EXPECT_TRUE(Contains(ErrorOf("model { external { num_params: 2 layout { shape: 2 } } }"),
                       "model.external.layout[0].name: must not be empty"));
  EXPECT_TRUE(
      Contains(ErrorOf("model { external { num_params: 2 layout { name: \"w\" shape: 0 } } }"),
               "model.external.layout[0].shape: each size must be in [1, 2^26]"));
  EXPECT_TRUE(Contains(ErrorOf("model { arch: \"lenet5\" external { num_params: 2 } }"),
                       "model.external: a model the clients bring takes no arch"));
  EXPECT_TRUE(Contains(ErrorOf("mode: DATA_PARALLEL data { train_shard: \"t\" } "
                               "model { external { num_params: 2 } }"),
                       "DATA_PARALLEL trains Cohort's own models"));
  EXPECT_TRUE(
      Contains(ErrorOf("data { test_shard: \"t\" } model { external { num_params: 2 } }"),
               "data.test_shard: the coordinator cannot evaluate a model the clients bring"));
  EXPECT_TRUE(Contains(ErrorOf("model { external { num_params: 2 } } train { batch_size: 0 }"),
                       "train.batch_size: must be in [1, 65536]"));
  // Nothing builds it in C++: the native trainer, the simulator and the
  // worker all come through NetFromConfig.
  auto net = NetFromConfig(ok->model());
  EXPECT_TRUE(Contains(std::string(net.status().message()),
                       "model.external: the run's model is "
                       "the clients' own"));
}

TEST(ConfigTest, FederatedEvaluationTakesAnIntervalInRange) {
  auto c = ParseRunConfig("rounds { federated_eval_every: 5 }", "x.textproto");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rounds().federated_eval_every(), 5u);
  EXPECT_TRUE(Contains(ErrorOf("rounds { federated_eval_every: 1000001 }"),
                       "rounds.federated_eval_every: must be in [0, 1000000] (0: never)"));
}

TEST(ConfigTest, ARunResumesOnlyWithItsOwnConfigOrALongerOne) {
  auto stored = ParseRunConfig(
      "seed: 3 model { arch: \"logreg\" input_dim: 4 num_classes: 2 } "
      "train { learning_rate: 0.05 } rounds { num_rounds: 5 }",
      "stored");
  ASSERT_TRUE(stored.ok()) << stored.status();
  const std::string text = ToText(*stored);
  EXPECT_TRUE(CheckResumable(text, *stored).ok());
  RunConfig longer = *stored;  // More rounds, or more data-parallel epochs.
  longer.mutable_rounds()->set_num_rounds(9);
  longer.mutable_data_parallel()->set_epochs(4);
  EXPECT_TRUE(CheckResumable(text, longer).ok());
  RunConfig explicit_default = *stored;  // Unset and set to the default are one.
  explicit_default.mutable_train()->set_batch_size(explicit_default.train().batch_size());
  EXPECT_TRUE(CheckResumable(text, explicit_default).ok());
  RunConfig other = *stored;
  other.mutable_train()->set_learning_rate(0.1f);
  other.set_seed(4);
  const Status s = CheckResumable(text, other);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "train.learning_rate")) << s;
  EXPECT_TRUE(Contains(s.message(), "seed")) << s;
  EXPECT_EQ(CheckResumable("seed: {", *stored).code(), StatusCode::kFailedPrecondition);
}

TEST(ConfigTest, AdaptiveServerOptimizersTakeTheirOwnSettingsOnly) {
  auto ok = ParseRunConfig(
      "server { optimizer: FEDYOGI learning_rate: 0.01 beta_1: 0.8 beta_2: 0.9 tau: 1e-4 }", "r");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->server().optimizer(), FEDYOGI);
  EXPECT_EQ(ErrorOf("server { optimizer: FEDADAGRAD learning_rate: 0.1 beta_1: 0 }"), "");
  EXPECT_EQ(ErrorOf("server { momentum: 0.9 }"), "");  // FedAvgM as before.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"server { beta_1: 0.5 }",
       "server.beta_1: a setting of the adaptive server optimizers, but server.optimizer is "
       "FEDAVG (set FEDADAM, FEDYOGI or FEDADAGRAD, or leave server.beta_1 out)"},
      {"server { tau: 0.1 }", "server.tau: a setting of the adaptive server optimizers"},
      {"server { optimizer: FEDADAM learning_rate: 0.1 momentum: 0.9 }",
       "server.momentum: FedAvgM's momentum does not combine with server.optimizer FEDADAM, "
       "which keeps its own first moment (server.beta_1)"},
      {"server { optimizer: FEDYOGI }",
       "server.learning_rate: server.optimizer FEDYOGI needs it set: the default 1.0 is "
       "FedAvg's step, far too large an adaptive one (Flower uses 0.1 for FEDADAM and "
       "FEDADAGRAD, 0.01 for FEDYOGI)"},
      {"server { optimizer: FEDADAGRAD learning_rate: 0.1 beta_2: 0.9 }",
       "server.beta_2: server.optimizer FEDADAGRAD adds up every squared delta without decay; "
       "beta_2 is FEDADAM's and FEDYOGI's"},
      {"server { optimizer: FEDADAM learning_rate: 0.1 beta_1: 1 }",
       "server.beta_1: must be in [0, 1), got 1"},
      {"server { optimizer: FEDADAM learning_rate: 0.1 beta_2: nan }",
       "server.beta_2: must be in [0, 1), got nan"},
      {"server { optimizer: FEDADAM learning_rate: 0.1 tau: 0 }",
       "server.tau: must be in [1e-18, 1e+06], got 0"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } server { optimizer: FEDADAM }",
       "server.optimizer: a federated server step; DATA_PARALLEL workers are trusted"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } server { learning_rate: 0.5 }",
       "server.learning_rate: a setting of federated rounds; DATA_PARALLEL workers step their "
       "own optimizer (train.*) on all-reduced gradients and have no rounds; leave it out"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } server { momentum: 0.9 }",
       "server.momentum: a setting of federated rounds"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } secagg { l2_clip: 1 }",
       "secagg.l2_clip: a setting of federated rounds"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } rounds { federated_eval_every: 2 }",
       "rounds.federated_eval_every: a setting of federated rounds"},
      {"data_parallel { epochs: 2 }",
       "data_parallel: settings of mode DATA_PARALLEL, but mode is FEDERATED (its rounds are "
       "rounds.num_rounds of local training); set mode: DATA_PARALLEL or leave data_parallel "
       "out"},
  };
  for (const auto& [text, message] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), "x.textproto: " + message)) << ErrorOf(text);
  }
}

TEST(ConfigTest, ARobustRuleNeedsPlainRoundsItsOwnSettingsAndEnoughClients) {
  const std::string plain = "secagg { aggregation: PLAIN } ";
  EXPECT_EQ(ErrorOf(plain + "rounds { min_clients: 3 } server { robust { rule: MEDIAN } }"), "");
  EXPECT_EQ(ErrorOf(plain + "rounds { min_clients: 5 } server { robust { rule: TRIMMED_MEAN "
                            "trim_fraction: 0.2 } }"),
            "");
  EXPECT_EQ(ErrorOf(plain + "rounds { min_clients: 20 } server { robust { rule: TRIMMED_MEAN "
                            "trim_fraction: 0.35 } }"),
            "");
  EXPECT_EQ(ErrorOf(plain + "rounds { min_clients: 5 } server { robust { rule: KRUM } }"), "");
  EXPECT_EQ(ErrorOf(plain + "rounds { min_clients: 7 } server { optimizer: FEDADAM "
                            "learning_rate: 0.1 robust { rule: BULYAN byzantine_clients: 1 } }"),
            "");
  EXPECT_EQ(ErrorOf(plain + "rounds { min_clients: 7 } server { robust { rule: MULTI_KRUM "
                            "byzantine_clients: 2 multi_krum_m: 5 } }"),
            "");
  const std::vector<std::pair<std::string, std::string>> bad = {
      // The default aggregation is SECAGG_PLUS.
      {"server { robust { rule: MEDIAN } }",
       "server.robust.rule: MEDIAN needs every client's update, but secagg.aggregation "
       "SECAGG_PLUS shows the coordinator only the sum of the masked updates; set "
       "secagg.aggregation: PLAIN (a coordinator trusted with each update) or leave "
       "server.robust out"},
      {"secagg { aggregation: SECAGG } rounds { min_clients: 5 } server { robust { rule: KRUM } }",
       "server.robust.rule: KRUM needs every client's update, but secagg.aggregation SECAGG "
       "shows the coordinator only the sum"},
      {plain + "server { robust { } }",
       "server.robust.rule: must be MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM or BULYAN"},
      {plain + "server { robust { rule: MEDIAN } }",
       "server.robust.rule: MEDIAN of fewer than 3 updates is their mean, and rounds.min_clients "
       "is 2 (a round commits with as few); raise rounds.min_clients to 3"},
      {plain + "rounds { min_clients: 9 } server { robust { rule: TRIMMED_MEAN } }",
       "server.robust.trim_fraction: 0.1 of rounds.min_clients 9 updates rounds down to 0 cut "
       "from each end (a round commits with as few), which is the plain mean; raise "
       "trim_fraction to at least 1 / rounds.min_clients or raise rounds.min_clients"},
      {plain + "rounds { min_clients: 4 } server { robust { rule: TRIMMED_MEAN trim_fraction: 0.2 "
               "} }",
       "server.robust.trim_fraction: 0.2 of rounds.min_clients 4 updates rounds down to 0"},
      {plain + "rounds { min_clients: 3 } server { robust { rule: MEDIAN trim_fraction: 0.1 } }",
       "server.robust.trim_fraction: a setting of TRIMMED_MEAN, but server.robust.rule is MEDIAN"},
      {plain + "server { robust { rule: TRIMMED_MEAN byzantine_clients: 1 } }",
       "server.robust.byzantine_clients: a setting of KRUM, MULTI_KRUM and BULYAN, but "
       "server.robust.rule is TRIMMED_MEAN"},
      {plain + "rounds { min_clients: 5 } server { robust { rule: KRUM multi_krum_m: 2 } }",
       "server.robust.multi_krum_m: a setting of MULTI_KRUM, but server.robust.rule is KRUM"},
      {plain + "server { robust { rule: TRIMMED_MEAN trim_fraction: 0.5 } }",
       "server.robust.trim_fraction: must be in [0, 0.5), got 0.5"},
      {plain + "server { robust { rule: KRUM } }",
       "server.robust.byzantine_clients: KRUM tolerating f = 1 Byzantine clients needs n >= "
       "2f + 3 = 5 updates a round, but rounds.min_clients is 2 (a round commits with as "
       "few); raise rounds.min_clients or lower byzantine_clients"},
      {plain + "rounds { min_clients: 10 } server { robust { rule: BULYAN byzantine_clients: 2 } }",
       "server.robust.byzantine_clients: BULYAN tolerating f = 2 Byzantine clients needs n >= "
       "4f + 3 = 11 updates a round, but rounds.min_clients is 10"},
      {plain + "rounds { min_clients: 5 } server { robust { rule: MULTI_KRUM byzantine_clients: 0 "
               "} }",
       "server.robust.byzantine_clients: MULTI_KRUM tolerating f = 0 Byzantine clients defends "
       "against none (MULTI_KRUM and BULYAN would be the plain mean); set f, at least 1, to the "
       "Byzantine clients to tolerate"},
      {plain + "rounds { min_clients: 5 } server { robust { rule: BULYAN byzantine_clients: 0 } }",
       "server.robust.byzantine_clients: BULYAN tolerating f = 0"},
      {plain + "rounds { min_clients: 5 } server { robust { rule: MULTI_KRUM multi_krum_m: 5 } }",
       "server.robust.multi_krum_m: must be in [1, rounds.min_clients - byzantine_clients] = "
       "[1, 4] (0: n - f), got 5"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } server { robust { rule: MEDIAN } }",
       "server.robust: a federated server step; DATA_PARALLEL workers are trusted"},
  };
  for (const auto& [text, message] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), "x.textproto: " + message)) << ErrorOf(text);
  }
}

// FedProx's mu and SecAgg+'s L2 bound: accepted where they mean something,
// errors naming the field otherwise (issue 34).
TEST(ConfigTest, FedProxMuAndTheL2BoundAreCheckedAndNamed) {
  EXPECT_EQ(ErrorOf("train { proximal_mu: 0.01 }"), "");
  EXPECT_EQ(ErrorOf("train { proximal_mu: 1 optimizer: ADAM momentum: 0 } "
                    "server { optimizer: FEDADAM learning_rate: 0.1 }"),
            "");
  EXPECT_EQ(ErrorOf("secagg { l2_clip: 2.5 }"), "");
  EXPECT_EQ(ErrorOf("secagg { aggregation: SECAGG l2_clip: 2.5 }"), "");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"train { proximal_mu: -0.1 }",
       "train.proximal_mu: must be a finite value >= 0 (0: no FedProx term), got -0.1"},
      {"train { proximal_mu: nan }", "train.proximal_mu: must be a finite value >= 0"},
      {"train { proximal_mu: inf }", "train.proximal_mu: must be a finite value >= 0"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } train { proximal_mu: 0.1 }",
       "train.proximal_mu: FedProx pulls each client towards its round's model; DATA_PARALLEL "
       "workers keep one model and have no rounds"},
      {"secagg { l2_clip: -1 }",
       "secagg.l2_clip: must be a finite value >= 0 (0: no bound), got -1"},
      {"secagg { l2_clip: inf }", "secagg.l2_clip: must be a finite value >= 0"},
      {"secagg { aggregation: PLAIN l2_clip: 3 }",
       "secagg.l2_clip: a bound clients apply under secure aggregation, but secagg.aggregation "
       "is PLAIN; plain rounds reject an update above server.max_update_norm instead"},
  };
  for (const auto& [text, message] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), "x.textproto: " + message)) << ErrorOf(text);
  }
}

// FedNova (issue 34, item 2): heavy-ball SGD clients, with any server
// optimizer and aggregation but no robust rule or central DP.
TEST(ConfigTest, FedNovaNeedsHeavyBallSgdAndAWeightedMean) {
  EXPECT_EQ(ErrorOf("train { fednova: true }"), "");
  EXPECT_EQ(ErrorOf("train { fednova: true momentum: 0.9 weight_decay: 1e-4 } "
                    "server { optimizer: FEDADAM learning_rate: 0.1 } secagg { l2_clip: 2 }"),
            "");
  EXPECT_EQ(ErrorOf("train { fednova: true } server { momentum: 0.9 } "
                    "secagg { aggregation: PLAIN }"),
            "");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } train { fednova: true }",
       "train.fednova: FedNova normalises each client's round of local steps; DATA_PARALLEL "
       "workers step together and have no rounds"},
      {"train { fednova: true optimizer: ADAM }",
       "train.fednova: needs train.optimizer SGD (the normaliser of ADAM's steps is not "
       "defined)"},
      {"train { fednova: true momentum: 0.9 nesterov: true }",
       "train.fednova: the normaliser is heavy-ball momentum's; set train.nesterov false and "
       "train.dampening 0"},
      {"train { fednova: true momentum: 0.9 dampening: 0.1 }",
       "train.fednova: the normaliser is heavy-ball momentum's"},
      {"train { fednova: true proximal_mu: 0.01 }",
       "train.fednova: with FedProx's term (train.proximal_mu) the steps have another "
       "normaliser, which is not built; leave one of them out"},
      {"train { fednova: true } secagg { aggregation: PLAIN } "
       "rounds { min_clients: 3 } server { robust { rule: MEDIAN } }",
       "train.fednova: server.robust replaces the weighted mean that FedNova rescales by the "
       "clients' tau_eff; leave one of them out"},
      {"train { fednova: true } secagg { aggregation: PLAIN } "
       "privacy { noise_multiplier: 1 clip_norm: 1 }",
       "train.fednova: privacy's noise is calibrated to the mean of clipped updates, which "
       "FedNova would rescale by the clients' own tau_eff; leave one of them out"},
  };
  for (const auto& [text, message] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), "x.textproto: " + message)) << ErrorOf(text);
  }
}

// SCAFFOLD (issue 34, item 2): SGD clients (momentum allowed, as in
// NIID-Bench), under secure aggregation or plain, without the rules that
// replace or rescale the sums its variates need.
TEST(ConfigTest, ScaffoldNeedsSgdAndPlainSums) {
  EXPECT_EQ(ErrorOf("train { scaffold: true }"), "");
  EXPECT_EQ(ErrorOf("train { scaffold: true momentum: 0.9 weight_decay: 1e-5 } "
                    "secagg { aggregation: PLAIN }"),
            "");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } train { scaffold: true }",
       "train.scaffold: SCAFFOLD corrects each client's round of local steps; DATA_PARALLEL "
       "workers step together and have no rounds"},
      {"train { scaffold: true optimizer: ADAM }",
       "train.scaffold: needs train.optimizer SGD (c_i+ = c_i - c + (x - y) / (K lr) is SGD's; "
       "ADAM's steps are not)"},
      {"train { scaffold: true fednova: true }",
       "train.scaffold: train.fednova rescales the deltas that SCAFFOLD's variates are computed "
       "from; leave one of them out"},
      {"train { scaffold: true } secagg { aggregation: PLAIN } "
       "rounds { min_clients: 3 } server { robust { rule: MEDIAN } }",
       "train.scaffold: server.robust replaces the sums that SCAFFOLD's control variates need; "
       "leave one of them out"},
      {"train { scaffold: true } secagg { aggregation: PLAIN } "
       "privacy { noise_multiplier: 1 clip_norm: 1 }",
       "train.scaffold: privacy's clipping and noise cover the model's update, not the control "
       "variates that would ride with it; leave one of them out"},
      {"train { scaffold: true } model { external { num_params: 8 } }",
       "train.scaffold: model.external is trained by the Python client's fit, which does not "
       "apply SCAFFOLD's control variates (every client would refuse every round); leave one of "
       "them out"},
  };
  for (const auto& [text, message] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), "x.textproto: " + message)) << ErrorOf(text);
  }
}

// FedBuff (issue 34, item 5): groups of buffer_size, concurrency a multiple
// of it, and every setting that needs whole synchronous cohorts refused,
// naming both fields and why.
TEST(ConfigTest, FedBuffGroupsAndWhatDoesNotComposeWithThem) {
  EXPECT_EQ(ErrorOf("fedbuff {}"), "");
  EXPECT_EQ(ErrorOf("fedbuff { buffer_size: 5 concurrency: 15 } rounds { min_clients: 4 }"), "");
  // Per group, FedNova's normalised mean and (plain) a robust rule compose.
  EXPECT_EQ(ErrorOf("fedbuff { buffer_size: 5 concurrency: 10 } train { fednova: true }"), "");
  EXPECT_EQ(ErrorOf("fedbuff { buffer_size: 5 concurrency: 10 } secagg { aggregation: PLAIN } "
                    "rounds { min_clients: 3 } server { robust { rule: MEDIAN } }"),
            "");
  EXPECT_EQ(ErrorOf("fedbuff { buffer_size: 2 concurrency: 4 } secagg { aggregation: PLAIN }"), "");
  const std::string plain = "secagg { aggregation: PLAIN } ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"fedbuff { buffer_size: 0 }", "fedbuff.buffer_size: must be in [1, 100000], got 0"},
      {"fedbuff { buffer_size: 4 concurrency: 10 }",
       "fedbuff.concurrency: must be a multiple of fedbuff.buffer_size 4 (the clients of the "
       "groups in flight), at most 100000, got 10"},
      {"fedbuff { buffer_size: 4 concurrency: 2 }",
       "fedbuff.concurrency: must be a multiple of fedbuff.buffer_size 4"},
      {"fedbuff { buffer_size: 2 concurrency: 4 }",
       "fedbuff.buffer_size: each group is one secure aggregation (secagg.aggregation "
       "SECAGG_PLUS), which needs >= 3 clients (with 2, each could subtract its own update from "
       "the sum and learn the other's); got 2"},
      {"fedbuff { buffer_size: 3 concurrency: 6 } rounds { min_clients: 5 }",
       "fedbuff.buffer_size 3 is below rounds.min_clients 5: a group commits only with "
       "rounds.min_clients updates, so no group could ever commit"},
      {"fedbuff {} rounds { start_clients: 8 }",
       "rounds.start_clients: a fedbuff group starts as soon as fedbuff.buffer_size clients are "
       "free, so there is no first round to wait for; leave rounds.start_clients out"},
      {"fedbuff {} rounds { max_clients_per_round: 8 }",
       "rounds.max_clients_per_round: fedbuff.buffer_size sets how many clients each group has; "
       "leave rounds.max_clients_per_round at 0 and rounds.fraction at 1"},
      {"fedbuff {} rounds { fraction: 0.5 }",
       "rounds.fraction: fedbuff.buffer_size sets how many clients each group has"},
      {"mode: DATA_PARALLEL data { train_shard: \"t\" } fedbuff {}",
       "fedbuff: buffered asynchronous aggregation folds federated clients' updates; mode: "
       "DATA_PARALLEL workers step together on all-reduced gradients and have no updates to "
       "buffer"},
      {plain + "fedbuff {} privacy { noise_multiplier: 1 clip_norm: 1 }",
       "fedbuff and privacy do not compose: privacy's accountant takes each round's cohort as a "
       "random sample of the clients (amplification by subsampling, q = cohort / population), "
       "but under fedbuff a client joins whichever group is open when it becomes free, so who "
       "contributes follows the clients' speed, not a random draw (and distributed DP's clients "
       "count their noised rounds by round number, which is 1 in every group); leave one of them "
       "out"},
      {"fedbuff {} train { scaffold: true }",
       "fedbuff and train.scaffold are not built together: SCAFFOLD's server variate c must take "
       "each group's variate changes in full (c stays the mean of the clients' c_i) while the "
       "group's model mean is weighed by its staleness, and the buffered step weighs the whole "
       "vector; leave one of them out"},
      {"fedbuff {} rounds { federated_eval_every: 5 }",
       "fedbuff and rounds.federated_eval_every are not built together: federated evaluation "
       "scores the model a synchronous round starts from, and groups in flight start from "
       "different versions; set rounds.federated_eval_every to 0"},
  };
  for (const auto& [text, message] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), "x.textproto: " + message)) << ErrorOf(text);
  }
}

// Distributed DP (issue 34): secure rounds only, a bounded cohort, and the
// central numbers' ranges.
TEST(ConfigTest, DistributedPrivacyNeedsSecureRoundsAndABoundedCohort) {
  const std::string ddp =
      "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1.1 clip_norm: 0.5 ";
  const std::string bounded = "rounds { max_clients_per_round: 10 } ";
  EXPECT_EQ(ErrorOf(bounded + ddp + "}"), "");
  EXPECT_EQ(ErrorOf(bounded + "secagg { aggregation: SECAGG } " + ddp + "epsilon_budget: 3 }"), "");
  // server.max_update_norm bounds plain rounds only: no conflict here.
  EXPECT_EQ(ErrorOf(bounded + "server { max_update_norm: 0.1 } " + ddp + "}"), "");
  EXPECT_EQ(ErrorOf(bounded + "secagg { aggregation: PLAIN } " + ddp + "}"),
            "x.textproto: privacy.mechanism DISTRIBUTED_SKELLAM: each client adds only its share "
            "of the noise, which hides its update only inside the sum; secagg.aggregation PLAIN "
            "would show the coordinator every update with a fraction of the noise. Set "
            "secagg.aggregation: SECAGG or SECAGG_PLUS, or privacy.mechanism: CENTRAL_GAUSSIAN "
            "for a trusted coordinator");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {ddp + "}",
       "privacy.mechanism DISTRIBUTED_SKELLAM: needs rounds.max_clients_per_round > 0: the "
       "integer grid is chosen at start-up so that the 32-bit sum of at most that many noised "
       "updates does not wrap around"},
      {bounded + "secagg { l2_clip: 2 } " + ddp + "}",
       "privacy.mechanism DISTRIBUTED_SKELLAM: each client clips its update to "
       "privacy.clip_norm itself; leave secagg.l2_clip 0"},
      {bounded + "privacy { mechanism: DISTRIBUTED_SKELLAM clip_norm: 1 }",
       "privacy.noise_multiplier: must be in [0.001, 1e+06], got 0"},
      {bounded + "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1 }",
       "privacy.clip_norm: must be in [1e-09, 1e+06]"},
      {bounded + ddp + "target_delta: 0.5 }",
       "privacy.target_delta: must be in (0, 0.01], got 0.5"},
      {bounded + ddp + "epsilon_budget: -1 }",
       "privacy.epsilon_budget: must be in [0, 1e+06] (0: no budget), got -1"},
      {bounded + "server { robust { rule: MEDIAN } } " + ddp + "}", "server.robust"},
      {bounded + "mode: DATA_PARALLEL data { train_shard: \"t.shard\" } " + ddp + "}",
       "privacy.mechanism DISTRIBUTED_SKELLAM: needs mode: FEDERATED"},
      {"rounds { max_clients_per_round: 10 federated_eval_every: 2 } " + ddp + "}",
       "privacy.mechanism DISTRIBUTED_SKELLAM: rounds.federated_eval_every would have the "
       "clients' evaluation means unmasked without noise, which the accountant does not cover "
       "(the clients leave those slots empty under distributed DP); set "
       "rounds.federated_eval_every to 0 (the coordinator's own test set still evaluates each "
       "round)"},
  };
  for (const auto& [text, want] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), want)) << text << " -> " << ErrorOf(text);
  }
}

// privacy.budget_view: distributed DP's two epsilons; RELEASED_MODEL means
// nothing for central DP, whose one epsilon is already amplified.
TEST(ConfigTest, BudgetViewReleasedModelOnlyForDistributedPrivacy) {
  const std::string bounded = "rounds { max_clients_per_round: 10 } ";
  EXPECT_EQ(ErrorOf(bounded + "privacy { mechanism: DISTRIBUTED_SKELLAM noise_multiplier: 1 "
                              "clip_norm: 1 epsilon_budget: 8 budget_view: RELEASED_MODEL }"),
            "");
  EXPECT_EQ(ErrorOf("secagg { aggregation: PLAIN } privacy { noise_multiplier: 1 clip_norm: 1 "
                    "budget_view: AGAINST_COORDINATOR }"),
            "");
  EXPECT_EQ(ErrorOf("secagg { aggregation: PLAIN } privacy { noise_multiplier: 1 clip_norm: 1 "
                    "epsilon_budget: 8 budget_view: RELEASED_MODEL }"),
            "x.textproto: privacy.budget_view: RELEASED_MODEL is distributed DP's amplified view "
            "and needs privacy.mechanism: DISTRIBUTED_SKELLAM; with privacy.mechanism: "
            "CENTRAL_GAUSSIAN the one epsilon already amplifies by the cohort's sampling (leave "
            "budget_view out)");
}

// Central DP (issue 34): plain federated rounds only, and its numbers in range.
TEST(ConfigTest, CentralPrivacyNeedsPlainRoundsAndItsNumbersInRange) {
  const std::string plain = "secagg { aggregation: PLAIN } ";
  const std::string dp = "privacy { noise_multiplier: 1.1 clip_norm: 0.5 ";
  EXPECT_EQ(ErrorOf(plain + dp + "}"), "");
  EXPECT_EQ(ErrorOf(plain + dp + "target_delta: 1e-6 epsilon_budget: 8 }"), "");
  EXPECT_EQ(ErrorOf(plain + dp + "target_delta: 0.01 }"), "");
  // server.max_update_norm 0 (no bound) or at least the clip: accepted,
  // the same number in both fields too (compared as the float field holds it).
  EXPECT_EQ(ErrorOf(plain + "server { max_update_norm: 0 } privacy { noise_multiplier: 1 "
                            "clip_norm: 250 }"),
            "");
  EXPECT_EQ(ErrorOf(plain + "server { max_update_norm: 0.7 } privacy { noise_multiplier: 1 "
                            "clip_norm: 0.7 }"),
            "");
  // The default aggregation is SECAGG_PLUS.
  EXPECT_EQ(
      ErrorOf(dp + "}"),
      "x.textproto: privacy: central differential privacy clips and noises each update on the "
      "coordinator, but secagg.aggregation SECAGG_PLUS hides the updates from it; the "
      "coordinator would have to be trusted with the un-noised sum, which secure "
      "aggregation is there to deny it. Set secagg.aggregation: PLAIN for central DP (a "
      "trusted coordinator), or set privacy.mechanism: DISTRIBUTED_SKELLAM (the clients' "
      "noise under secure aggregation)");
  EXPECT_TRUE(Contains(ErrorOf("secagg { aggregation: SECAGG } " + dp + "}"),
                       "but secagg.aggregation SECAGG hides the updates"));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {plain + "rounds { min_clients: 3 } server { robust { rule: MEDIAN } } " + dp + "}",
       "privacy: the noise is calibrated to the sum of clipped updates; server.robust"},
      {plain + "privacy { clip_norm: 1 }",
       "privacy.noise_multiplier: must be in [0.001, 1e+06], got 0"},
      {plain + "privacy { noise_multiplier: 1 }", "privacy.clip_norm: must be in [1e-09, 1e+06]"},
      {plain + "privacy { noise_multiplier: 1e9 clip_norm: 1 }",
       "privacy.noise_multiplier: must be in [0.001, 1e+06], got 1e+09"},
      {plain + dp + "target_delta: 1 }", "privacy.target_delta: must be in (0, 0.01], got 1"},
      {plain + dp + "target_delta: 0 }", "privacy.target_delta: must be in (0, 0.01], got 0"},
      // Would make epsilon 0 (negative before clamping) at sigma 20.
      {plain + dp + "target_delta: 0.5 }",
       "privacy.target_delta: must be in (0, 0.01], got 0.5 (delta is the chance the guarantee "
       "fails outright; keep it well below 1 / the number of clients, e.g. the default 1e-5)"},
      {plain + dp + "target_delta: 0.0100001 }",
       "privacy.target_delta: must be in (0, 0.01], got 0.0100001"},
      {plain + dp + "epsilon_budget: -1 }",
       "privacy.epsilon_budget: must be in [0, 1e+06] (0: no budget), got -1"},
      // The default server.max_update_norm is 100.
      {plain + "privacy { noise_multiplier: 1 clip_norm: 250 }",
       "server.max_update_norm 100 is below privacy.clip_norm 250: under central DP it bounds "
       "the clip norm (updates are clipped, never refused for their length); set "
       "server.max_update_norm to 0 (no bound) or to at least privacy.clip_norm"},
      {plain + "server { max_update_norm: 0.3 } " + dp + "}",
       "server.max_update_norm 0.3 is below privacy.clip_norm 0.5"},
      {"mode: DATA_PARALLEL data { train_shard: \"t.shard\" } " + plain + dp + "}",
       "privacy: central differential privacy needs mode: FEDERATED (it is DP-FedAvg, over "
       "federated rounds); mode: DATA_PARALLEL has no per-example clipping (DP-SGD is not "
       "built): set mode: FEDERATED or leave privacy out"},
  };
  for (const auto& [text, want] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), want)) << text << "\n -> " << ErrorOf(text);
  }
}

// privacy.adaptive_clip (Andrew et al. 2021): each number checked, naming
// the field; a valid one runs with central DP and is refused with
// distributed DP.
TEST(ConfigTest, AdaptiveClippingChecksItsNumbersAndRunsWithCentralDpOnly) {
  const std::string dp =
      "secagg { aggregation: PLAIN } privacy { noise_multiplier: 1 clip_norm: 1 ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {dp + "adaptive_clip { target_quantile: 0 clipped_count_stddev: 2 } }",
       "x.textproto: privacy.adaptive_clip.target_quantile: must be in (0, 1) (the fraction of "
       "updates left unclipped), got 0"},
      {dp + "adaptive_clip { target_quantile: 1 clipped_count_stddev: 2 } }",
       "x.textproto: privacy.adaptive_clip.target_quantile: must be in (0, 1) (the fraction of "
       "updates left unclipped), got 1"},
      {dp + "adaptive_clip { learning_rate: 0 clipped_count_stddev: 2 } }",
       "x.textproto: privacy.adaptive_clip.learning_rate: must be in [1e-06, 10], got 0"},
      {dp + "adaptive_clip { learning_rate: 11 clipped_count_stddev: 2 } }",
       "x.textproto: privacy.adaptive_clip.learning_rate: must be in [1e-06, 10], got 11"},
      {dp + "adaptive_clip { } }",
       "x.textproto: privacy.adaptive_clip.clipped_count_stddev: must be finite and above "
       "privacy.noise_multiplier / 2 = 0.5, got 0 (the count's noise takes a share of the "
       "privacy budget, and the update keeps noise multiplier (z^-2 - (2 sigma_b)^-2)^-1/2, "
       "which needs 2 sigma_b > z; the paper suggests the expected cohort / 20)"},
      {dp + "adaptive_clip { clipped_count_stddev: 0.5 } }",
       "x.textproto: privacy.adaptive_clip.clipped_count_stddev: must be finite and above "
       "privacy.noise_multiplier / 2 = 0.5, got 0.5"},
      {dp + "adaptive_clip { clipped_count_stddev: inf } }",
       "x.textproto: privacy.adaptive_clip.clipped_count_stddev: must be finite and above "
       "privacy.noise_multiplier / 2 = 0.5, got inf"},
  };
  for (const auto& [text, want] : bad) {
    EXPECT_TRUE(Contains(ErrorOf(text), want)) << text << "\n -> " << ErrorOf(text);
  }
  // Central DP runs it (coordinator/strategy_dp.h).
  EXPECT_EQ(ErrorOf(dp + "adaptive_clip { target_quantile: 0.9 learning_rate: 0.2 "
                         "clipped_count_stddev: 2.5 } }"),
            "");
  // So does distributed DP: the bit rides in the masked vector with the
  // clients' noise share (it was refused before that was built).
  EXPECT_EQ(ErrorOf("rounds { max_clients_per_round: 10 } privacy { mechanism: "
                    "DISTRIBUTED_SKELLAM noise_multiplier: 1 clip_norm: 1 adaptive_clip { "
                    "clipped_count_stddev: 2.5 } }"),
            "");
  // Its count noise is checked the same way.
  EXPECT_TRUE(Contains(ErrorOf("rounds { max_clients_per_round: 10 } privacy { mechanism: "
                               "DISTRIBUTED_SKELLAM noise_multiplier: 1 clip_norm: 1 "
                               "adaptive_clip { clipped_count_stddev: 0.5 } }"),
                       "privacy.adaptive_clip.clipped_count_stddev: must be finite and above "
                       "privacy.noise_multiplier / 2 = 0.5, got 0.5"));
  // Under secure aggregation central DP itself is refused first.
  EXPECT_TRUE(Contains(ErrorOf("privacy { noise_multiplier: 1 clip_norm: 1 adaptive_clip { "
                               "clipped_count_stddev: 2.5 } }"),
                       "privacy: central differential privacy clips and noises each update"));
}

}  // namespace
}  // namespace cohort::config
