// Peer collectives: every rank of a group holds one flat vector; after
// AllReduce every rank holds the elementwise sum, bit-identical on every
// rank. The algorithms are sans-I/O schedules (lists of steps, computed from
// rank, world size and length alone); one executor runs any schedule over a
// Transport, checking every message it receives.
//
//  - Ring (bandwidth-optimal): reduce-scatter then all-gather, 2 (n - 1)
//    steps, each moving 1/n of the vector.
//  - Recursive doubling (latency-optimal): log2(n) full-vector exchanges;
//    with a world size that is not a power of two, the extra ranks first
//    fold their vector into a partner and get the result back at the end.
//  - 16-bit floats (bfloat16, IEEE float16): summed in float32 one add at a
//    time, rounded back to 16 bits after each (what NCCL does with them);
//    a float32 vector can travel as either (CollectiveOptions::wire) to
//    halve the bytes, as DDP's bf16/fp16 compression hooks do.
//  - Exact mode: floats become int64 fixed point (value * 2^scale_bits,
//    rounded to nearest), summed as integers mod 2^64, decoded: the result is
//    the same bits whatever the algorithm, transport or order of arrival.
//  - Other reductions than the sum (ReduceOp): product, min, max, and the
//    bitwise ones over integers, on the same schedules.
#ifndef COHORT_COLLECTIVE_COLLECTIVE_H_
#define COHORT_COLLECTIVE_COLLECTIVE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "collective/transport.h"
#include "common/half.h"
#include "common/status.h"

namespace cohort::collective {

// Large ranges travel as segments of this many bytes, so that the receiver
// adds one segment while the next is on the wire.
inline constexpr size_t kSegmentBytes = 256 * 1024;
// Vectors from this size send their final ranges with Transport::SendFinal
// (read in place by the peer where the transport can): below it the bytes
// are still in cache, where two copies beat a system call (2 ranks on
// shared memory: even at 2 MiB, 4 % slower at 1 MiB, 13 % faster at 8 MiB).
inline constexpr size_t kInPlaceMinBytes = size_t{2} << 20;
// No message of the collectives is larger (a segment and its header, or a
// notice): transports may refuse anything bigger.
inline constexpr size_t kMaxCollectiveMessageBytes = kSegmentBytes + 1024 + 64;

// [begin, end) in elements of the vector.
struct Range {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// One step of a schedule: send `send` to `send_to` (if >= 0; the transport
// takes a copy), then receive `recv` from `recv_from` (if >= 0) and add it
// in (kReduce) or write it (kCopy). Every schedule keeps one promise: a
// range sent in a kCopy step is final, never written again in the same
// collective (so a transport may let the peer read it in place).
struct CollectiveStep {
  enum class Op : uint8_t { kReduce, kCopy };
  int send_to = -1;
  Range send;
  int recv_from = -1;
  Range recv;
  Op op = Op::kReduce;
};

// The ring's chunk c of a vector of n elements split over `size` ranks (the
// first n % size chunks are one longer).
Range RingChunk(size_t n, int size, int c);

std::vector<CollectiveStep> RingAllReduceSchedule(int rank, int size, size_t n);
std::vector<CollectiveStep> RecursiveDoublingSchedule(int rank, int size, size_t n);
// Rank `root`'s vector to every rank, along a binomial tree.
std::vector<CollectiveStep> BroadcastSchedule(int rank, int size, size_t n, int root);

enum class Algorithm { kAuto, kRing, kRecursiveDoubling };

// How a float32 all-reduce travels: as float32, or rounded to a 16-bit float
// (half the bytes; each rank's values and every partial sum rounded to 8
// or 11 bits of mantissa) and widened again at the end.
enum class WireType { kFloat32, kBf16, kFp16 };

// How an all-reduce combines the ranks' values. Each is commutative, so
// every rank ends with the same bits: kMin and kMax give one quiet NaN where
// any rank's value is NaN (as torch.max does), and +0 over -0 (kMax) or -0
// over +0 (kMin); 16-bit floats combine in float32, rounded after each
// step; integers wrap (kSum, kProduct); a NaN product is one quiet NaN. (A
// float sum keeps the NaN the hardware returns: NaNs of other bits on two
// ranks can leave the ranks with different NaNs.) The bitwise ops take
// integers only, and exact mode sums only.
enum class ReduceOp : uint8_t { kSum, kProduct, kMin, kMax, kBitAnd, kBitOr, kBitXor };
// "sum", "product", "min", "max", "bitwise and", ...
std::string ReduceOpName(ReduceOp op);

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::kAuto;
  // kAuto: recursive doubling up to this many bytes, the ring above.
  size_t ring_threshold_bytes = 64 * 1024;
  // The whole collective's deadline: on a timeout or a dead peer the call
  // returns an error naming the rank that did not arrive, never hangs.
  TimeMs timeout_ms = 30000;
  // Exact mode (floats only): fixed point with this many fractional bits.
  // Values beyond +-2^(62 - scale_bits) / size saturate (counted).
  bool exact = false;
  int scale_bits = 32;
  // Float32 all-reduce only, not with `exact`.
  WireType wire = WireType::kFloat32;
  // All-reduce only; every rank passes the same (checked in each message).
  ReduceOp op = ReduceOp::kSum;
};

// Collectives of one group, numbered so a message from an earlier or later
// collective is recognised. Every rank calls the same collectives in the
// same order with the same lengths and options. Not thread-safe.
class Communicator {
 public:
  explicit Communicator(Transport* transport) : transport_(transport) {}
  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }

