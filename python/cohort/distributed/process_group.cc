#include "python/cohort/distributed/process_group.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>

#include "net/group.h"

namespace cohort::distributed {
namespace {

// Python's names for dtypes, so an error reads as the user wrote it.
std::string DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kLong:
      return "torch.int64";
    case at::kInt:
      return "torch.int32";
    case at::kShort:
      return "torch.int16";
    case at::kChar:
      return "torch.int8";
    case at::kByte:
      return "torch.uint8";
    case at::kBool:
      return "torch.bool";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

std::string OpName(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "op " + std::to_string(static_cast<int>(op.op_));
  }
}

// The collective's reduction for a c10d op (AVG: the sum, divided after);
// none for PREMUL_SUM (NCCL's alone) or an op torch adds later.
std::optional<collective::ReduceOp> CollectiveOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      return collective::ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return collective::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return collective::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return collective::ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return collective::ReduceOp::kBitAnd;
    case c10d::ReduceOp::BOR:
      return collective::ReduceOp::kBitOr;
    case c10d::ReduceOp::BXOR:
      return collective::ReduceOp::kBitXor;
    default:
      return std::nullopt;
  }
}

// A tensor every collective can take: dense, on the CPU.
void CheckTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_NOT_IMPLEMENTED(!t.is_sparse(), "cohort process group: ", what,
                              " does not support sparse tensors (dense CPU tensors only)");
  TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == at::kStrided, "cohort process group: ", what,
                              " does not support layout ", t.layout(), " (dense CPU tensors only)");
  TORCH_CHECK_NOT_IMPLEMENTED(t.device().is_cpu(), "cohort process group: ", what,
                              " does not support tensors on ", t.device().str(),
                              " (CPU tensors only)");
}

// A tensor a collective writes into part by part: no two elements may
// share memory (an expanded tensor), or a write-back would fail halfway.
void CheckWritable(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(at::has_internal_overlap(t) != at::MemOverlap::Yes,
                    "cohort process group: ", what,
                    " cannot write into a tensor whose elements share memory (expanded)");
}

// A dtype number (plus one) as a peer reported it, named if torch knows it.
std::string KnownDtypeName(int64_t code) {
  if (code < 1 || code > static_cast<int64_t>(at::ScalarType::NumOptions)) {
    return "dtype code " + std::to_string(code - 1);
  }
  return DtypeName(static_cast<at::ScalarType>(code - 1));
}

// The most bytes one rank may send another in one alltoall: 2^48, so the
// sum of a row cannot overflow.
constexpr int64_t kMaxPartBytes = int64_t{1} << 48;

bool Reducible(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kInt || t == at::kLong;
}

std::span<uint8_t> BytesOf(const at::Tensor& flat) {
  return {static_cast<uint8_t*>(flat.data_ptr()), flat.nbytes()};
}

// The work of a collective that has already finished: its future holds
// the tensors (what DDP's reducer reads as the bucket's result).
c10::intrusive_ptr<c10d::Work> Completed(const std::vector<at::Tensor>& tensors) {
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(tensors));
  return c10d::Work::create_from_future(future);
}

// The collective's own deadline within the caller's `timeout_ms`: after
// its deadline a rank listens a grace period (a quarter of it, at most 2 s)
// to name the ranks that are missing, and the error must come within the
// caller's timeout.
int64_t CollectiveDeadline(int64_t timeout_ms) {
  return std::max<int64_t>(1, timeout_ms - std::min<int64_t>(3000, timeout_ms / 4));
}

// The tensor itself when contiguous, else a contiguous copy (written back
// by WriteBack).
at::Tensor Flat(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// One tensor a call: gloo reads a list of several as the deprecated
// multi-GPU form (summing them all together), which this backend does not
// build; taking them one by one would silently differ from gloo.
void CheckOne(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cohort process group: ", what,
                    " takes one tensor a call, not ", tensors.size(),
                    " (a list of several is the deprecated multi-GPU form, not built)");
}
void WriteBack(at::Tensor& t, const at::Tensor& flat) {
  if (!flat.is_same(t)) t.copy_(flat);
}

}  // namespace

