#include "net/mpi_transport.h"

// The C API only (Open MPI's C++ bindings are deprecated and warn).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>

#include <cstring>
#include <deque>
#include <string>

#include "net/group.h"
#include "net/join.h"

namespace cohort::net {
namespace {

constexpr int kTag = 0x636f;  // Every collective message; MPI keeps their order per pair.

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

}  // namespace

struct MpiTransport::State {
  MPI_Comm comm = MPI_COMM_NULL;
  bool finalize = false;  // This transport initialised MPI.
  struct Pending {
    std::vector<uint8_t> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::deque<Pending> sends;
};

StatusOr<std::unique_ptr<MpiTransport>> MpiTransport::Create() {
  std::unique_ptr<MpiTransport> t(new MpiTransport());
  t->state_ = std::make_unique<State>();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      return UnavailableError("MPI_Init_thread failed (is this process started by mpirun?)");
    }
    t->state_->finalize = true;
  }
  // Errors come back as codes (named in the Status), not as an abort.
  if (MPI_Comm_dup(MPI_COMM_WORLD, &t->state_->comm) != MPI_SUCCESS ||
      MPI_Comm_set_errhandler(t->state_->comm, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
    return UnavailableError("MPI: cannot set up a communicator");
  }
  MPI_Comm_rank(t->state_->comm, &t->rank_);
  MPI_Comm_size(t->state_->comm, &t->size_);
  return t;
}

MpiTransport::~MpiTransport() {
  if (state_ == nullptr) return;
  // A send MPI has not finished may still read its buffer: cancel it and
  // wait for MPI to let go before the buffer is freed.
  for (auto& p : state_->sends) {
    MPI_Cancel(&p.request);
    MPI_Wait(&p.request, MPI_STATUS_IGNORE);
  }
  state_->sends.clear();
  if (state_->comm != MPI_COMM_NULL) MPI_Comm_free(&state_->comm);
  if (state_->finalize) MPI_Finalize();
}

Status MpiTransport::Progress() {
  while (!state_->sends.empty()) {
    int done = 0;
    const int rc = MPI_Test(&state_->sends.front().request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return UnavailableError("MPI send: " + MpiError(rc));
    if (!done) break;  // Sends to one peer finish in order; others wait their turn here.
    state_->sends.pop_front();
  }
  return OkStatus();
}

Status MpiTransport::Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) {
  if (head.size() + body.size() > collective::kMaxCollectiveMessageBytes) {
    return InvalidArgumentError("MPI: a message of " + std::to_string(head.size() + body.size()) +
                                " bytes");
  }
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return InvalidArgumentError("send to rank " + std::to_string(peer) + " from rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  State::Pending p;
  p.bytes.reserve(head.size() + body.size());
  p.bytes.insert(p.bytes.end(), head.begin(), head.end());
  p.bytes.insert(p.bytes.end(), body.begin(), body.end());
  state_->sends.push_back(std::move(p));
  auto& s = state_->sends.back();
  const int rc = MPI_Isend(s.bytes.data(), int(s.bytes.size()), MPI_BYTE, peer, kTag, state_->comm,
                           &s.request);
  if (rc != MPI_SUCCESS) {
    state_->sends.pop_back();
    return UnavailableError("MPI send to rank " + std::to_string(peer) + ": " + MpiError(rc));
  }
  return Progress();
}

StatusOr<collective::Message> MpiTransport::Receive(int peer, TimeMs deadline) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return InvalidArgumentError("receive from rank " + std::to_string(peer) + " on rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_));
  }
  for (int turn = 0;; ++turn) {
    COHORT_RETURN_IF_ERROR(Progress());
    int found = 0;
    MPI_Status status;
    int rc = MPI_Iprobe(peer, kTag, state_->comm, &found, &status);
    if (rc != MPI_SUCCESS) {
      return UnavailableError("MPI probe for rank " + std::to_string(peer) + ": " + MpiError(rc));
    }
    if (found) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (count < 0 || size_t(count) > collective::kMaxCollectiveMessageBytes) {
        return DataLossError("MPI: rank " + std::to_string(peer) + " sent a message of " +
                             std::to_string(count) + " bytes");
      }
      std::vector<uint8_t> bytes(static_cast<size_t>(count));
      rc = MPI_Recv(bytes.data(), count, MPI_BYTE, peer, kTag, state_->comm, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        return UnavailableError("MPI receive from rank " + std::to_string(peer) + ": " +
                                MpiError(rc));
      }
      return collective::Message(std::move(bytes));
    }
    if ((turn & 63) == 0 && SteadyNowMs() >= deadline) {
      return DeadlineExceededError("nothing from rank " + std::to_string(peer) + " in time");
    }
    if (turn > 1000) sched_yield();
  }
}

Status MpiTransport::Flush(TimeMs deadline) {
  for (int turn = 0; !state_->sends.empty(); ++turn) {
    COHORT_RETURN_IF_ERROR(Progress());
    if (SteadyNowMs() >= deadline) return DeadlineExceededError("MPI sends not finished in time");
    if (turn > 1000) sched_yield();
  }
  return OkStatus();
}

// MPI started the ranks: no rendezvous, and MPI's rank and size must be
// the ones this rank was given (or read from the environment).
StatusOr<std::unique_ptr<collective::Transport>> JoinMpi(const JoinRequest& r) {
  const GroupOptions& o = r.options;
  COHORT_ASSIGN_OR_RETURN(auto mpi, MpiTransport::Create());
  if (mpi->rank() != o.rank || mpi->size() != o.size) {
    return InvalidArgumentError("MPI says rank " + std::to_string(mpi->rank()) + " of " +
                                std::to_string(mpi->size()) + ", this worker was told rank " +
                                std::to_string(o.rank) + " of " + std::to_string(o.size));
  }
  return std::unique_ptr<collective::Transport>(std::move(mpi));
}

}  // namespace cohort::net
