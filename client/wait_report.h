// Why a client waits, in words, on the client's own side: nothing answers
// at the coordinator's address, the coordinator refused this client's key,
// the two sides disagree on CURVE, the coordinator went away, or it has not
// welcomed this client yet. Read from the connection's monitor
// (net/link_monitor.h) and the session; the daemon prints what Step returns.
#ifndef COHORT_CLIENT_WAIT_REPORT_H_
#define COHORT_CLIENT_WAIT_REPORT_H_

#include <optional>
#include <string>

#include "common/clock.h"
#include "net/link_monitor.h"

namespace cohort::client {

enum class WaitReason {
  kNone,         // Connected and welcomed: not waiting.
  kNoAnswer,     // Nothing has answered at the address yet.
  kRefused,      // The coordinator's allowlist refused this client's key.
  kMechanism,    // One side uses CURVE, the other --insecure.
  kClosed,       // The coordinator closed the connection during the handshake.
  kLost,         // The connection was up and closed.
  kHandshaking,  // Connected; the handshake has not finished.
  kNoWelcome,    // Connected; the coordinator has not welcomed this client.
};

// What the messages name.
struct WaitContext {
  std::string coordinator;      // The address, e.g. tcp://127.0.0.1:7000.
  std::string identity;         // --identity (a .key file; empty: none).
  std::string coordinator_key;  // --coordinator-key (empty: none).
  bool insecure = false;
};

WaitReason ClassifyWait(const net::LinkEvents& e, bool welcomed);

// The sentence for `reason`, waiting `waited_ms` so far ("" for kNone).
std::string ExplainWait(WaitReason reason, const net::LinkEvents& e, TimeMs waited_ms,
                        const WaitContext& c);

// Decides when to speak: a refusal or a mismatch at once, any other wait
// once it has lasted `grace_ms`, then again whenever the reason changes or
// every `repeat_ms`; and once when the wait ends.
class WaitReporter {
 public:
  explicit WaitReporter(WaitContext context, TimeMs grace_ms = 3000, TimeMs repeat_ms = 10000)
      : context_(std::move(context)), grace_ms_(grace_ms), repeat_ms_(repeat_ms) {}

  // The line to print now, if any.
  std::optional<std::string> Step(const net::LinkEvents& e, bool welcomed, TimeMs now);

 private:
  WaitContext context_;
  TimeMs grace_ms_, repeat_ms_;
  std::optional<TimeMs> waiting_since_;
  WaitReason said_ = WaitReason::kNone;
  TimeMs said_at_ = 0;
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_WAIT_REPORT_H_