StatusOr<c10::intrusive_ptr<ProcessGroupCohort>> ProcessGroupCohort::Create(
    const GroupConfig& config) {
  if (config.timeout_ms <= 0) {
    return InvalidArgumentError("timeout " + std::to_string(config.timeout_ms) +
                                " ms: must be positive");
  }
  net::GroupOptions options{.rank = config.rank,
                            .size = config.size,
                            .master = config.master,
                            .transport = config.transport,
                            .host = config.host};
  options.insecure = config.insecure;
  auto identity = std::make_unique<crypto::Ed25519KeyPair>();
  COHORT_RETURN_IF_ERROR(LoadGroupKeys(config.identity_file, config.allow_dir,
                                       config.master_key_file, "cohort process group",
                                       identity.get(), &options));
  collective::CollectiveOptions collective;
  collective.timeout_ms = config.timeout_ms;
  auto context = std::make_unique<zmq::context_t>();
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<collective::Transport> transport,
                          net::JoinGroup(*context, options, collective));
  auto group = c10::make_intrusive<ProcessGroupCohort>(config, std::move(context),
                                                       std::move(identity), std::move(transport));
  group->description_ = net::Describe(options);
  return group;
}

ProcessGroupCohort::ProcessGroupCohort(const GroupConfig& config,
                                       std::unique_ptr<zmq::context_t> context,
                                       std::unique_ptr<crypto::Ed25519KeyPair> identity,
                                       std::unique_ptr<collective::Transport> transport)
    : ProcessGroup(config.rank, config.size),
      context_(std::move(context)),
      identity_(std::move(identity)),
      transport_(std::move(transport)),
      comm_(transport_.get()),
      timeout_(config.timeout_ms) {}

ProcessGroupCohort::~ProcessGroupCohort() = default;

void ProcessGroupCohort::Run(
    const char* what, std::chrono::milliseconds timeout,
    const std::function<Status(const collective::CollectiveOptions&)>& body) {
  TORCH_CHECK(broken_.empty(), "cohort process group (rank ", rank_, "): ", what,
              " refused: an earlier collective failed (", broken_,
              "); the group cannot be used again");
  collective::CollectiveOptions options;
  options.timeout_ms = CollectiveDeadline(timeout.count() > 0 ? timeout.count() : timeout_.count());
  const Status status = body(options);
  if (status.ok()) return;
  broken_ = status.ToString();
  TORCH_CHECK(false, "cohort process group (rank ", rank_, "): ", what, " failed: ", broken_);
}

Status ProcessGroupCohort::ReduceOne(at::Tensor& flat,
                                     const collective::CollectiveOptions& options) {
  void* data = flat.data_ptr();
  const size_t n = static_cast<size_t>(flat.numel());
  switch (flat.scalar_type()) {
    case at::kFloat:
      return comm_.AllReduce(std::span<float>(static_cast<float*>(data), n), options);
    case at::kBFloat16:
      return comm_.AllReduce(std::span<Bf16>(static_cast<Bf16*>(data), n), options);
    case at::kHalf:
      return comm_.AllReduce(std::span<Fp16>(static_cast<Fp16*>(data), n), options);
    case at::kLong:
      return comm_.AllReduce(std::span<int64_t>(static_cast<int64_t*>(data), n), options);
    case at::kInt: {
      // Reduced as int64 (what Communicator takes), narrowed back: the low
      // 32 bits of a wrapped sum, product or bitwise op are int32's own.
      at::Tensor wide = flat.to(at::kLong);
      COHORT_RETURN_IF_ERROR(
          comm_.AllReduce(std::span<int64_t>(static_cast<int64_t*>(wide.data_ptr()), n), options));
      flat.copy_(wide);
      return OkStatus();
    }
    default:
      return InternalError("unchecked dtype " + DtypeName(flat.scalar_type()));
  }
}

void ProcessGroupCohort::CheckRoot(int64_t root, const char* what) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "cohort process group: ", what, " with root rank ",
                    root, " in a group of ", size_);
}

void ProcessGroupCohort::CheckParts(const std::vector<at::Tensor>& parts, const at::Tensor& mine,
                                    const char* what, const char* kind) const {
  TORCH_CHECK_VALUE(static_cast<int>(parts.size()) == size_, "cohort process group: ", what,
                    " has ", parts.size(), " ", kind, " tensors for a group of ", size_);
  for (const at::Tensor& p : parts) {
    CheckTensor(p, what);
    TORCH_CHECK_VALUE(p.scalar_type() == mine.scalar_type() && p.numel() == mine.numel(),
                      "cohort process group: ", what, " ", kind, " ", DtypeName(p.scalar_type()),
                      "[", p.numel(), "] differs from this rank's ", DtypeName(mine.scalar_type()),
                      "[", mine.numel(), "]");
  }
}

