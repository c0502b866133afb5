#include "collective/collective.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>

namespace cohort::collective {

Range RingChunk(size_t n, int size, int c) {
  const size_t base = n / size, extra = n % size;
  const size_t begin = c * base + std::min<size_t>(c, extra);
  return Range{begin, begin + base + (size_t(c) < extra ? 1 : 0)};
}

std::vector<CollectiveStep> RingAllReduceSchedule(int rank, int size, size_t n) {
  std::vector<CollectiveStep> steps;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  auto chunk = [&](int c) { return RingChunk(n, size, ((c % size) + size) % size); };
  // Reduce-scatter: afterwards this rank holds the whole sum of chunk rank+1.
  for (int s = 0; s + 1 < size; ++s) {
    steps.push_back(
        {next, chunk(rank - s), prev, chunk(rank - s - 1), CollectiveStep::Op::kReduce});
  }
  // All-gather: pass the finished chunks round.
  for (int s = 0; s + 1 < size; ++s) {
    steps.push_back({next, chunk(rank + 1 - s), prev, chunk(rank - s), CollectiveStep::Op::kCopy});
  }
  return steps;
}

std::vector<CollectiveStep> RecursiveDoublingSchedule(int rank, int size, size_t n) {
  std::vector<CollectiveStep> steps;
  const Range all{0, n};
  int p2 = 1;
  while (p2 * 2 <= size) p2 *= 2;
  const int extra = size - p2;
  if (rank >= p2) {
    // Fold into rank - p2, then take the result back from it.
    steps.push_back({rank - p2, all, -1, {}, CollectiveStep::Op::kReduce});
    steps.push_back({-1, {}, rank - p2, all, CollectiveStep::Op::kCopy});
    return steps;
  }
  if (rank < extra) steps.push_back({-1, {}, rank + p2, all, CollectiveStep::Op::kReduce});
  for (int mask = 1; mask < p2; mask <<= 1) {
    steps.push_back({rank ^ mask, all, rank ^ mask, all, CollectiveStep::Op::kReduce});
  }
  if (rank < extra) steps.push_back({rank + p2, all, -1, {}, CollectiveStep::Op::kCopy});
  return steps;
}

std::vector<CollectiveStep> BroadcastSchedule(int rank, int size, size_t n, int root) {
  std::vector<CollectiveStep> steps;
  const Range all{0, n};
  const int v = (rank - root + size) % size;  // Rank relative to the root.
  int mask = 1;
  while (mask < size) {
    if (v & mask) {
      steps.push_back({-1, {}, (v - mask + root) % size, all, CollectiveStep::Op::kCopy});
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < size)
      steps.push_back({(v + mask + root) % size, all, -1, {}, CollectiveStep::Op::kCopy});
  }
  return steps;
}

namespace {

// Every message: this header, then the range's values.
// A rank that gives up on a collective tells every other: this magic, then
// its error as text, so the ranks that were waiting on someone else learn
// which rank is missing.
constexpr uint32_t kAbortMagic = 0x62614c43;  // "CLab"
constexpr size_t kMaxAbortText = 1024;

// The abort text in `m`, or "" when `m` is not an abort.
std::string AbortText(std::span<const uint8_t> m) {
  uint32_t magic = 0;
  if (m.size() < sizeof(magic)) return "";
  std::memcpy(&magic, m.data(), sizeof(magic));
  if (magic != kAbortMagic) return "";
  std::string text(m.begin() + sizeof(magic),
                   m.begin() + std::min(m.size(), sizeof(magic) + kMaxAbortText));
  for (char& c : text) c = (c >= 32 && c < 127) ? c : '?';  // Untrusted: printable only.
  return text.empty() ? "(no reason)" : text;
}

static_assert(kMaxAbortText + 4 <= kMaxCollectiveMessageBytes);

// What a message's values are: every rank of a collective sends the same.
template <typename T>
constexpr uint32_t kDType = 0;
template <>
constexpr uint32_t kDType<float> = 1;
template <>
constexpr uint32_t kDType<int64_t> = 2;
template <>
constexpr uint32_t kDType<Bf16> = 3;
template <>
constexpr uint32_t kDType<Fp16> = 4;
template <>
constexpr uint32_t kDType<uint8_t> = 5;

// A ReduceOp's name from its number (a peer's header holds any uint32).
std::string OpNameOf(uint32_t op) {
  static const char* const kNames[] = {"sum",         "product",    "min",        "max",
                                       "bitwise and", "bitwise or", "bitwise xor"};
  return op < std::size(kNames) ? kNames[op] : "reduce op " + std::to_string(op);
}

}  // namespace

std::string ReduceOpName(ReduceOp op) { return OpNameOf(static_cast<uint32_t>(op)); }

namespace {

std::string DTypeName(uint32_t dtype) {
  static const char* const kNames[] = {"?", "float32", "int64", "bfloat16", "float16", "byte"};
  return dtype < 6 ? kNames[dtype] : "type " + std::to_string(dtype);
}

// Why `op` cannot reduce values of type T, or "" when it can.
template <typename T>
std::string Unfit(ReduceOp op) {
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kBitXor)) {
    return "unknown " + ReduceOpName(op);
  }
  const bool bitwise = op == ReduceOp::kBitAnd || op == ReduceOp::kBitOr || op == ReduceOp::kBitXor;
  if (bitwise && !std::is_same_v<T, int64_t>) {
    return "no " + ReduceOpName(op) + " of " + DTypeName(kDType<T>) +
           " values (bitwise ops take integers)";
  }
  return "";
}

