#include "net/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <mutex>
#include <random>

#include "net/group.h"
#include "net/join.h"
#include "net/rendezvous.h"

namespace cohort::net {
namespace {

constexpr uint64_t kMagic = 0x31724d4853686f43;  // "CohSHMr1"
constexpr uint64_t kSkip = ~uint64_t{0};         // Record: the rest of the ring is unused.
// Record length flag: the record holds a head and where the body is in the
// sender's memory (DirectRef), for the receiver to read in place (CMA).
constexpr uint64_t kDirect = uint64_t{1} << 62;
// Bodies at least this long may go direct: below it the copy is cheaper
// than the system call.
constexpr size_t kDirectMinBytes = 64 * 1024;
// What a rank's header points its peers at, to learn whether they may read
// its memory (ptrace rules, e.g. Yama, may forbid it).
const uint64_t kProbe = 0x65626f7250686f43;  // "CohProbe"
constexpr uint64_t kAlign = 64;
// Turns of a wait loop before a futex sleep. Each is a pause instruction
// when every rank has a core; when ranks outnumber cores each yields the
// core at once (the peer waited for may be queued behind this rank: 200
// pauses first, about 10 us here, took 4 ranks on 2 cores from 9 to 15 us
// at 4 KiB).
constexpr int kSpins = 2000;
constexpr TimeMs kNap = 50;  // Longest futex sleep between checks of the clock and the peer.
constexpr char kScheme[] = "shm://";

// The control block of one ring. head: written by the producer only; tail:
// by the consumer only. The sequence words are futexes.
struct alignas(64) RingControl {
  std::atomic<uint64_t> head;
  // Bumped by the producer when it withdraws the bodies it sent by
  // reference (Revoke): a direct record of an older epoch is not read.
  std::atomic<uint64_t> epoch;
  char pad0[48];
  std::atomic<uint64_t> tail;
  std::atomic<uint64_t> direct_done;   // Direct bodies read so far.
  std::atomic<uint32_t> reads_direct;  // 1: the consumer may read the producer's memory.
  char pad1[44];
  std::atomic<uint32_t> data_seq;  // Bumped on every publish.
  std::atomic<uint32_t> consumer_waiting;
  char pad2[56];
  std::atomic<uint32_t> space_seq;  // Bumped on every release.
  std::atomic<uint32_t> producer_waiting;
  char pad3[56];
};
static_assert(sizeof(RingControl) == 256);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct alignas(64) Header {
  uint64_t magic;
  int32_t rank, size, pid, pad;
  uint64_t ring_bytes, total_bytes;
  uint64_t probe_address;  // Of kProbe, in this rank's process.
};
static_assert(sizeof(Header) == 64);

// A direct record's tail: where its body is in the sender's process.
struct DirectRef {
  uint64_t address, length, epoch;
};

// Reads `length` bytes at `address` of process `pid` into `out`; false
// with errno set when the kernel refuses or the peer is gone.
bool ReadPeer(int pid, uint64_t address, uint8_t* out, size_t length) {
  size_t done = 0;
  while (done < length) {
    iovec local{out + done, length - done};
    iovec remote{reinterpret_cast<void*>(address + done), length - done};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n == 0) errno = EFAULT;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t TotalBytes(int size, size_t ring_bytes) {
  return sizeof(Header) + static_cast<size_t>(size) * (sizeof(RingControl) + ring_bytes);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, TimeMs ms) {
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Maps the pages of [offset, offset + length) of a mapping now: a page
// fault per 4 KiB of ring on first use costs more than a small message's
// whole exchange. Best effort (Linux 5.14 and later).
void Populate(void* base, size_t offset, size_t length) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  (void)madvise(static_cast<uint8_t*>(base) + begin, offset + length - begin, MADV_POPULATE_WRITE);
}

bool ProcessGone(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// One turn of a wait loop: pause instructions while `spin` < `pauses`,
// then yield the core (ranks outnumber cores, and the peer may need this
// one).
void Pause(int spin, int pauses) {
  if (spin >= pauses) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct ShmTransport::Segment {
  void* base = MAP_FAILED;
  size_t length = 0;
  ~Segment() {
    if (base != MAP_FAILED) munmap(base, length);
  }
  Header* header() const { return static_cast<Header*>(base); }
  uint64_t ring_bytes() const { return header()->ring_bytes; }
  RingControl* control(int i) const {
    auto* p = static_cast<uint8_t*>(base) + sizeof(Header) +
              static_cast<size_t>(i) * (sizeof(RingControl) + ring_bytes());
    return reinterpret_cast<RingControl*>(p);
  }
  uint8_t* data(int i) const { return reinterpret_cast<uint8_t*>(control(i) + 1); }
};

// This rank's end of the ring a peer writes into. Messages are released in
// any order; the tail moves over the released prefix.
struct ShmTransport::Reader {
  std::shared_ptr<Segment> segment;  // Keeps the mapping while messages live.
  RingControl* control = nullptr;
  uint8_t* data = nullptr;
  uint64_t capacity = 0;
  uint64_t read = 0;  // Where the next record starts.
  std::mutex mu;      // Guards the in-flight list (messages may die on any thread).
  std::deque<std::pair<uint64_t, bool>> in_flight;  // (record end, released)
  uint64_t first = 0;                               // Index of in_flight.front().

  uint64_t Push(uint64_t end, bool released) {
    std::lock_guard<std::mutex> lock(mu);
    in_flight.emplace_back(end, released);
    const uint64_t index = first + in_flight.size() - 1;
    if (released) ReleaseLocked(index);
    return index;
  }
  void Release(uint64_t index) {
    std::lock_guard<std::mutex> lock(mu);
    ReleaseLocked(index);
  }
  void ReleaseLocked(uint64_t index) {
    in_flight[index - first].second = true;
    uint64_t tail = 0;
    bool moved = false;
    while (!in_flight.empty() && in_flight.front().second) {
      tail = in_flight.front().first;
      in_flight.pop_front();
      ++first;
      moved = true;
    }
    if (!moved) return;
    control->tail.store(tail, std::memory_order_seq_cst);
    control->space_seq.fetch_add(1, std::memory_order_seq_cst);
    if (control->producer_waiting.load(std::memory_order_seq_cst)) FutexWake(&control->space_seq);
  }
};

namespace {

// Frees a message's ring space when the last copy of the Message goes.
struct Ticket {
  std::shared_ptr<ShmTransport::Reader> reader;
  uint64_t index;
  ~Ticket() { reader->Release(index); }
};

}  // namespace

ShmTransport::ShmTransport(int rank, int size, const ShmTransportOptions& options)
    : rank_(rank),
      size_(size),
      pauses_(size > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : kSpins),
      options_(options),
      peers_(size),
      readers_(size),
      queues_(size),
      direct_sent_(size, 0),
      pids_(size, 0) {}

ShmTransport::~ShmTransport() { Unlink(); }

void ShmTransport::Unlink() {
  if (unlinked_ || name_.empty()) return;
  shm_unlink(name_.c_str());
  unlinked_ = true;
}

StatusOr<std::unique_ptr<ShmTransport>> ShmTransport::Create(int rank, int size,
                                                             const ShmTransportOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("shm transport: rank " + std::to_string(rank) + " of " +
                                std::to_string(size));
  }
  if (options.ring_bytes < (size_t{1} << 20) || options.ring_bytes % 4096 != 0 ||
      options.ring_bytes > (size_t{1} << 30)) {
    return InvalidArgumentError(
        "shm transport: ring_bytes must be a multiple of 4096 in [1 MiB, "
        "1 GiB]");
  }
  std::unique_ptr<ShmTransport> t(new ShmTransport(rank, size, options));
  std::random_device random;
  char name[96];
  std::snprintf(name, sizeof(name), "/cohort-%d-%d-%08x%08x", static_cast<int>(getpid()), rank,
                random(), random());
  t->name_ = name;
  t->endpoint_ = std::string(kScheme) + (name + 1);
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return UnavailableError("shm_open " + t->name_ + ": " + std::strerror(errno));
  auto segment = std::make_shared<Segment>();
  segment->length = TotalBytes(size, options.ring_bytes);
  if (ftruncate(fd, static_cast<off_t>(segment->length)) != 0) {
    const int e = errno;
    close(fd);
    t->Unlink();
    return ResourceExhaustedError("shm transport: cannot size " + t->name_ + " to " +
                                  std::to_string(segment->length) + " bytes: " + std::strerror(e));
  }
  segment->base = mmap(nullptr, segment->length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (segment->base == MAP_FAILED) {
    t->Unlink();
    return ResourceExhaustedError("shm transport: mmap " + t->name_ + ": " + std::strerror(errno));
  }
  // ftruncate zero-filled it: every ring is empty, every atomic zero.
  Header* h = segment->header();
  h->rank = rank;
  h->size = size;
  h->pid = static_cast<int32_t>(getpid());
  h->ring_bytes = options.ring_bytes;
  h->total_bytes = segment->length;
  h->probe_address = reinterpret_cast<uint64_t>(&kProbe);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  Populate(segment->base, 0, segment->length);  // Every ring this rank reads.
  t->inbox_ = segment;
  for (int r = 0; r < size; ++r) {
    auto reader = std::make_shared<Reader>();
    reader->segment = segment;
    reader->control = segment->control(r);
    reader->data = segment->data(r);
    reader->capacity = options.ring_bytes;
    t->readers_[r] = std::move(reader);
  }
  return t;
}

Status ShmTransport::Connect(const std::vector<std::string>& endpoints) {
  if (endpoints.size() != static_cast<size_t>(size_)) {
    return InvalidArgumentError("shm transport: " + std::to_string(endpoints.size()) +
                                " endpoints for " + std::to_string(size_) + " ranks");
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string& e = endpoints[r];
    const std::string what =
        "shm transport: rank " + std::to_string(r) + "'s endpoint \"" + e.substr(0, 80) + "\"";
    if (e.rfind(kScheme, 0) != 0 || e.size() > 90 || e.find('/', 6) != std::string::npos) {
      return InvalidArgumentError(what + " is not shm://NAME");
    }
    const std::string name = "/" + e.substr(6);
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return UnavailableError(what + ": " + std::strerror(errno));
    struct stat st {};
    // The size must be that of a group of this size with a ring of 1 MiB to
    // 1 GiB, before anything is mapped (and populated).
    const uint64_t per_sender =
        fstat(fd, &st) != 0 || st.st_size <= static_cast<off_t>(sizeof(Header)) ||
                (static_cast<uint64_t>(st.st_size) - sizeof(Header)) % size_ != 0
            ? 0
            : (static_cast<uint64_t>(st.st_size) - sizeof(Header)) / size_;
    if (per_sender < sizeof(RingControl) + (1u << 20) ||
        per_sender > sizeof(RingControl) + (1u << 30) ||
        (per_sender - sizeof(RingControl)) % 4096 != 0) {
      close(fd);
      return InvalidArgumentError(what + " is not an inbox of a " + std::to_string(size_) +
                                  "-rank group (its size is wrong)");
    }
    auto segment = std::make_shared<Segment>();
    segment->length = static_cast<size_t>(st.st_size);
    segment->base = mmap(nullptr, segment->length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (segment->base == MAP_FAILED) return UnavailableError(what + ": " + std::strerror(errno));
    const Header* h = segment->header();
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->magic != kMagic || h->rank != r || h->size != size_ || h->ring_bytes < (1u << 20) ||
        h->ring_bytes % 4096 != 0 || h->total_bytes != segment->length ||
        TotalBytes(size_, h->ring_bytes) != segment->length) {
      return InvalidArgumentError(what + " is not rank " + std::to_string(r) + "'s inbox of a " +
                                  std::to_string(size_) + "-rank group");
    }
    // The one ring of the peer's inbox that this rank writes.
    const size_t ring = static_cast<uint8_t*>(static_cast<void*>(segment->control(rank_))) -
                        static_cast<uint8_t*>(segment->base);
    Populate(segment->base, ring, sizeof(RingControl) + h->ring_bytes);
    // Whether this rank may read the peer's memory: then the peer may send
    // final bodies by reference (SendFinal).
    uint64_t probe = 0;
    const bool readable =
        ReadPeer(h->pid, h->probe_address, reinterpret_cast<uint8_t*>(&probe), sizeof(probe)) &&
        probe == kProbe;
    inbox_->control(r)->reads_direct.store(readable ? 1 : 0, std::memory_order_release);
    pids_[r] = h->pid;  // Read once: the peer can write its header later.
    peers_[r] = std::move(segment);
  }
  return OkStatus();
}

StatusOr<bool> ShmTransport::TryWrite(int peer, std::span<const uint8_t> head,
                                      std::span<const uint8_t> body, bool direct) {
  const Segment& s = *peers_[peer];
  RingControl* c = s.control(rank_);
  uint8_t* data = s.data(rank_);
  const uint64_t capacity = s.ring_bytes();
  const uint64_t length = head.size() + body.size();
  const uint64_t tag = direct ? length | kDirect : length;
  const uint64_t record = RoundUp(sizeof(uint64_t) + length);
  uint64_t pos = c->head.load(std::memory_order_relaxed);
  const uint64_t room = capacity - pos % capacity;  // Contiguous to the ring's end.
  const uint64_t needed = record > room ? room + record : record;
  const uint64_t tail = c->tail.load(std::memory_order_acquire);
  if (pos - tail > capacity) {
    return DataLossError("shm transport: rank " + std::to_string(peer) +
                         " left its ring from rank " + std::to_string(rank_) + " corrupt");
  }
  if (capacity - (pos - tail) < needed) return false;
  if (record > room) {
    std::memcpy(data + pos % capacity, &kSkip, sizeof(kSkip));
    pos += room;
  }
  uint8_t* at = data + pos % capacity;
  std::memcpy(at, &tag, sizeof(tag));
  if (!head.empty()) std::memcpy(at + sizeof(length), head.data(), head.size());
  if (!body.empty()) std::memcpy(at + sizeof(length) + head.size(), body.data(), body.size());
  c->head.store(pos + record, std::memory_order_seq_cst);
  c->data_seq.fetch_add(1, std::memory_order_seq_cst);
  if (c->consumer_waiting.load(std::memory_order_seq_cst)) FutexWake(&c->data_seq);
  return true;
}

Status ShmTransport::FlushSome() {
  if (queued_ == 0) return OkStatus();
  for (int p = 0; p < size_; ++p) {
    auto& queue = queues_[p];
    while (!queue.empty()) {
      COHORT_ASSIGN_OR_RETURN(bool wrote, TryWrite(p, queue.front(), {}, false));
      if (!wrote) break;
      queue.pop_front();
      --queued_;
    }
  }
  return OkStatus();
}

Status ShmTransport::Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) {
  if (peer < 0 || peer >= size_ || peer == rank_ || !peers_[peer]) {
    return InvalidArgumentError("shm transport: no connected rank " + std::to_string(peer));
  }
  const uint64_t length = head.size() + body.size();
  if (RoundUp(sizeof(uint64_t) + length) > peers_[peer]->ring_bytes() / 2) {
    return InvalidArgumentError("shm transport: a message of " + std::to_string(length) +
                                " bytes does not fit the " +
                                std::to_string(peers_[peer]->ring_bytes()) + "-byte ring");
  }
  COHORT_RETURN_IF_ERROR(FlushSome());
  if (queues_[peer].empty()) {
    COHORT_ASSIGN_OR_RETURN(bool wrote, TryWrite(peer, head, body, false));
    if (wrote) return OkStatus();
  }
  // The ring is full: keep a copy, written by a later Send, Receive or
  // Flush (the peer may be sending to this rank too, and reads only later).
  std::vector<uint8_t> copy(length);
  if (!head.empty()) std::memcpy(copy.data(), head.data(), head.size());
  if (!body.empty()) std::memcpy(copy.data() + head.size(), body.data(), body.size());
  queues_[peer].push_back(std::move(copy));
  ++queued_;
  return OkStatus();
}

Status ShmTransport::SendFinal(int peer, std::span<const uint8_t> head,
                               std::span<const uint8_t> body) {
  if (body.size() < kDirectMinBytes || peer < 0 || peer >= size_ || peer == rank_ ||
      !peers_[peer] || !queues_[peer].empty() ||
      peers_[peer]->control(rank_)->reads_direct.load(std::memory_order_acquire) != 1 ||
      body.size() > peers_[peer]->ring_bytes() / 2) {
    return Send(peer, head, body);
  }
  COHORT_RETURN_IF_ERROR(FlushSome());
  const DirectRef ref{reinterpret_cast<uint64_t>(body.data()), body.size(),
                      peers_[peer]->control(rank_)->epoch.load(std::memory_order_relaxed)};
  std::vector<uint8_t> record(head.size() + sizeof(ref));
  std::memcpy(record.data(), head.data(), head.size());
  std::memcpy(record.data() + head.size(), &ref, sizeof(ref));
  COHORT_ASSIGN_OR_RETURN(bool wrote, TryWrite(peer, record, {}, true));
  if (!wrote) return Send(peer, head, body);  // Ring full: a copy, queued.
  ++direct_sent_[peer];
  return OkStatus();
}

void ShmTransport::Revoke() {
  for (int p = 0; p < size_; ++p) {
    if (peers_[p] == nullptr) continue;
    RingControl* c = peers_[p]->control(rank_);
    if (c->direct_done.load(std::memory_order_seq_cst) < direct_sent_[p]) {
      c->epoch.fetch_add(1, std::memory_order_seq_cst);
    }
  }
}

bool ShmTransport::DirectPending(int* peer) const {
  for (int p = 0; p < size_; ++p) {
    if (direct_sent_[p] != 0 &&
        peers_[p]->control(rank_)->direct_done.load(std::memory_order_acquire) < direct_sent_[p]) {
      *peer = p;
      return true;
    }
  }
  return false;
}

Status ShmTransport::Flush(TimeMs deadline) {
  for (int spin = 0;; ++spin) {
    COHORT_RETURN_IF_ERROR(FlushSome());
    int peer = 0;
    const bool reading = DirectPending(&peer);  // A peer still reads a body in place.
    if (queued_ == 0 && !reading) return OkStatus();
    if (spin < kSpins) {
      Pause(spin, pauses_);
      continue;
    }
    if (!reading) {
      peer = 0;
      while (queues_[peer].empty()) ++peer;
    }
    const TimeMs now = SteadyNowMs();
    if (now >= deadline) {
      if (reading) {
        // The count stays: the peer consumes its records in order, so the
        // next Flush waits for this one too.
        return DeadlineExceededError("shm transport: rank " + std::to_string(peer) +
                                     " did not read what rank " + std::to_string(rank_) +
                                     " sent in time");
      }
      return DeadlineExceededError("shm transport: rank " + std::to_string(peer) +
                                   " took nothing from rank " + std::to_string(rank_) + " in time");
    }
    if (ProcessGone(pids_[peer])) {
      return UnavailableError("rank " + std::to_string(peer) + " is gone (its process exited)");
    }
    RingControl* c = peers_[peer]->control(rank_);
    c->producer_waiting.store(1, std::memory_order_seq_cst);
    const uint32_t seq = c->space_seq.load(std::memory_order_seq_cst);
    FutexWait(&c->space_seq, seq, std::min<TimeMs>(1, deadline - now));
    c->producer_waiting.store(0, std::memory_order_relaxed);
  }
}

StatusOr<ShmTransport::Record> ShmTransport::Next(int peer, TimeMs deadline) {
  if (peer < 0 || peer >= size_ || peer == rank_ || !peers_[peer]) {
    return InvalidArgumentError("shm transport: no connected rank " + std::to_string(peer));
  }
  const std::shared_ptr<Reader>& reader = readers_[peer];
  Reader& r = *reader;
  RingControl* c = r.control;
  const std::string from = "rank " + std::to_string(peer);
  for (int spin = 0;; ++spin) {
    const uint64_t head = c->head.load(std::memory_order_acquire);
    if (head - r.read > r.capacity) {
      return DataLossError("shm transport: " + from + " corrupted its ring (head " +
                           std::to_string(head) + ", read " + std::to_string(r.read) + ")");
    }
    if (head != r.read) {
      const uint64_t offset = r.read % r.capacity;
      const uint64_t room = r.capacity - offset;
      uint64_t length;
      std::memcpy(&length, r.data + offset, sizeof(length));
      if (length == kSkip) {
        if (head - r.read < room) {
          return DataLossError("shm transport: " + from + " skipped past its head");
        }
        r.read += room;
        r.Push(r.read, /*released=*/true);
        continue;
      }
      const bool direct = (length & kDirect) != 0;
      length &= ~kDirect;
      const uint64_t record = length <= r.capacity ? RoundUp(sizeof(length) + length) : ~0ull;
      if (record > room || record > head - r.read || (direct && length < sizeof(DirectRef))) {
        return DataLossError("shm transport: " + from + " wrote a record of " +
                             std::to_string(length) + " bytes that overruns its ring");
      }
      const uint8_t* bytes = r.data + offset + sizeof(length);
      r.read += record;
      std::shared_ptr<const void> ticket(new Ticket{reader, r.Push(r.read, false)});
      return Record{std::move(ticket), bytes, length, direct};
    }
    // Waiting here, this rank still hands over what it queued (the peer may
    // be waiting for exactly that before it sends).
    COHORT_RETURN_IF_ERROR(FlushSome());
    if (spin < kSpins) {
      Pause(spin, pauses_);
      continue;
    }
    const TimeMs now = SteadyNowMs();
    if (now >= deadline) return DeadlineExceededError(from + " sent nothing in time");
    if (ProcessGone(pids_[peer])) {
      return UnavailableError(from + " is gone (its process exited)");
    }
    c->consumer_waiting.store(1, std::memory_order_seq_cst);
    const uint32_t seq = c->data_seq.load(std::memory_order_seq_cst);
    if (c->head.load(std::memory_order_seq_cst) == r.read) {
      // With messages queued, nap briefly: their peer frees space without
      // waking this futex.
      FutexWait(&c->data_seq, seq, std::min(queued_ > 0 ? 1 : kNap, deadline - now));
    }
    c->consumer_waiting.store(0, std::memory_order_relaxed);
  }
}

// A direct record's body, read out of the sender's memory into `out`
// (exactly `out.size()` bytes, checked against the reference).
Status ShmTransport::ReadDirect(int peer, const Record& rec, std::span<uint8_t> out) {
  DirectRef ref;
  std::memcpy(&ref, rec.bytes + rec.length - sizeof(ref), sizeof(ref));
  RingControl* c = readers_[peer]->control;
  // Withdrawn (the sender gave up on its collective and may have reused the
  // memory): before the read, or while it ran (what was read is discarded).
  auto withdrawn = [&] { return c->epoch.load(std::memory_order_seq_cst) != ref.epoch; };
  Status read = OkStatus();
  if (ref.length != out.size()) {
    read = DataLossError("shm transport: rank " + std::to_string(peer) + " referred to " +
                         std::to_string(ref.length) + " bytes where " + std::to_string(out.size()) +
                         " were due");
  } else if (withdrawn() || !ReadPeer(pids_[peer], ref.address, out.data(), out.size()) ||
             withdrawn()) {
    read = withdrawn()
               ? UnavailableError("shm transport: rank " + std::to_string(peer) +
                                  " withdrew a message it had sent (it gave up)")
               : UnavailableError("shm transport: cannot read rank " + std::to_string(peer) +
                                  "'s message in place: " + std::strerror(errno));
  }
  // Counted whether read or not: the sender's Flush waits for the records
  // its peer has consumed, in order.
  c->direct_done.fetch_add(1, std::memory_order_seq_cst);
  c->space_seq.fetch_add(1, std::memory_order_seq_cst);
  if (c->producer_waiting.load(std::memory_order_seq_cst)) FutexWake(&c->space_seq);
  return read;
}

StatusOr<collective::Message> ShmTransport::Receive(int peer, TimeMs deadline) {
  COHORT_ASSIGN_OR_RETURN(Record rec, Next(peer, deadline));
  return Materialize(peer, std::move(rec));
}

// A record as a whole message: in place in the ring, or for a reference its
// head and the body read out of the sender's memory.
StatusOr<collective::Message> ShmTransport::Materialize(int peer, Record rec) {
  if (!rec.direct) return collective::Message(std::move(rec.ticket), {rec.bytes, rec.length});
  // A reference: the message is its head and the body read in place.
  const size_t head = rec.length - sizeof(DirectRef);
  DirectRef ref;
  std::memcpy(&ref, rec.bytes + head, sizeof(ref));
  if (ref.length > readers_[peer]->capacity / 2) {
    std::vector<uint8_t> none;
    (void)ReadDirect(peer, rec, none);  // Consumed, not read.
    return DataLossError("shm transport: rank " + std::to_string(peer) + " referred to " +
                         std::to_string(ref.length) + " bytes, more than a message may hold");
  }
  std::vector<uint8_t> all(head + ref.length);
  std::memcpy(all.data(), rec.bytes, head);
  COHORT_RETURN_IF_ERROR(ReadDirect(peer, rec, std::span<uint8_t>(all).subspan(head)));
  return collective::Message(std::move(all));
}

StatusOr<collective::Message> ShmTransport::ReceiveInto(int peer, TimeMs deadline,
                                                        size_t head_bytes, std::span<uint8_t> body,
                                                        bool* landed) {
  *landed = false;
  COHORT_ASSIGN_OR_RETURN(Record rec, Next(peer, deadline));
  if (!rec.direct) {
    if (rec.length == head_bytes + body.size()) {
      std::memcpy(body.data(), rec.bytes + head_bytes, body.size());
      *landed = true;
    }
    return collective::Message(std::move(rec.ticket), {rec.bytes, rec.length});
  }
  DirectRef ref;
  std::memcpy(&ref, rec.bytes + rec.length - sizeof(ref), sizeof(ref));
  if (rec.length - sizeof(ref) != head_bytes || ref.length != body.size()) {
    return Materialize(peer, std::move(rec));  // Not what was due: for the caller to name.
  }
  COHORT_RETURN_IF_ERROR(ReadDirect(peer, rec, body));
  *landed = true;
  return collective::Message(std::vector<uint8_t>(rec.bytes, rec.bytes + head_bytes));
}

StatusOr<std::unique_ptr<collective::Transport>> JoinSharedMemory(const JoinRequest& r) {
  const GroupOptions& o = r.options;
  if (o.master.rfind("ipc://", 0) != 0 && !o.insecure) {
    // The ranks would meet over the network without authenticating.
    return FailedPreconditionError("shared memory with a rendezvous at " + o.master +
                                   ": meet at an ipc:// address (one host), or say it is insecure");
  }
  COHORT_ASSIGN_OR_RETURN(auto shm, ShmTransport::Create(o.rank, o.size));
  COHORT_ASSIGN_OR_RETURN(
      std::vector<std::string> endpoints,
      Rendezvous(r.context, o.rank, o.size, o.master, shm->endpoint(), r.deadline));
  COHORT_RETURN_IF_ERROR(shm->Connect(endpoints));
  // Once every rank has mapped every inbox, the names can go: nothing is
  // left in /dev/shm however the group ends.
  COHORT_RETURN_IF_ERROR(collective::Communicator(shm.get()).Barrier(r.collective));
  shm->Unlink();
  return std::unique_ptr<collective::Transport>(std::move(shm));
}

}  // namespace cohort::net
