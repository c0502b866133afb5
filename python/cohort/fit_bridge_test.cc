#include "python/cohort/fit_bridge.h"

#include <gtest/gtest.h>

#include <thread>

namespace cohort::python {
namespace {

using std::chrono::milliseconds;

// Takes the bridge's next call, waiting as long as it takes (bounded).
FitBridge::Call* Take(FitBridge& bridge) {
  bool closed = false;
  for (int i = 0; i < 500; ++i) {
    if (FitBridge::Call* call = bridge.Next(milliseconds(20), &closed)) return call;
  }
  return nullptr;
}

TEST(FitBridgeTest, TheCallReachesThePythonSideWithItsBufferAndItsResultComesBack) {
  FitBridge bridge;
  client::TrainTask task;
  task.round = 3;
  std::vector<float> params = {1, 2, 3};
  StatusOr<train::TrainResult> got = CancelledError("not run");
  std::thread worker([&] { got = bridge.Train(task, params, nullptr); });
  FitBridge::Call* call = Take(bridge);
  ASSERT_NE(call, nullptr);
  EXPECT_EQ(call->task->round, 3u);
  EXPECT_EQ(call->params.data(), params.data());  // The daemon's buffer, not a copy.
  call->params[0] = 9;
  bridge.Complete(call, train::TrainResult{.mean_loss = 0.5, .samples = 7});
  worker.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->samples, 7u);
  EXPECT_EQ(params[0], 9);
}

TEST(FitBridgeTest, ATakenCallIsWaitedForEvenWhenCancelled) {
  FitBridge bridge;
  client::TrainTask task;
  std::vector<float> params(4);
  std::atomic<bool> cancel{false};
  StatusOr<train::TrainResult> got = CancelledError("not run");
  std::thread worker([&] { got = bridge.Train(task, params, &cancel); });
  FitBridge::Call* call = Take(bridge);
  ASSERT_NE(call, nullptr);
  cancel = true;  // fit is running: its array still views `params`.
  bridge.Refuse();
  bridge.Complete(call, train::TrainResult{.samples = 11});
  worker.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->samples, 11u);
}

TEST(FitBridgeTest, ACallNotYetTakenEndsCancelledAndIsNeverTaken) {
  FitBridge bridge;
  client::TrainTask task;
  std::vector<float> params(4);
  std::atomic<bool> cancel{true};
  StatusOr<train::TrainResult> got = train::TrainResult{};
  std::thread worker([&] { got = bridge.Train(task, params, &cancel); });
  worker.join();
  EXPECT_EQ(got.status().code(), StatusCode::kCancelled);
  bool closed = true;
  EXPECT_EQ(bridge.Next(milliseconds(0), &closed), nullptr);
  EXPECT_FALSE(closed);
}

TEST(FitBridgeTest, AfterRefuseNoCallIsMadeAndCloseIsReported) {
  FitBridge bridge;
  bridge.Refuse();
  client::TrainTask task;
  std::vector<float> params(4);
  auto got = bridge.Train(task, params, nullptr);
  EXPECT_EQ(got.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(got.status().message(), "the client is stopping");
  bool closed = false;
  EXPECT_EQ(bridge.Next(milliseconds(0), &closed), nullptr);
  EXPECT_FALSE(closed);
  bridge.Close();
  EXPECT_EQ(bridge.Next(milliseconds(1000), &closed), nullptr);
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace cohort::python
