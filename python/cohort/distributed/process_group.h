// The `cohort` torch.distributed backend: a c10d ProcessGroup whose
// collectives run over Cohort's (collective/collective.h) on the group's
// transport (net/group.h): shared memory between the ranks of one host,
// authenticated TCP between hosts.
//
// Every collective completes before it returns: the Work handed back is
// already finished, and its future holds the result tensors (what DDP's
// reducer reads). Dense CPU tensors only. What a collective cannot do (a
// dtype, a reduce op, a sparse or CUDA tensor) throws c10::TypeError or
// c10::NotImplementedError naming it; a failed collective (a rank gone, a
// timeout) throws c10::Error naming the rank, and the group refuses every
// later collective with that first failure (the ranks' sequence is lost).
// Calls are serialised by a mutex; the caller releases the GIL (torch's
// bindings do).
#ifndef COHORT_PYTHON_COHORT_DISTRIBUTED_PROCESS_GROUP_H_
#define COHORT_PYTHON_COHORT_DISTRIBUTED_PROCESS_GROUP_H_

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>
#include <zmq.hpp>

#include "collective/collective.h"
#include "collective/transport.h"
#include "common/status.h"
#include "crypto/keys.h"

namespace cohort::distributed {

// How a rank joins (from the Python side, which met the others through
// torch's store).
struct GroupConfig {
  int rank = 0, size = 1;
  std::string master;              // Rank 0's rendezvous address (ipc:// or tcp://).
  std::string transport = "auto";  // auto, shm or tcp (net::GroupOptions).
  std::string host = "127.0.0.1";  // Where the other ranks reach this one (tcp).
  // Authentication over tcp (all three, or none with `insecure`).
  std::string identity_file, allow_dir, master_key_file;
  bool insecure = false;
  int64_t timeout_ms = 30 * 60 * 1000;  // Every collective's deadline.
};

class ProcessGroupCohort final : public c10d::ProcessGroup {
 public:
  // Joins the group (waits for every rank up to config.timeout_ms).
  static StatusOr<c10::intrusive_ptr<ProcessGroupCohort>> Create(const GroupConfig& config);
  ProcessGroupCohort(const GroupConfig& config, std::unique_ptr<zmq::context_t> context,
                     std::unique_ptr<crypto::Ed25519KeyPair> identity,
                     std::unique_ptr<collective::Transport> transport);
  ~ProcessGroupCohort() override;

  const std::string getBackendName() const override { return "cohort"; }
  // How the group's bytes travel ("shared memory", "tcp: authenticated, ...").
  const std::string& description() const { return description_; }

  // SUM, PRODUCT, MIN and MAX over float32, bfloat16, float16, int32 and
  // int64; AVG over the floats; BAND, BOR and BXOR over the integers.
  // (Not PREMUL_SUM, NCCL's own.) Every rank ends with the same bits.
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // The reduce ops and dtypes of allreduce. Both run as an all-reduce (of a
  // copy on the ranks but the root; of every rank's whole input for
  // reduce_scatter), so they move the bytes of one: up to twice what a
  // dedicated reduce or reduce-scatter would.
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  // Any dtype, as bytes.
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  // Any dtype, as bytes, as allgather: one broadcast per part, which every
  // rank receives (the root's parts, for scatter), so fit for small
  // tensors (a metric, a list of objects) more than for a model.
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  // Any dtype, as bytes: each rank broadcasts all it sends, and every rank
  // keeps its part (so every part reaches every rank: for small tensors).
  // Split sizes along dimension 0, or equal parts. A part of the size the
  // receiver did not expect is an error on that rank, named after the
  // exchange (which every rank finishes, so the group goes on).
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  // Runs one collective with the deadline `timeout` (or the group's); a
  // failure breaks the group and throws. The caller holds mu_.
  void Run(const char* what, std::chrono::milliseconds timeout,
           const std::function<Status(const collective::CollectiveOptions&)>& body);
  Status ReduceOne(at::Tensor& flat, const collective::CollectiveOptions& options);
  // Reduces `flat` (contiguous) on every rank; AVG divides after.
  void ReduceInPlace(const char* what, at::Tensor& flat, const c10d::ReduceOp& reduce_op,
                     collective::ReduceOp op, std::chrono::milliseconds timeout);
  // Sends send[j] (contiguous) to rank j and fills recv[r] (contiguous)
  // from rank r, after an all-reduce of every rank's refusal, dtype and
  // byte counts (so a rank that refused, or passed another dtype, is an
  // error on every rank at once).
  void Exchange(const char* what, const std::exception_ptr& refused, at::ScalarType dtype,
                const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                std::chrono::milliseconds timeout);
  // Before a rooted gather or scatter moves data, every rank learns
  // whether any rank refused its arguments (`refused`, rethrown on that
  // rank) and every rank's root and part (`mine`: what it sends or
  // receives): a refusal or a rank that differs is an error on every rank
  // at once, the group still in step, not a wait for the timeout.
  void Agree(const char* what, int64_t root, const std::exception_ptr& refused,
             const at::Tensor* mine, std::chrono::milliseconds timeout);
  void CheckRoot(int64_t root, const char* what) const;
  // `parts` holds one tensor per rank, each of `mine`'s dtype and size.
  void CheckParts(const std::vector<at::Tensor>& parts, const at::Tensor& mine, const char* what,
                  const char* kind) const;
  Status BroadcastBytes(const at::Tensor& flat, int root,
                        const collective::CollectiveOptions& options);

  std::mutex mu_;
  // Declared first: the transport (and its sockets) go before the context.
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<crypto::Ed25519KeyPair> identity_;
  std::unique_ptr<collective::Transport> transport_;
  collective::Communicator comm_;
  std::chrono::milliseconds timeout_;
  std::string description_;
  std::string broken_;  // The first failure; empty while the group works.
};

}  // namespace cohort::distributed

#endif  // COHORT_PYTHON_COHORT_DISTRIBUTED_PROCESS_GROUP_H_