namespace {

// The collective's op for a c10d reduce op over `tensors` (throws naming
// an op, a dtype or a tensor it cannot take).
collective::ReduceOp CheckReduce(const std::vector<at::Tensor>& tensors,
                                 const c10d::ReduceOp& reduce_op, const char* what) {
  const bool average = reduce_op == c10d::ReduceOp::AVG;
  const std::optional<collective::ReduceOp> op = CollectiveOp(reduce_op);
  TORCH_CHECK_NOT_IMPLEMENTED(op.has_value(), "cohort process group: ", what,
                              " does not support reduce op ", OpName(reduce_op),
                              " (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)");
  const bool bitwise = *op == collective::ReduceOp::kBitAnd ||
                       *op == collective::ReduceOp::kBitOr || *op == collective::ReduceOp::kBitXor;
  for (const at::Tensor& t : tensors) {
    CheckTensor(t, what);
    TORCH_CHECK_TYPE(Reducible(t.scalar_type()), "cohort process group: ", what,
                     " does not support dtype ", DtypeName(t.scalar_type()),
                     " (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)");
    TORCH_CHECK_TYPE(!average || at::isFloatingType(t.scalar_type()),
                     "cohort process group: ", what, " AVG does not support dtype ",
                     DtypeName(t.scalar_type()), " (floating point only)");
    TORCH_CHECK_TYPE(!bitwise || !at::isFloatingType(t.scalar_type()),
                     "cohort process group: ", what, " ", OpName(reduce_op),
                     " does not support dtype ", DtypeName(t.scalar_type()), " (integers only)");
  }
  return *op;
}

}  // namespace