struct MessageHeader {
  uint32_t magic = 0x33764c43;  // "CLv3"
  uint32_t dtype = 0;
  uint64_t sequence = 0;
  // The message's number among those this sender sends this receiver in
  // this collective (schedules differ in length between ranks, so the step
  // number would not match).
  uint64_t index = 0;
  uint64_t begin = 0;
  uint64_t count = 0;
  uint32_t op = 0;      // ReduceOp: every rank of an all-reduce passes the same.
  uint32_t unused = 0;  // Reserved: 0, checked.
};
static_assert(sizeof(MessageHeader) + kSegmentBytes <= kMaxCollectiveMessageBytes);

// Float max and min that give every rank the same bits whichever operand
// is its own: NaN wins (one quiet NaN), +0 is above -0.
float MaxOf(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

float MinOf(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

// a combined with b by `op` (any but kSum, and the bitwise ones only for
// integers: ReduceWith checks).
template <typename T>
T Combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return ToBf16(Combine<float>(op, ToFloat(a), ToFloat(b)));
  } else if constexpr (std::is_same_v<T, Fp16>) {
    return ToFp16(Combine<float>(op, ToFloat(a), ToFloat(b)));
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kProduct: {
        // x86 returns the first NaN operand: one quiet NaN for every rank.
        const T p = a * b;
        return std::isnan(p) ? std::numeric_limits<T>::quiet_NaN() : p;
      }
      case ReduceOp::kMin:
        return MinOf(a, b);
      case ReduceOp::kMax:
        return MaxOf(a, b);
      default:
        return a + b;
    }
  } else {
    using U = std::make_unsigned_t<T>;  // Wrapping arithmetic.
    switch (op) {
      case ReduceOp::kProduct:
        return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::kMin:
        return std::min(a, b);
      case ReduceOp::kMax:
        return std::max(a, b);
      case ReduceOp::kBitAnd:
        return a & b;
      case ReduceOp::kBitOr:
        return a | b;
      case ReduceOp::kBitXor:
        return a ^ b;
      default:
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    }
  }
}

template <typename T>
void Apply(CollectiveStep::Op step, ReduceOp op, const uint8_t* bytes, std::span<T> out) {
  if (step == CollectiveStep::Op::kCopy) {
    std::memcpy(out.data(), bytes, out.size_bytes());
    return;
  }
  if (op != ReduceOp::kSum) {
    T* o = out.data();
    for (size_t i = 0; i < out.size(); ++i) {
      T v;
      std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
      o[i] = Combine(op, o[i], v);
    }
    return;
  }
  // Each value read with its own memcpy (received bytes need not be
  // aligned): the compiler makes these plain vector loads, no copy.
  T* o = out.data();
  for (size_t i = 0; i < out.size(); ++i) {
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, int64_t>) {
      // Wrapping integer addition: exact and order-free.
      o[i] = static_cast<int64_t>(static_cast<uint64_t>(o[i]) + static_cast<uint64_t>(v));
    } else if constexpr (std::is_same_v<T, Bf16>) {
      o[i] = ToBf16(ToFloat(o[i]) + ToFloat(v));
    } else if constexpr (std::is_same_v<T, Fp16>) {
      o[i] = ToFp16(ToFloat(o[i]) + ToFloat(v));
    } else {
      o[i] += v;
    }
  }
}