  Status AllReduce(std::span<float> data, const CollectiveOptions& options = {});
  Status AllReduce(std::span<int64_t> data, const CollectiveOptions& options = {});
  Status AllReduce(std::span<Bf16> data, const CollectiveOptions& options = {});
  Status AllReduce(std::span<Fp16> data, const CollectiveOptions& options = {});
  // Rank `root`'s values to every rank; every rank passes the same length.
  Status Broadcast(std::span<float> data, int root, const CollectiveOptions& options = {});
  // Bytes as they are: integers, ids, serialized messages travel exactly.
  Status Broadcast(std::span<uint8_t> data, int root, const CollectiveOptions& options = {});
  // Any trivially copyable values (integers, structs of them), as their
  // bytes: the root's bit patterns arrive unchanged.
  template <typename T>
  requires std::is_trivially_copyable_v<T> Status
  BroadcastBytesOf(std::span<T> values, int root, const CollectiveOptions& options = {}) {
    return Broadcast(
        std::span<uint8_t>(reinterpret_cast<uint8_t*>(values.data()), values.size_bytes()), root,
        options);
  }
  // A byte string whose length only the root knows: its length travels
  // first, then `bytes` is resized and filled on every other rank. A length
  // over `max_bytes` fails on every rank (kInvalidArgument on the root,
  // kDataLoss elsewhere) before any byte moves.
  Status BroadcastSized(std::vector<uint8_t>& bytes, int root, size_t max_bytes,
                        const CollectiveOptions& options = {});
  Status Barrier(const CollectiveOptions& options = {});
  // Values that saturated in the last exact AllReduce on this rank.
  uint64_t saturated() const { return saturated_; }

 private:
  // RunSteps; on a failure, a notice to every other rank, and after a
  // timeout the names of the ranks that are missing (FindMissing).
  template <typename T>
  Status Run(const std::vector<CollectiveStep>& steps, std::span<T> data, TimeMs deadline,
             const char* what);
  // `waiting_for`: the peer a failed receive waited for (timeout, or its
  // notice); -1 for other failures.
  template <typename T>
  Status RunSteps(const std::vector<CollectiveStep>& steps, std::span<T> data, TimeMs deadline,
                  const char* what, int& waiting_for);
  // Receives segment `seg` of step `s` (message `index` from that peer in
  // collective `sequence`), checks it and applies it to `data`; `at` names
  // the step in errors.
  template <typename T, typename Where>
  Status ReceiveSegment(const CollectiveStep& s, Range seg, std::span<T> data, uint64_t sequence,
                        uint64_t index, TimeMs deadline, const Where& at, int& waiting_for);
  void SendNotice(const std::string& text);
  Status FindMissing(const Status& failure, int waiting_for, TimeMs deadline);
  template <typename T>
  Status BroadcastAs(std::span<T> data, int root, const CollectiveOptions& options);
  template <typename T>
  Status ReduceWith(std::span<T> data, const CollectiveOptions& options, const char* what);
  Status ReduceExact(std::span<float> data, const CollectiveOptions& options);
  template <typename H>
  Status ReduceAs(std::span<float> data, const CollectiveOptions& options);

  Transport* transport_;
  uint64_t sequence_ = 0;
  uint64_t saturated_ = 0;
  TimeMs timeout_ms_ = 30000;     // The running collective's.
  ReduceOp op_ = ReduceOp::kSum;  // The running collective's (kSum for a copy).
};

}  // namespace cohort::collective

#endif  // COHORT_COLLECTIVE_COLLECTIVE_H_
