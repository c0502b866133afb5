#include "net/group.h"

#include "net/rendezvous.h"
#include "net/shm_transport.h"
#include "net/zmq_transport.h"

namespace cohort::net {

bool UsesSharedMemory(const GroupOptions& o) {
  return o.transport == "shm" || (o.transport == "auto" && o.master.rfind("ipc://", 0) == 0);
}

StatusOr<std::unique_ptr<aggregation::Transport>> JoinGroup(
    zmq::context_t& context, const GroupOptions& o, const aggregation::CollectiveOptions& c) {
  if (o.transport != "auto" && o.transport != "shm" && o.transport != "tcp") {
    return InvalidArgumentError("transport \"" + o.transport + "\": expected auto, shm or tcp");
  }
  const TimeMs deadline = SteadyNowMs() + c.timeout_ms;
  if (UsesSharedMemory(o)) {
    COHORT_ASSIGN_OR_RETURN(auto shm, ShmTransport::Create(o.rank, o.size));
    COHORT_ASSIGN_OR_RETURN(
        std::vector<std::string> endpoints,
        Rendezvous(context, o.rank, o.size, o.master, shm->endpoint(), deadline));
    COHORT_RETURN_IF_ERROR(shm->Connect(endpoints));
    // Once every rank has mapped every inbox, the names can go: nothing is
    // left in /dev/shm however the group ends.
    COHORT_RETURN_IF_ERROR(aggregation::Communicator(shm.get()).Barrier(c));
    shm->Unlink();
    return std::unique_ptr<aggregation::Transport>(std::move(shm));
  }
  COHORT_ASSIGN_OR_RETURN(auto zmq,
                          ZmqTransport::Bind(context, o.rank, o.size, "tcp://" + o.host + ":0"));
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> endpoints,
                          Rendezvous(context, o.rank, o.size, o.master, zmq->endpoint(), deadline));
  COHORT_RETURN_IF_ERROR(zmq->Connect(endpoints));
  return std::unique_ptr<aggregation::Transport>(std::move(zmq));
}

}  // namespace cohort::net