// Why a received message of `size` bytes, starting with `m`, is not
// message `i` of collective `sequence` with the range `want`, or "" when it
// is.
template <typename T>
std::string Mismatch(std::span<const uint8_t> m, size_t size, uint64_t sequence, uint64_t i,
                     Range want, ReduceOp op) {
  MessageHeader h;
  if (m.size() < sizeof(h)) return "a message of " + std::to_string(size) + " bytes";
  std::memcpy(&h, m.data(), sizeof(h));
  if (h.magic != MessageHeader{}.magic) return "a message that is not a collective's";
  if (h.unused != 0) {
    return "a message whose reserved header word is " + std::to_string(h.unused) +
           ", not 0 (another build's format?)";
  }
  if (h.sequence != sequence || h.index != i) {
    return "message " + std::to_string(h.index) + " of collective " + std::to_string(h.sequence) +
           " (expected message " + std::to_string(i) + " of collective " +
           std::to_string(sequence) + ")";
  }
  if (h.op != static_cast<uint32_t>(op)) {
    return "values to combine by " + OpNameOf(h.op) + " (expected " + ReduceOpName(op) +
           ": every rank must pass the same reduce op)";
  }
  if (h.dtype != kDType<T> || h.begin != want.begin || h.count != want.size() ||
      size != sizeof(h) + want.size() * sizeof(T)) {
    return std::to_string(h.count) + " " + DTypeName(h.dtype) + " values from " +
           std::to_string(h.begin) + " in " + std::to_string(size) + " bytes (expected " +
           std::to_string(want.size()) + " " + DTypeName(kDType<T>) + " values from " +
           std::to_string(want.begin) + ")";
  }
  return "";
}

}  // namespace

namespace {

// The segments of `r`, each at most kSegmentBytes of T.
template <typename T>
std::vector<Range> Segments(Range r) {
  const size_t per = std::max<size_t>(kSegmentBytes / sizeof(T), 1);
  std::vector<Range> out;
  for (size_t b = r.begin; b < r.end || out.empty(); b += per) {
    out.push_back({b, std::min(r.end, b + per)});
    if (r.size() == 0) break;
  }
  return out;
}

}  // namespace

template <typename T>
Status Communicator::Run(const std::vector<CollectiveStep>& steps, std::span<T> data,
                         TimeMs deadline, const char* what) {
  int waiting_for = -1;
  Status s = RunSteps(steps, data, deadline, what, waiting_for);
  // What this rank sent last may still be queued for a peer, or be read in
  // place by one (SendFinal).
  if (s.ok()) s = transport_->Flush(deadline);
  if (s.ok()) return s;
  // Given up: `data` is the caller's again, so nothing may read it in place.
  transport_->Revoke();
  if (waiting_for >= 0) return FindMissing(s, waiting_for, deadline);
  // Any other failure: tell everyone (best effort: a dead peer cannot hear).
  SendNotice(s.message());
  return s;
}

void Communicator::SendNotice(const std::string& text) {
  const uint32_t magic = kAbortMagic;
  const std::string cut = text.substr(0, kMaxAbortText);
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    (void)transport_->Send(r, {reinterpret_cast<const uint8_t*>(&magic), sizeof(magic)},
                           {reinterpret_cast<const uint8_t*>(cut.data()), cut.size()});
  }
  (void)transport_->Flush(SteadyNowMs() + 100);  // Best effort: a dead peer takes nothing.
}

