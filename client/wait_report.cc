#include "client/wait_report.h"

#include <filesystem>

#include "spdlog/fmt/fmt.h"

namespace cohort::client {

WaitReason ClassifyWait(const net::LinkEvents& e, bool welcomed) {
  if (e.up()) return welcomed ? WaitReason::kNone : WaitReason::kNoWelcome;
  const bool failed_since_up = e.failed && (!e.handshaken || *e.failed >= *e.handshaken);
  if (failed_since_up) {
    switch (e.failure) {
      case net::HandshakeFailure::kRefused:
        return WaitReason::kRefused;
      case net::HandshakeFailure::kMechanism:
        return WaitReason::kMechanism;
      case net::HandshakeFailure::kProtocol:
      case net::HandshakeFailure::kNoDetail:
        return WaitReason::kClosed;
      case net::HandshakeFailure::kNone:
        break;
    }
  }
  if (e.handshaken) return WaitReason::kLost;
  if (e.connected && (!e.disconnected || *e.disconnected < *e.connected)) {
    return WaitReason::kHandshaking;
  }
  return WaitReason::kNoAnswer;
}

namespace {

// "client-003.pub" for --identity keys/client-003.key.
std::string PublicKeyName(const std::string& identity) {
  if (identity.empty()) return "this client's .pub file";
  return std::filesystem::path(identity).replace_extension(".pub").filename().string();
}

std::string CoordinatorKeyName(const WaitContext& c) {
  return c.coordinator_key.empty() ? "--coordinator-key" : "--coordinator-key " + c.coordinator_key;
}

}  // namespace

std::string ExplainWait(WaitReason reason, const net::LinkEvents& e, TimeMs waited_ms,
                        const WaitContext& c) {
  const std::string at = "the coordinator at " + c.coordinator;
  const std::string waited = fmt::format("{:.0f} s", waited_ms / 1000.0);
  switch (reason) {
    case WaitReason::kNone:
      return "";
    case WaitReason::kNoAnswer:
      return fmt::format(
          "waiting for {}: no answer for {} (is it running, and is the address right?)", at,
          waited);
    case WaitReason::kRefused:
      return fmt::format(
          "{} refused this client's key: is {} in its allowlist (--allow), and is {} its key?", at,
          PublicKeyName(c.identity), CoordinatorKeyName(c));
    case WaitReason::kMechanism:
      return c.insecure ? fmt::format(
                              "{} uses CURVE and this client runs with --insecure: start it "
                              "with --identity and --coordinator-key instead",
                              at)
                        : fmt::format(
                              "{} runs without CURVE (--insecure) and this client uses CURVE: "
                              "start both the same way",
                              at);
    case WaitReason::kClosed:
      return fmt::format(
          "{} closed the connection during the CURVE handshake ({} times in {}): is {} the "
          "coordinator's key?",
          at, e.failures, waited, CoordinatorKeyName(c));
    case WaitReason::kLost:
      return fmt::format("lost {} {} ago (the connection closed); retrying", at, waited);
    case WaitReason::kHandshaking:
      return fmt::format("connected to {}, but its handshake has not finished in {}", at, waited);
    case WaitReason::kNoWelcome:
      return fmt::format(
          "connected to {}, but it has not welcomed this client in {} (its log says why)", at,
          waited);
  }
  return "";
}

std::optional<std::string> WaitReporter::Step(const net::LinkEvents& e, bool welcomed, TimeMs now) {
  const WaitReason reason = ClassifyWait(e, welcomed);
  if (reason == WaitReason::kNone) {
    waiting_since_.reset();
    if (said_ == WaitReason::kNone) return std::nullopt;
    said_ = WaitReason::kNone;
    return "connected to the coordinator at " + context_.coordinator;
  }
  if (!waiting_since_) waiting_since_ = reason == WaitReason::kLost ? e.disconnected : e.since;
  const TimeMs waited = now - waiting_since_.value_or(now);
  const bool at_once = reason == WaitReason::kRefused || reason == WaitReason::kMechanism;
  if (!at_once && waited < grace_ms_) return std::nullopt;
  if (reason == said_ && now - said_at_ < repeat_ms_) return std::nullopt;
  said_ = reason;
  said_at_ = now;
  return ExplainWait(reason, e, waited, context_);
}

}  // namespace cohort::client