void ProcessGroupCohort::ReduceInPlace(const char* what, at::Tensor& flat,
                                       const c10d::ReduceOp& reduce_op, collective::ReduceOp op,
                                       std::chrono::milliseconds timeout) {
  Run(what, timeout, [&](collective::CollectiveOptions o) {
    o.op = op;
    return ReduceOne(flat, o);
  });
  if (reduce_op == c10d::ReduceOp::AVG) flat.div_(size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  CheckOne(tensors, "allreduce");
  const collective::ReduceOp op = CheckReduce(tensors, opts.reduceOp, "allreduce");
  for (at::Tensor& t : tensors) {
    at::Tensor flat = Flat(t);
    ReduceInPlace("allreduce", flat, opts.reduceOp, op, opts.timeout);
    WriteBack(t, flat);
  }
  return Completed(tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  CheckRoot(opts.rootRank, "reduce");
  CheckOne(tensors, "reduce");
  const collective::ReduceOp op = CheckReduce(tensors, opts.reduceOp, "reduce");
  for (at::Tensor& t : tensors) {
    // An all-reduce; the ranks but the root reduce a copy, so their
    // tensors stay as they were.
    at::Tensor flat = rank_ == opts.rootRank ? Flat(t) : t.contiguous().clone();
    ReduceInPlace("reduce", flat, opts.reduceOp, op, opts.timeout);
    if (rank_ == opts.rootRank) WriteBack(t, flat);
  }
  return Completed(tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                    "cohort process group: reduce_scatter takes one output tensor and one list of "
                    "inputs, not ",
                    outputs.size(), " and ", inputs.size());
  at::Tensor& output = outputs[0];
  const collective::ReduceOp op = CheckReduce({output}, opts.reduceOp, "reduce_scatter");
  CheckParts(inputs[0], output, "reduce_scatter", "input");
  std::vector<at::Tensor> parts;
  for (const at::Tensor& in : inputs[0]) parts.push_back(in.reshape({-1}));
  at::Tensor flat = at::cat(parts);
  ReduceInPlace("reduce_scatter", flat, opts.reduceOp, op, opts.timeout);
  const int64_t n = output.numel();
  output.copy_(flat.narrow(0, rank_ * n, n).view(output.sizes()));
  return Completed(outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  const collective::ReduceOp op = CheckReduce({output, input}, opts.reduceOp, "reduce_scatter");
  TORCH_CHECK_VALUE(
      output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * size_,
      "cohort process group: reduce_scatter from a tensor needs a ",
      DtypeName(output.scalar_type()), " input of ", output.numel() * size_, " elements, not ",
      DtypeName(input.scalar_type()), "[", input.numel(), "]");
  at::Tensor flat = input.reshape({-1}).clone();  // The caller's input stays as it was.
  ReduceInPlace("reduce_scatter", flat, opts.reduceOp, op, opts.timeout);
  const int64_t n = output.numel();
  output.copy_(flat.narrow(0, rank_ * n, n).view(output.sizes()));
  return Completed({output});
}

Status ProcessGroupCohort::BroadcastBytes(const at::Tensor& flat, int root,
                                          const collective::CollectiveOptions& options) {
  return comm_.Broadcast(BytesOf(flat), root, options);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  CheckRoot(opts.rootRank, "broadcast");
  CheckOne(tensors, "broadcast");
  for (const at::Tensor& t : tensors) CheckTensor(t, "broadcast");
  for (at::Tensor& t : tensors) {
    at::Tensor flat = Flat(t);
    Run("broadcast", opts.timeout, [&](const collective::CollectiveOptions& o) {
      return BroadcastBytes(flat, static_cast<int>(opts.rootRank), o);
    });
    WriteBack(t, flat);
  }
  return Completed(tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                    "cohort process group: allgather takes one input tensor and one list of "
                    "outputs, not ",
                    inputs.size(), " and ", outputs.size());
  const at::Tensor& input = inputs[0];
  std::vector<at::Tensor>& out = outputs[0];
  CheckTensor(input, "allgather");
  CheckParts(out, input, "allgather", "output");
  for (const at::Tensor& o : out) CheckWritable(o, "allgather");
  // Each rank's tensor from that rank, one broadcast per rank.
  for (int r = 0; r < size_; ++r) {
    at::Tensor flat = r == rank_ ? Flat(input) : Flat(out[r]);
    Run("allgather", opts.timeout,
        [&](const collective::CollectiveOptions& o) { return BroadcastBytes(flat, r, o); });
    if (r == rank_) {
      out[r].copy_(flat.reshape(out[r].sizes()));  // Same count (CheckParts), its own shape.
    } else {
      WriteBack(out[r], flat);
    }
  }
  return Completed(out);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  CheckTensor(input, "allgather");
  CheckTensor(output, "allgather");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type() &&
                        output.numel() == input.numel() * size_ && output.is_contiguous(),
                    "cohort process group: allgather into a tensor needs a contiguous ",
                    DtypeName(input.scalar_type()), " output of ", input.numel() * size_,
                    " elements, not ", DtypeName(output.scalar_type()), "[", output.numel(), "]");
  if (input.numel() == 0) return Completed({output});
  std::vector<at::Tensor> slots = output.view({-1}).chunk(size_);
  slots[rank_].copy_(input.reshape({-1}));
  for (int r = 0; r < size_; ++r) {
    Run("allgather", opts.timeout,
        [&](const collective::CollectiveOptions& o) { return BroadcastBytes(slots[r], r, o); });
  }
  return Completed({output});
}

void ProcessGroupCohort::Agree(const char* what, int64_t root, const std::exception_ptr& refused,
                               const at::Tensor* mine, std::chrono::milliseconds timeout) {
  // Four slots a rank, each rank filling its own; a sum fills them all.
  const size_t n = static_cast<size_t>(size_);
  at::Tensor slots = at::zeros({static_cast<int64_t>(4 * n)}, at::kLong);
  int64_t* s = slots.data_ptr<int64_t>();
  int64_t* own = s + 4 * rank_;
  own[0] = refused ? 1 : 0;
  own[1] = root;
  own[2] = mine != nullptr ? static_cast<int64_t>(mine->scalar_type()) + 1 : 0;
  own[3] = mine != nullptr ? static_cast<int64_t>(mine->nbytes()) : 0;
  Run(what, timeout, [&](const collective::CollectiveOptions& o) {
    return comm_.AllReduce(std::span<int64_t>(s, 4 * n), o);
  });
  if (refused) std::rethrow_exception(refused);
  auto part = [&](size_t r) {
    return KnownDtypeName(s[4 * r + 2]) + " part of " + std::to_string(s[4 * r + 3]) + " bytes";
  };
  for (size_t r = 0; r < n; ++r) {
    TORCH_CHECK_VALUE(s[4 * r] == 0, "cohort process group (rank ", rank_, "): ", what,
                      " refused: rank ", r, " refused its arguments (its own error says why)");
    TORCH_CHECK_VALUE(s[4 * r + 1] == s[1], "cohort process group (rank ", rank_, "): ", what,
                      " refused: rank ", r, " passed root ", s[4 * r + 1], ", rank 0 root ", s[1],
                      " (every rank must pass the same root)");
  }
  // Each rank checked its root, so this holds unless a rank forged a sum.
  TORCH_CHECK_VALUE(s[1] >= 0 && s[1] < size_, "cohort process group (rank ", rank_, "): ", what,
                    " refused: the agreed root ", s[1], " is not a rank of ", size_);
  const size_t at_root = static_cast<size_t>(s[1]);
  for (size_t r = 0; r < n; ++r) {
    TORCH_CHECK_VALUE(s[4 * r + 2] == s[4 * at_root + 2] && s[4 * r + 3] == s[4 * at_root + 3],
                      "cohort process group (rank ", rank_, "): ", what, " refused: rank ", r,
                      " passed a ", part(r), ", the root a ", part(at_root),
                      " (every rank's part must be alike)");
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  const bool root = rank_ == opts.rootRank;
  std::exception_ptr refused;
  try {
    CheckRoot(opts.rootRank, "gather");
    TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == (root ? 1u : 0u),
                      "cohort process group: gather takes one input tensor and, on the root "
                      "only, one list of outputs, not ",
                      inputs.size(), " and ", outputs.size());
    CheckTensor(inputs[0], "gather");
    if (root) CheckParts(outputs[0], inputs[0], "gather", "output");
    for (const at::Tensor& o : root ? outputs[0] : std::vector<at::Tensor>{}) {
      CheckWritable(o, "gather");
    }
  } catch (const c10::Error&) {
    refused = std::current_exception();
  }
  Agree("gather", opts.rootRank, refused, refused ? nullptr : &inputs[0], opts.timeout);
  const at::Tensor& input = inputs[0];
  // Each rank's tensor from that rank, one broadcast per rank; the ranks
  // but the root receive into scratch.
  at::Tensor scratch;
  for (int r = 0; r < size_; ++r) {
    at::Tensor flat;
    if (r == rank_) {
      flat = Flat(input);
    } else if (root) {
      flat = Flat(outputs[0][r]);
    } else {
      if (!scratch.defined()) scratch = at::empty({input.numel()}, input.options());
      flat = scratch;
    }
    Run("gather", opts.timeout,
        [&](const collective::CollectiveOptions& o) { return BroadcastBytes(flat, r, o); });
    if (!root) continue;
    if (r == rank_) {
      outputs[0][r].copy_(flat.view(outputs[0][r].sizes()));
    } else {
      WriteBack(outputs[0][r], flat);
    }
  }
  return Completed(root ? outputs[0] : std::vector<at::Tensor>{});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  const int root = static_cast<int>(opts.rootRank);
  std::exception_ptr refused;
  try {
    CheckRoot(opts.rootRank, "scatter");
    TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == (rank_ == root ? 1u : 0u),
                      "cohort process group: scatter takes one output tensor and, on the root "
                      "only, one list of inputs, not ",
                      outputs.size(), " and ", inputs.size());
    CheckTensor(outputs[0], "scatter");
    CheckWritable(outputs[0], "scatter");
    if (rank_ == root) CheckParts(inputs[0], outputs[0], "scatter", "input");
  } catch (const c10::Error&) {
    refused = std::current_exception();
  }
  Agree("scatter", opts.rootRank, refused, refused ? nullptr : &outputs[0], opts.timeout);
  at::Tensor& output = outputs[0];
  // The root broadcasts each rank's part; the others keep their own.
  at::Tensor scratch;
  for (int r = 0; r < size_; ++r) {
    at::Tensor flat;
    if (rank_ == root) {
      flat = Flat(inputs[0][r]);
    } else if (r == rank_) {
      flat = Flat(output);
    } else {
      if (!scratch.defined()) scratch = at::empty({output.numel()}, output.options());
      flat = scratch;
    }
    Run("scatter", opts.timeout,
        [&](const collective::CollectiveOptions& o) { return BroadcastBytes(flat, root, o); });
    if (r != rank_) continue;
    if (rank_ == root) {
      output.copy_(flat.view(output.sizes()));
    } else {
      WriteBack(output, flat);
    }
  }
  return Completed(outputs);
}

namespace {

// The offsets of consecutive parts of the given sizes.
std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> out(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) out[i] = out[i - 1] + sizes[i - 1];
  return out;
}

// A tensor's parts along dimension 0, as `split` says (empty: equal parts).
std::vector<int64_t> SplitSizes(const at::Tensor& t, const std::vector<int64_t>& split, int size,
                                const char* which) {
  TORCH_CHECK_VALUE(t.dim() >= 1, "cohort process group: alltoall ", which,
                    " must have a dimension to split, not a scalar");
  const int64_t rows = t.size(0);
  if (split.empty()) {
    TORCH_CHECK_VALUE(rows % size == 0, "cohort process group: alltoall ", which, " of ", rows,
                      " rows does not split into ", size, " equal parts (pass split sizes)");
    return std::vector<int64_t>(size, rows / size);
  }
  TORCH_CHECK_VALUE(static_cast<int>(split.size()) == size, "cohort process group: alltoall has ",
                    split.size(), " ", which, " split sizes for a group of ", size);
  int64_t sum = 0;
  for (int64_t s : split) {
    TORCH_CHECK_VALUE(s >= 0, "cohort process group: alltoall ", which, " split size ", s,
                      " is negative");
    sum += s;
  }
  TORCH_CHECK_VALUE(sum == rows, "cohort process group: alltoall ", which,
                    " split sizes add up to ", sum, " rows, the tensor has ", rows);
  return split;
}

}  // namespace