// A rank that waited in vain (or heard that a peer did) says so to every
// rank, then listens for the others' notices for a grace period: the live
// ranks all speak, so the ranks that stay silent are the missing ones, and
// every live rank names the same ones, whoever it was waiting for.
Status Communicator::FindMissing(const Status& failure, int waiting_for, TimeMs deadline) {
  SendNotice("rank " + std::to_string(rank()) + " waited for rank " + std::to_string(waiting_for));
  const TimeMs grace = std::clamp<TimeMs>(timeout_ms_ / 4, 50, 2000);
  const TimeMs end = std::max(SteadyNowMs(), deadline) + grace;
  std::vector<bool> heard(size(), false);
  heard[rank()] = true;
  if (failure.code() == StatusCode::kUnavailable &&
      failure.message().find(" gave up: ") != std::string::npos) {
    heard[waiting_for] = true;  // Its notice is what ended the wait.
  }
  for (bool all = false; !all && SteadyNowMs() < end;) {
    all = true;
    for (int r = 0; r < size(); ++r) {
      if (heard[r]) continue;
      all = false;
      // Read what this peer sent until its notice, or a short wait passes;
      // its data is of no use now.
      for (;;) {
        StatusOr<Message> m = transport_->Receive(r, std::min(end, SteadyNowMs() + 10));
        if (!m.ok()) break;
        if (!AbortText(m->bytes()).empty()) {
          heard[r] = true;
          break;
        }
      }
    }
  }
  std::string missing;
  int count = 0;
  for (int r = 0; r < size(); ++r) {
    if (!heard[r]) {
      missing += (count++ ? ", " : "") + std::to_string(r);
    }
  }
  const std::string head = failure.message().substr(0, failure.message().find(": rank "));
  if (count == 0) {
    return DeadlineExceededError(head + ": every rank is alive, but rank " +
                                 std::to_string(waiting_for) +
                                 " did not send in time (is the timeout too short?)");
  }
  return DeadlineExceededError(head + ": " + (count == 1 ? "rank " : "ranks ") + missing +
                               " did not arrive");
}

template <typename T, typename Where>
Status Communicator::ReceiveSegment(const CollectiveStep& s, Range seg, std::span<T> data,
                                    uint64_t sequence, uint64_t index, TimeMs deadline,
                                    const Where& at, int& waiting_for) {
  // A copy lands straight in place when the transport can put it there.
  bool landed = false;
  const std::span<uint8_t> into(reinterpret_cast<uint8_t*>(data.data() + seg.begin),
                                seg.size() * sizeof(T));
  StatusOr<Message> m =
      s.op == CollectiveStep::Op::kCopy
          ? transport_->ReceiveInto(s.recv_from, deadline, sizeof(MessageHeader), into, &landed)
          : transport_->Receive(s.recv_from, deadline);
  if (!m.ok()) {
    if (m.status().code() == StatusCode::kDeadlineExceeded) {
      waiting_for = s.recv_from;
      return DeadlineExceededError(at() + " did not arrive in time");
    }
    return Status(m.status().code(), at() + ": " + m.status().message());
  }
  const std::string gave_up = AbortText(m->bytes());
  if (!gave_up.empty()) {
    waiting_for = s.recv_from;
    return UnavailableError(at() + " gave up: " + gave_up);
  }
  const size_t size = landed ? sizeof(MessageHeader) + into.size() : m->size();
  const std::string bad = Mismatch<T>(m->bytes(), size, sequence, index, seg, op_);
  if (!bad.empty()) return InvalidArgumentError(at() + " sent " + bad);
  if (!landed) {
    Apply<T>(s.op, op_, m->data() + sizeof(MessageHeader), data.subspan(seg.begin, seg.size()));
  }
  return OkStatus();
}

