#include "train/torch_layout.h"

#include <gtest/gtest.h>

#include <numeric>

#include "proto/config_io.h"

namespace cohort::train {
namespace {

// A flat vector whose every value is its own native index: a tensor read in
// PyTorch's order shows which native value lands where.
std::vector<float> Iota(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

std::vector<float> TensorValues(const TorchLayout& layout, const std::vector<float>& torch,
                                size_t i) {
  const TorchTensor& t = layout.tensors[i];
  return {torch.begin() + t.offset, torch.begin() + t.offset + t.size()};
}

config::ModelConfig ParseModel(const std::string& text) {
  auto config = config::ParseRunConfig("model { " + text + " }", "test");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config->model();
}

// 2x3x3 input, conv2d(2, k2) -> 2x2x2, flatten, linear(2): both
// permutations, worked out by hand.
TEST(TorchLayoutTest, ConvFiltersAndTheFlattenedColumnsArePermutedToPyTorchs) {
  NetSpec spec{Shape{2, 3, 3},
               2,
               {LayerSpec{LayerKind::kConv2d, 2, 2}, LayerSpec{LayerKind::kRelu},
                LayerSpec{LayerKind::kFlatten}, LayerSpec{LayerKind::kLinear, 2}}};
  auto layout = TorchLayoutFor(spec);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->input_shape, (std::vector<uint64_t>{2, 3, 3}));
  ASSERT_EQ(layout->tensors.size(), 4u);
  EXPECT_EQ(layout->tensors[0].name, "0.weight");
  EXPECT_EQ(layout->tensors[0].shape, (std::vector<uint64_t>{2, 2, 2, 2}));  // out, in, kh, kw
  EXPECT_EQ(layout->tensors[1].name, "0.bias");
  EXPECT_EQ(layout->tensors[2].name, "3.weight");
  EXPECT_EQ(layout->tensors[2].shape, (std::vector<uint64_t>{2, 8}));
  EXPECT_EQ(layout->tensors[3].name, "3.bias");
  ASSERT_EQ(layout->num_params(), 36u);

  auto torch = ToTorchOrder(*layout, Iota(36));
  ASSERT_TRUE(torch.ok());
  // Native filter o: [kh][kw][in] at o * 8; PyTorch's: [in][kh][kw].
  EXPECT_EQ(TensorValues(*layout, *torch, 0),
            (std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15}));
  EXPECT_EQ(TensorValues(*layout, *torch, 1), (std::vector<float>{16, 17}));
  // Native columns: pixel-major (pixel * 2 + channel); PyTorch's: channel * 4 + pixel.
  EXPECT_EQ(TensorValues(*layout, *torch, 2),
            (std::vector<float>{18, 20, 22, 24, 19, 21, 23, 25, 26, 28, 30, 32, 27, 29, 31, 33}));
  EXPECT_EQ(TensorValues(*layout, *torch, 3), (std::vector<float>{34, 35}));

  auto back = FromTorchOrder(*layout, *torch);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, Iota(36));
}

TEST(TorchLayoutTest, LeNet5IsTheSequentialOfItsLayersUnderPyTorchsNames) {
  auto layout = TorchLayoutFor(ParseModel("arch: \"lenet5\""));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->input_shape, (std::vector<uint64_t>{1, 28, 28}));
  EXPECT_EQ(layout->num_classes, 10u);
  std::vector<std::string> modules;
  for (const TorchModule& m : layout->modules) modules.push_back(TorchModuleRepr(m));
  EXPECT_EQ(modules,
            (std::vector<std::string>{"nn.Conv2d(1, 6, kernel_size=5, stride=1, padding=0)",
                                      "nn.ReLU()", "nn.MaxPool2d(kernel_size=2, stride=2)",
                                      "nn.Conv2d(6, 16, kernel_size=5, stride=1, padding=0)",
                                      "nn.ReLU()", "nn.MaxPool2d(kernel_size=2, stride=2)",
                                      "nn.Flatten()", "nn.Linear(256, 120)", "nn.ReLU()",
                                      "nn.Linear(120, 84)", "nn.ReLU()", "nn.Linear(84, 10)"}));
  std::vector<std::string> names;
  for (const TorchTensor& t : layout->tensors) names.push_back(t.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias", "7.weight",
                                      "7.bias", "9.weight", "9.bias", "11.weight", "11.bias"}));
  EXPECT_EQ(layout->tensors[2].shape, (std::vector<uint64_t>{16, 6, 5, 5}));
  // One input channel: the first conv's filters keep their order.
  auto torch = ToTorchOrder(*layout, Iota(layout->num_params()));
  ASSERT_TRUE(torch.ok());
  EXPECT_EQ(TensorValues(*layout, *torch, 0), Iota(150));
  // After the convolutions, linear layers keep theirs.
  const TorchTensor& fc2 = layout->tensors[6];
  EXPECT_EQ((*torch)[fc2.offset + 5], static_cast<float>(fc2.offset + 5));
}

TEST(TorchLayoutTest, AnMlpIsLinearLayersOnTheFlatFeaturesInTheNativeOrder) {
  auto layout = TorchLayoutFor(ParseModel("arch: \"mlp\" input_dim: 6 hidden: 4 num_classes: 3"));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->input_shape, (std::vector<uint64_t>{6}));
  ASSERT_EQ(layout->modules.size(), 3u);
  EXPECT_EQ(TorchModuleRepr(layout->modules[0]), "nn.Linear(6, 4)");
  EXPECT_EQ(layout->tensors[2].name, "2.weight");
  EXPECT_EQ(*ToTorchOrder(*layout, Iota(layout->num_params())), Iota(layout->num_params()));
}

TEST(TorchLayoutTest, WhatHasNoSequentialEquivalentIsRefusedNamingTheLayer) {
  config::ModelConfig model;
  model.mutable_external()->set_num_params(10);
  const Status external = TorchLayoutFor(model).status();
  EXPECT_EQ(external.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(external.message().find("model.external"), std::string::npos) << external.ToString();

  // A 1x1 conv after a linear layer plans in Cohort, not in nn.Sequential.
  NetSpec after_linear{
      Shape{4, 1, 1}, 2, {LayerSpec{LayerKind::kLinear, 3}, LayerSpec{LayerKind::kConv2d, 2, 1}}};
  const Status conv = TorchLayoutFor(after_linear).status();
  EXPECT_NE(conv.message().find("layers[1] (conv2d)"), std::string::npos) << conv.ToString();

  model.clear_external();
  model.set_num_classes(1);
  const Status plan = TorchLayoutFor(model).status();
  EXPECT_EQ(plan.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.message().find("num_classes"), std::string::npos) << plan.ToString();
}

TEST(TorchLayoutTest, AVectorOfAnotherLengthIsRefusedNamingBothSizes) {
  auto layout = TorchLayoutFor(ParseModel("arch: \"logreg\" input_dim: 4 num_classes: 2"));
  ASSERT_TRUE(layout.ok());
  const Status s = ToTorchOrder(*layout, Iota(9)).status();
  EXPECT_EQ(s.message(), "model: 9 parameters given, the model has 10");
  EXPECT_EQ(FromTorchOrder(*layout, Iota(11)).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::train
