// Fault injection for tests and --fault-stop-before / --fault-misbehave: a
// filter on the session's outgoing messages that withholds or tampers with
// them per a FaultPlan. The session (session.h) knows nothing of faults; it
// passes every Actions it returns through one FaultFilter.
#ifndef COHORT_CLIENT_FAULT_FILTER_H_
#define COHORT_CLIENT_FAULT_FILTER_H_

#include <cstdint>
#include <string>

#include "aggregation/secagg_stage.h"
#include "client/actions.h"
#include "common/env.h"
#include "crypto/keys.h"
#include "proto/wire.pb.h"

namespace cohort::client {

// In round `round`, send nothing of `stage` (kMaskedInput also withholds a
// plain update), printing "paused before STAGE of round N" ("update" for a
// plain one) on stdout; the protocol then leaves the client out of that
// round's later stages. The client keeps heartbeating.
struct FaultPlan {
  aggregation::SecAggStage stage = aggregation::SecAggStage::kNone;
  uint32_t round = 0;  // 0: off.
  // Testing: play a malicious client in every round (kMisbehaviours).
  std::string misbehave;
};

// What a malicious client does under FaultPlan::misbehave:
//   low_order_key     advertise the all-zero (low-order) X25519 mask key;
//   garbage_shares    send random bytes as its sealed shares;
//   bad_unmask_share  reveal random values as its unmasking shares;
//   rehello_weight    say Hello again with 2^40 samples when a task arrives;
//   huge_update       claim 2^40 samples and send an all-FLT_MAX plain update;
//   sign_flip         send -1 x its plain update (a Byzantine client for the
//                     robust rules' benchmark; masked updates are untouched);
//   scale10           send 10 x its plain update;
//   sign_flip_scale10 send -10 x its plain update.
// Each tampers with a message after the session made it, so none needs the
// protocol's secrets: a signed advert's key is replaced (its signature no
// longer checks), sealed or revealed share bytes are overwritten.
inline constexpr const char* kMisbehaviours[] = {
    "low_order_key", "garbage_shares", "bad_unmask_share", "rehello_weight",
    "huge_update",   "sign_flip",      "scale10",          "sign_flip_scale10"};

// Not thread-safe. A withheld message still counts as sent for the session
// (its heartbeat timing and its wait for the coordinator's next stage).
class FaultFilter {
 public:
  // `name` and `identity` (not owned; may be null) fill the Hello that
  // rehello_weight adds; `env` (not owned) takes the log lines and supplies
  // the random bytes.
  FaultFilter(FaultPlan plan, std::string name, const crypto::Ed25519KeyPair* identity, Env* env);

  // Withholds, tampers with and adds to `a.send` per the plan; the lines a
  // withheld message prints go to `a.printed`. A no-op without a plan.
  void Apply(Actions& a);

 private:
  bool Misbehaves(const char* how) const { return plan_.misbehave == how; }
  // Whether the plan withholds `header` (then prints why).
  bool Withholds(const wire::Header& header, Actions& a) const;
  void Tamper(Outbound& out);
  // What sign_flip, scale10 and sign_flip_scale10 multiply a plain update
  // by; 1 under any other plan.
  float AttackFactor() const;
  wire::Header ReHello() const;

  FaultPlan plan_;
  std::string name_;
  const crypto::Ed25519KeyPair* identity_;
  Env* env_;
};

}  // namespace cohort::client

#endif  // COHORT_CLIENT_FAULT_FILTER_H_
