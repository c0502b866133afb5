// What a driver (the simulator, the coordinator daemon's I/O loop) needs of
// the coordinator's protocol: events in, messages out, as RoundEngine's own
// calls of the same names say. Two engines stand behind it: RoundEngine
// (synchronous rounds) and FedBuffEngine (buffered asynchronous groups).
//
// Times (TimeMs `now`) are the engine's own time line, in milliseconds: a
// driver starts its clock at start_time() and lets it advance as its clock
// does (the simulator's virtual clock; the daemon's steady clock, offset so
// that the engine's time at the daemon's start is start_time()). Only
// differences of times and their order matter to an engine.
#ifndef COHORT_COORDINATOR_PROTOCOL_ENGINE_H_
#define COHORT_COORDINATOR_PROTOCOL_ENGINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "coordinator/client_registry.h"
#include "coordinator/messages.h"
#include "net/envelope.h"
#include "store/run_store.h"

namespace cohort::coordinator {

// Not thread-safe. Never aborts on anything a peer sends.
class ProtocolEngine {
 public:
  virtual ~ProtocolEngine() = default;
  ProtocolEngine(const ProtocolEngine&) = delete;
  ProtocolEngine& operator=(const ProtocolEngine&) = delete;

  virtual std::vector<Outgoing> OnMessage(const std::string& peer, const net::Envelope& envelope,
                                          TimeMs now, const AuthenticatedPeer* sender) = 0;
  virtual std::vector<Outgoing> OnTick(TimeMs now) = 0;
  // A message that could not be decoded (a reply naming why).
  virtual std::vector<Outgoing> OnMalformed(const std::string& peer, const Status& why) = 0;
  // `name`'s key left the allowlist: it is sent a Reject saying `why`, is
  // never drawn again until it registers anew, and leaves what it takes
  // part in as a dropout (RoundEngine::Revoke).
  virtual std::vector<Outgoing> Revoke(const std::string& name, const std::string& why,
                                       TimeMs now) = 0;
  virtual std::optional<TimeMs> NextWakeup() const = 0;
  virtual bool done() const = 0;
  // Rounds (FedBuff: model versions) committed to the store.
  virtual uint32_t last_committed_round() const = 0;
  virtual std::vector<store::RoundRecord> TakeCommitted() = 0;
  virtual const Status& store_error() const = 0;
  // After done(): every client heard from lately has acknowledged Finished.
  virtual bool all_acknowledged_finish(TimeMs now) const = 0;
  // Why a run is done before rounds.num_rounds; empty otherwise.
  virtual const std::string& finish_reason() const = 0;
  // Limits for decoding a message from a client now.
  virtual net::Limits limits() const = 0;
  virtual size_t num_params() const = 0;
  // The virtual time a driver's clock starts at: 0 for a new run and for
  // synchronous rounds; a resumed FedBuff run goes on from the opening of
  // its earliest group in flight at the last commit (FedBuffEngine).
  virtual TimeMs start_time() const { return 0; }

 protected:
  ProtocolEngine() = default;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_PROTOCOL_ENGINE_H_
