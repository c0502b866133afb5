#include "client/wait_report.h"

#include <gtest/gtest.h>
#include <zmq.h>

namespace cohort::client {
namespace {

const WaitContext kContext{.coordinator = "tcp://127.0.0.1:7000",
                           .identity = "keys/client-003.key",
                           .coordinator_key = "keys/coordinator.pub",
                           .insecure = false};

TEST(WaitReportTest, NothingListening) {
  net::LinkEvents e;
  net::ApplyLinkEvent(e, ZMQ_EVENT_CONNECT_RETRIED, 100, 200);
  EXPECT_EQ(ClassifyWait(e, false), WaitReason::kNoAnswer);
  WaitReporter r(kContext, 3000, 10000);
  EXPECT_FALSE(r.Step(e, false, 2999));  // Within the grace: a normal start.
  auto line = r.Step(e, false, 3000);
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "waiting for the coordinator at tcp://127.0.0.1:7000: no answer for 3 s (is it "
            "running, and is the address right?)");
  EXPECT_FALSE(r.Step(e, false, 12999));  // Not again until the repeat.
  auto again = r.Step(e, false, 13000);
  ASSERT_TRUE(again);
  EXPECT_NE(again->find("no answer for 13 s"), std::string::npos);
}

TEST(WaitReportTest, RefusedKeyIsSaidAtOnceAndNamesTheFiles) {
  net::LinkEvents e;
  net::ApplyLinkEvent(e, ZMQ_EVENT_CONNECTED, 0, 10);
  net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400, 20);
  net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, 20);  // The close after.
  net::ApplyLinkEvent(e, ZMQ_EVENT_DISCONNECTED, 0, 20);
  EXPECT_EQ(ClassifyWait(e, false), WaitReason::kRefused);
  WaitReporter r(kContext);
  auto line = r.Step(e, false, 20);
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "the coordinator at tcp://127.0.0.1:7000 refused this client's key: is "
            "client-003.pub in its allowlist (--allow), and is --coordinator-key "
            "keys/coordinator.pub its key?");
}

TEST(WaitReportTest, MechanismMismatchNamesInsecure) {
  net::LinkEvents e;
  net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL,
                      ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, 5);
  EXPECT_EQ(ClassifyWait(e, false), WaitReason::kMechanism);
  WaitContext insecure = kContext;
  insecure.insecure = true;
  EXPECT_NE(ExplainWait(WaitReason::kMechanism, e, 0, insecure)
                .find("uses CURVE and this client runs with --insecure"),
            std::string::npos);
  EXPECT_NE(ExplainWait(WaitReason::kMechanism, e, 0, kContext).find("runs without CURVE"),
            std::string::npos);
}

TEST(WaitReportTest, ClosedDuringHandshakeAsksForTheCoordinatorKey) {
  net::LinkEvents e;
  for (TimeMs t = 0; t < 3; ++t) {
    net::ApplyLinkEvent(e, ZMQ_EVENT_CONNECTED, 0, t * 1000);
    net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, 104, t * 1000 + 1);
    net::ApplyLinkEvent(e, ZMQ_EVENT_DISCONNECTED, 0, t * 1000 + 1);
  }
  EXPECT_EQ(ClassifyWait(e, false), WaitReason::kClosed);
  WaitReporter r(kContext);
  auto line = r.Step(e, false, 3000);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("closed the connection during the CURVE handshake (3 times in 3 s): is "
                       "--coordinator-key keys/coordinator.pub the coordinator's key?"),
            std::string::npos);
}

TEST(WaitReportTest, LostCoordinatorThenBack) {
  net::LinkEvents e;
  net::ApplyLinkEvent(e, ZMQ_EVENT_CONNECTED, 0, 10);
  net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0, 20);
  WaitReporter r(kContext);
  EXPECT_EQ(ClassifyWait(e, false), WaitReason::kNoWelcome);
  EXPECT_FALSE(r.Step(e, true, 100));  // Up and welcomed: quiet.
  net::ApplyLinkEvent(e, ZMQ_EVENT_DISCONNECTED, 0, 50000);
  net::ApplyLinkEvent(e, ZMQ_EVENT_CONNECT_RETRIED, 0, 50100);
  EXPECT_EQ(ClassifyWait(e, true), WaitReason::kLost);
  EXPECT_FALSE(r.Step(e, true, 52000));  // The grace counts from the close.
  auto line = r.Step(e, true, 53000);
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "lost the coordinator at tcp://127.0.0.1:7000 3 s ago (the connection closed); "
            "retrying");
  net::ApplyLinkEvent(e, ZMQ_EVENT_CONNECTED, 0, 54000);
  net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0, 54001);
  auto back = r.Step(e, true, 54002);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, "connected to the coordinator at tcp://127.0.0.1:7000");
  EXPECT_FALSE(r.Step(e, true, 60000));
}

TEST(WaitReportTest, ConnectedButNotWelcomed) {
  net::LinkEvents e;
  net::ApplyLinkEvent(e, ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0, 0);
  WaitReporter r(kContext);
  auto line = r.Step(e, false, 4000);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("has not welcomed this client in 4 s"), std::string::npos);
}

}  // namespace
}  // namespace cohort::client