template <typename T>
Status Communicator::RunSteps(const std::vector<CollectiveStep>& steps, std::span<T> data,
                              TimeMs deadline, const char* what, int& waiting_for) {
  const uint64_t sequence = ++sequence_;
  std::vector<uint64_t> sent(size(), 0), received(size(), 0);  // Messages, by peer.
  const size_t ahead =
      std::max<size_t>(1, transport_->window_bytes() / (kSegmentBytes + sizeof(MessageHeader)));
  for (size_t i = 0; i < steps.size(); ++i) {
    const CollectiveStep& s = steps[i];
    const std::vector<Range> sends = s.send_to >= 0 ? Segments<T>(s.send) : std::vector<Range>{};
    const std::vector<Range> recvs = s.recv_from >= 0 ? Segments<T>(s.recv) : std::vector<Range>{};
    // Segment k + ahead is sent before segment k is received, so a peer's
    // inbox need hold only the transport's window, not a whole chunk. That
    // is safe when no received segment lands on one still to be sent: the
    // two ranges are disjoint, or the same range segmented alike.
    const bool same = s.send.begin == s.recv.begin && s.send.end == s.recv.end;
    const bool interleave = !sends.empty() && !recvs.empty() &&
                            (same || s.send.end <= s.recv.begin || s.recv.end <= s.send.begin);
    size_t next_send = 0;
    auto send_until = [&](size_t count) -> Status {
      for (; next_send < std::min(count, sends.size()); ++next_send) {
        const Range seg = sends[next_send];
        MessageHeader h{.dtype = kDType<T>,
                        .sequence = sequence,
                        .index = sent[s.send_to]++,
                        .begin = seg.begin,
                        .count = seg.size(),
                        .op = static_cast<uint32_t>(op_)};
        const auto* body = reinterpret_cast<const uint8_t*>(data.data() + seg.begin);
        const std::span<const uint8_t> head(reinterpret_cast<const uint8_t*>(&h), sizeof(h));
        // A copy step's range is final for the rest of the collective (no
        // schedule writes a range after sending it in a copy step): the
        // transport may let the peer read it in place.
        COHORT_RETURN_IF_ERROR(
            s.op == CollectiveStep::Op::kCopy && data.size_bytes() >= kInPlaceMinBytes
                ? transport_->SendFinal(s.send_to, head, {body, seg.size() * sizeof(T)})
                : transport_->Send(s.send_to, head, {body, seg.size() * sizeof(T)}));
      }
      return OkStatus();
    };
    if (!interleave) COHORT_RETURN_IF_ERROR(send_until(sends.size()));
    // Where and from whom, for errors only (built when one happens: a
    // small all-reduce takes about a microsecond).
    auto at = [&] {
      return std::string(what) + " " + std::to_string(sequence) + " on rank " +
             std::to_string(rank()) + ", step " + std::to_string(i + 1) + " of " +
             std::to_string(steps.size()) + ": rank " + std::to_string(s.recv_from);
    };
    for (size_t k = 0; k < recvs.size(); ++k) {
      COHORT_RETURN_IF_ERROR(send_until(k + ahead));
      COHORT_RETURN_IF_ERROR(ReceiveSegment(s, recvs[k], data, sequence, received[s.recv_from]++,
                                            deadline, at, waiting_for));
    }
    COHORT_RETURN_IF_ERROR(send_until(sends.size()));
  }
  return OkStatus();
}

template <typename T>
Status Communicator::ReduceWith(std::span<T> data, const CollectiveOptions& options,
                                const char* what) {
  if (const std::string why = Unfit<T>(options.op); !why.empty()) {
    return InvalidArgumentError(std::string(what) + ": " + why);
  }
  op_ = options.op;
  const TimeMs deadline = SteadyNowMs() + options.timeout_ms;
  timeout_ms_ = options.timeout_ms;
  Algorithm a = options.algorithm;
  if (a == Algorithm::kAuto) {
    a = data.size_bytes() <= options.ring_threshold_bytes ? Algorithm::kRecursiveDoubling
                                                          : Algorithm::kRing;
  }
  const auto steps = a == Algorithm::kRing ? RingAllReduceSchedule(rank(), size(), data.size())
                                           : RecursiveDoublingSchedule(rank(), size(), data.size());
  return Run<T>(steps, data, deadline, what);
}

Status Communicator::AllReduce(std::span<int64_t> data, const CollectiveOptions& options) {
  return ReduceWith<int64_t>(data, options, "all-reduce");
}

Status Communicator::AllReduce(std::span<Bf16> data, const CollectiveOptions& options) {
  return ReduceWith<Bf16>(data, options, "bfloat16 all-reduce");
}

Status Communicator::AllReduce(std::span<Fp16> data, const CollectiveOptions& options) {
  return ReduceWith<Fp16>(data, options, "float16 all-reduce");
}