void ProcessGroupCohort::Exchange(const char* what, const std::exception_ptr& refused,
                                  at::ScalarType dtype, const std::vector<at::Tensor>& send,
                                  const std::vector<at::Tensor>& recv,
                                  std::chrono::milliseconds timeout) {
  // Per rank: refused, its dtype + 1, and the bytes it sends each rank.
  // Each rank fills its own row; a sum fills the matrix on every rank.
  const size_t n = static_cast<size_t>(size_), width = n + 2;
  at::Tensor matrix = at::zeros({static_cast<int64_t>(n * width)}, at::kLong);
  int64_t* m = matrix.data_ptr<int64_t>();
  int64_t* own = m + rank_ * width;
  own[0] = refused ? 1 : 0;
  own[1] = refused ? 0 : static_cast<int64_t>(dtype) + 1;
  for (size_t j = 0; !refused && j < n; ++j) own[2 + j] = static_cast<int64_t>(send[j].nbytes());
  Run(what, timeout, [&](const collective::CollectiveOptions& o) {
    return comm_.AllReduce(std::span<int64_t>(m, n * width), o);
  });
  if (refused) std::rethrow_exception(refused);
  // Every rank holds the same matrix, so every rank stops here alike.
  const std::string prefix = "cohort process group (rank " + std::to_string(rank_) + "): " + what;
  for (size_t r = 0; r < n; ++r) {
    const int64_t* row = m + r * width;
    TORCH_CHECK_VALUE(row[0] == 0, prefix, " refused: rank ", r,
                      " refused its arguments (its own error says why)");
    TORCH_CHECK_VALUE(row[1] == m[1], prefix, " refused: rank ", r, " passed ",
                      KnownDtypeName(row[1]), ", rank 0 ", KnownDtypeName(m[1]),
                      " (every rank must pass one dtype)");
    for (size_t j = 0; j < n; ++j) {
      TORCH_CHECK_VALUE(row[2 + j] >= 0 && row[2 + j] <= kMaxPartBytes, prefix, ": rank ", r,
                        " would send rank ", j, " ", row[2 + j], " bytes (0 to 2^48)");
    }
  }
  // Each rank broadcasts all it sends; every rank keeps its part. Every
  // rank takes part in every broadcast, so a part of the wrong size is
  // named after the last one, the group still in step.
  std::string wrong;
  for (int r = 0; r < size_; ++r) {
    const std::vector<int64_t> row(m + r * width + 2, m + (r + 1) * width);
    const std::vector<int64_t> where = Offsets(row);
    const int64_t total = where.back() + row.back();  // At most n * 2^48.
    const int64_t mine = row[rank_];
    if (mine != static_cast<int64_t>(recv[r].nbytes()) && wrong.empty()) {
      wrong = "rank " + std::to_string(r) + " sent this rank " + std::to_string(mine) +
              " bytes, where its part holds " + std::to_string(recv[r].nbytes());
    }
    if (total == 0) continue;  // Every rank sees the same row.
    at::Tensor all = at::zeros({total}, at::kByte);
    if (r == rank_) {
      for (size_t j = 0; j < n; ++j) {
        // The sum is this rank's own row unless another rank added to it.
        const int64_t bytes = std::min<int64_t>(row[j], send[j].nbytes());
        if (bytes > 0) std::memcpy(all.data_ptr<uint8_t>() + where[j], send[j].data_ptr(), bytes);
      }
    }
    Run(what, timeout,
        [&](const collective::CollectiveOptions& o) { return BroadcastBytes(all, r, o); });
    if (mine > 0 && mine == static_cast<int64_t>(recv[r].nbytes())) {
      std::memcpy(recv[r].data_ptr(), all.data_ptr<uint8_t>() + where[rank_], mine);
    }
  }
  TORCH_CHECK_VALUE(wrong.empty(), prefix, ": ", wrong);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  std::exception_ptr refused;
  std::vector<at::Tensor> send, recv;
  at::Tensor into;
  try {
    CheckTensor(input, "alltoall");
    CheckTensor(output, "alltoall");
    CheckWritable(output, "alltoall");
    TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(),
                     "cohort process group: alltoall from ", DtypeName(input.scalar_type()),
                     " into ", DtypeName(output.scalar_type()));
    const std::vector<int64_t> in = SplitSizes(input, input_split_sizes, size_, "input");
    const std::vector<int64_t> out = SplitSizes(output, output_split_sizes, size_, "output");
    const at::Tensor from = Flat(input);
    into = Flat(output);
    const std::vector<int64_t> in_at = Offsets(in), out_at = Offsets(out);
    for (int r = 0; r < size_; ++r) {
      send.push_back(from.narrow(0, in_at[r], in[r]));    // Dimension 0 of a contiguous tensor:
      recv.push_back(into.narrow(0, out_at[r], out[r]));  // contiguous parts.
    }
  } catch (const c10::Error&) {
    refused = std::current_exception();
  }
  Exchange("alltoall", refused, input.scalar_type(), send, recv, opts.timeout);
  WriteBack(output, into);
  return Completed({output});
}
c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  std::exception_ptr refused;
  std::vector<at::Tensor> send, recv;
  try {
    TORCH_CHECK_VALUE(
        static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
        "cohort process group: alltoall takes one input and one output tensor per rank, not ",
        inputs.size(), " and ", outputs.size(), " for a group of ", size_);
    for (int r = 0; r < size_; ++r) {
      CheckTensor(inputs[r], "alltoall");
      CheckTensor(outputs[r], "alltoall");
      CheckWritable(outputs[r], "alltoall");
      TORCH_CHECK_TYPE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                           outputs[r].scalar_type() == inputs[0].scalar_type(),
                       "cohort process group: alltoall of ", DtypeName(inputs[0].scalar_type()),
                       " with a ", DtypeName(inputs[r].scalar_type()), " input and a ",
                       DtypeName(outputs[r].scalar_type()), " output");
      send.push_back(Flat(inputs[r]));
      recv.push_back(Flat(outputs[r]));
    }
  } catch (const c10::Error&) {
    refused = std::current_exception();
  }
  Exchange("alltoall", refused, inputs.empty() ? at::kByte : inputs[0].scalar_type(), send, recv,
           opts.timeout);
  for (int r = 0; r < size_; ++r) WriteBack(outputs[r], recv[r]);
  return Completed(outputs);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupCohort::barrier(const c10d::BarrierOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);  // One call at a time, whole.
  Run("barrier", opts.timeout,
      [&](const collective::CollectiveOptions& o) { return comm_.Barrier(o); });
  return Completed({});
}

}  // namespace cohort::distributed
