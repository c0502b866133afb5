// The MPI transport: the ranks of an MPI job (`mpirun -np N cohort worker
// --transport mpi`, Slurm, Kubeflow MPIJob), for clusters that already
// schedule MPI. MPI starts the ranks, tells each its rank and size, and
// moves the bytes (Open MPI: shared memory on one host, its own network
// transports between hosts); the collectives stay Cohort's, so the exact
// mode and the deadlines hold over MPI too. Built with the Meson feature
// `mpi` (Debian's libopenmpi-dev); without it JoinGroup says so.
#ifndef COHORT_NET_MPI_TRANSPORT_H_
#define COHORT_NET_MPI_TRANSPORT_H_

#include <memory>
#include <vector>

#include "collective/collective.h"
#include "collective/transport.h"

namespace cohort::net {

class MpiTransport final : public collective::Transport {
 public:
  // Initialises MPI (once per process; finalised when the transport that
  // did it goes) and takes this process's rank and size in a duplicate of
  // MPI_COMM_WORLD.
  static StatusOr<std::unique_ptr<MpiTransport>> Create();
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Copies the message and starts a non-blocking send; finished sends are
  // released during later calls.
  Status Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override;
  // Polls for the peer's next message until `deadline`; a message above
  // one collective message is kDataLoss naming the peer.
  StatusOr<collective::Message> Receive(int peer, TimeMs deadline) override;
  Status Flush(TimeMs deadline) override;
  size_t window_bytes() const override { return size_t{4} << 20; }

  struct State;  // The communicator and the sends in flight (mpi_transport.cc).

 private:
  MpiTransport() = default;
  Status Progress();

  int rank_ = 0, size_ = 1;
  std::unique_ptr<State> state_;
};

}  // namespace cohort::net

#endif  // COHORT_NET_MPI_TRANSPORT_H_
