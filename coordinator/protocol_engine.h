// What a driver (the simulator, a daemon's I/O loop) needs of the
// coordinator's protocol: events in, messages out, as RoundEngine's own
// calls of the same names say. Two engines stand behind it: RoundEngine
// (synchronous rounds) and FedBuffEngine (buffered asynchronous groups).
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
  virtual std::optional<TimeMs> NextWakeup() const = 0;
  virtual bool done() const = 0;
  // Rounds (FedBuff: model versions) committed to the store.
  virtual uint32_t last_committed_round() const = 0;
  virtual std::vector<store::RoundRecord> TakeCommitted() = 0;
  virtual const Status& store_error() const = 0;
  // The virtual time a driver's clock starts at: 0 for a new run and for
  // synchronous rounds; a resumed FedBuff run goes on from the opening of
  // its earliest group in flight at the last commit (FedBuffEngine).
  virtual TimeMs start_time() const { return 0; }

 protected:
  ProtocolEngine() = default;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_PROTOCOL_ENGINE_H_
