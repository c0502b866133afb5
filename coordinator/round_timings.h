// A round's timings and traffic as the coordinator sees them: how long each
// stage lasted on the protocol's clock, the bytes received and sent while
// it was in progress, and each client's upload and download. The round
// engine feeds it; the committed round carries its stage records
// (store::StageRecord) and each client's bytes. Sans-I/O: sizes are the
// envelopes' encoded sizes (header plus payload), not socket counters.
#ifndef COHORT_COORDINATOR_ROUND_TIMINGS_H_
#define COHORT_COORDINATOR_ROUND_TIMINGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/messages.h"
#include "net/envelope.h"
#include "store/run_store.h"

namespace cohort::coordinator {

// An envelope's size on the wire, framing aside: its header's encoded
// bytes and 4 per payload value.
uint64_t EncodedBytes(const net::Envelope& envelope);
uint64_t EncodedBytes(const Outgoing& message);

class RoundTimings {
 public:
  // A round begins at `now` in `stage`; whatever the last one measured is
  // dropped (a plain round that is run again starts over).
  void Start(TimeMs now, std::string stage);
  // The stage in progress ends at `now`, and `stage` begins.
  void Enter(TimeMs now, std::string stage);
  // Traffic while a round is in progress, in its current stage; `client`
  // is the sender's or receiver's name (null: not a registered client).
  // Nothing is counted between rounds.
  void Received(const std::string* client, uint64_t bytes);
  void Sent(const std::string* client, uint64_t bytes);
  // The round ends at `now`: its stages, then "aggregate" with the
  // coordinator's own `aggregate_seconds` (the sum, the server step and the
  // evaluation, on the wall clock: they take no protocol time).
  std::vector<store::StageRecord> Finish(TimeMs now, double aggregate_seconds);
  // A client's bytes in the round (0 for one that sent or got none).
  uint64_t UploadBytes(const std::string& client) const;
  uint64_t DownloadBytes(const std::string& client) const;

 private:
  struct Traffic {
    uint64_t up = 0, down = 0;
  };
  bool active_ = false;
  TimeMs stage_started_ = 0;
  std::vector<store::StageRecord> stages_;  // The last one is in progress.
  std::map<std::string, Traffic> clients_;
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_ROUND_TIMINGS_H_
