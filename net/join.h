// How a transport joins a group: one function per backend, all of one
// shape, registered by name in net/group.cc's kTransports. A join creates
// this rank's endpoint, meets the other ranks (net/rendezvous.h, except
// where the backend has its own launcher, as MPI does) and connects, so the
// transport it returns reaches every rank. A sixth backend is its
// Transport implementation and its Join function in one new file, plus one
// line in kTransports.
#ifndef COHORT_NET_JOIN_H_
#define COHORT_NET_JOIN_H_

#include <memory>
#include <zmq.hpp>

#include "collective/collective.h"
#include "collective/transport.h"
#include "common/clock.h"
#include "common/status.h"

namespace cohort::net {

struct GroupOptions;

struct JoinRequest {
  zmq::context_t& context;  // For the rendezvous (and ZeroMQ data sockets).
  const GroupOptions& options;
  const collective::CollectiveOptions& collective;
  TimeMs deadline;  // Every rank must have met by then.
};

using JoinFunction = StatusOr<std::unique_ptr<collective::Transport>> (*)(const JoinRequest&);

// The backends' joins, each in its transport's file.
// shm_transport.cc: every rank on this host, meeting at an ipc:// master.
StatusOr<std::unique_ptr<collective::Transport>> JoinSharedMemory(const JoinRequest& request);
// mpi_transport.cc (or mpi_unavailable.cc when built without MPI): ranks
// started by mpirun; MPI's own ranks must be the ones this rank was told.
StatusOr<std::unique_ptr<collective::Transport>> JoinMpi(const JoinRequest& request);
// group.cc: over the network, in plaintext (insecure), with TcpTransport's
// pair-key proofs, or over ZeroMQ CURVE, as GroupOptions' keys say.
StatusOr<std::unique_ptr<collective::Transport>> JoinNetwork(const JoinRequest& request);

}  // namespace cohort::net

#endif  // COHORT_NET_JOIN_H_