Status Communicator::AllReduce(std::span<float> data, const CollectiveOptions& options) {
  // As float32 values, whatever the wire.
  if (const std::string why = Unfit<float>(options.op); !why.empty()) {
    return InvalidArgumentError("all-reduce: " + why);
  }
  if (options.exact && options.wire != WireType::kFloat32) {
    return InvalidArgumentError("exact all-reduce: the wire type must be float32");
  }
  if (options.exact && options.op != ReduceOp::kSum) {
    return InvalidArgumentError("exact all-reduce: fixed point sums only, not " +
                                ReduceOpName(options.op));
  }
  if (options.exact) return ReduceExact(data, options);
  switch (options.wire) {
    case WireType::kBf16:
      return ReduceAs<Bf16>(data, options);
    case WireType::kFp16:
      return ReduceAs<Fp16>(data, options);
    case WireType::kFloat32:
      break;
  }
  return ReduceWith<float>(data, options, "all-reduce");
}

template <typename H>
Status Communicator::ReduceAs(std::span<float> data, const CollectiveOptions& options) {
  std::vector<H> wire(data.size());
  FromFloats<H>(data, wire);
  COHORT_RETURN_IF_ERROR(ReduceWith<H>(
      wire, options, std::is_same_v<H, Bf16> ? "bfloat16 all-reduce" : "float16 all-reduce"));
  ToFloats<H>(wire, data);
  return OkStatus();
}

Status Communicator::ReduceExact(std::span<float> data, const CollectiveOptions& options) {
  if (options.scale_bits < 0 || options.scale_bits > 60) {
    return InvalidArgumentError("exact all-reduce: scale_bits must be in [0, 60]");
  }
  // Fixed point: deterministic rounding and saturation, then integer sums.
  const double scale = std::ldexp(1.0, options.scale_bits);
  const double limit = std::ldexp(1.0, 62) / size();
  std::vector<int64_t> q(data.size());
  saturated_ = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    double v = std::nearbyint(double{data[i]} * scale);
    if (!(std::fabs(v) <= limit)) {  // Also NaN.
      ++saturated_;
      v = std::isnan(v) ? 0.0 : std::copysign(limit, v);
    }
    q[i] = static_cast<int64_t>(v);
  }
  COHORT_RETURN_IF_ERROR(ReduceWith<int64_t>(q, options, "exact all-reduce"));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(double(q[i]) / scale);
  return OkStatus();
}

template <typename T>
Status Communicator::BroadcastAs(std::span<T> data, int root, const CollectiveOptions& options) {
  if (root < 0 || root >= size()) {
    return InvalidArgumentError("broadcast from rank " + std::to_string(root) + " of " +
                                std::to_string(size()));
  }
  timeout_ms_ = options.timeout_ms;
  op_ = ReduceOp::kSum;
  return Run<T>(BroadcastSchedule(rank(), size(), data.size(), root), data,
                SteadyNowMs() + options.timeout_ms, "broadcast");
}

Status Communicator::Broadcast(std::span<float> data, int root, const CollectiveOptions& options) {
  return BroadcastAs<float>(data, root, options);
}

Status Communicator::Broadcast(std::span<uint8_t> data, int root,
                               const CollectiveOptions& options) {
  return BroadcastAs<uint8_t>(data, root, options);
}

Status Communicator::BroadcastSized(std::vector<uint8_t>& bytes, int root, size_t max_bytes,
                                    const CollectiveOptions& options) {
  // The root sends even a length over the limit, so that every rank fails
  // this call at once instead of waiting for bytes that never come.
  uint64_t length = bytes.size();
  COHORT_RETURN_IF_ERROR(BroadcastBytesOf(std::span<uint64_t>(&length, 1), root, options));
  if (length > max_bytes) {
    const std::string what =
        std::to_string(length) + " bytes (at most " + std::to_string(max_bytes) + ")";
    if (rank() == root) return InvalidArgumentError("broadcast of " + what);
    return DataLossError("rank " + std::to_string(root) + " broadcast a length of " + what);
  }
  if (rank() != root) bytes.assign(length, 0);
  return Broadcast(std::span<uint8_t>(bytes), root, options);
}

Status Communicator::Barrier(const CollectiveOptions& options) {
  int64_t token = 0;
  timeout_ms_ = options.timeout_ms;
  op_ = ReduceOp::kSum;
  return Run<int64_t>(RecursiveDoublingSchedule(rank(), size(), 1), std::span<int64_t>(&token, 1),
                      SteadyNowMs() + options.timeout_ms, "barrier");
}

}  // namespace cohort::collective
