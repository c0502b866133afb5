// The shared-memory transport: ranks that are processes (or threads) on one
// host. Each rank creates one POSIX shared-memory segment, its inbox, with
// a single-producer single-consumer ring per sender; peers map it and write
// their messages straight into their ring (one copy), and the receiver hands
// them to the collective in place (no copy out: a Message points into the
// ring, and its space is released when the Message is destroyed). Waiting
// spins briefly, then sleeps on a futex in the ring.
//
// Everything a peer writes into the segment (ring positions, record
// lengths) is checked before it is used: a corrupt ring is an error naming
// the rank, never a read outside the ring. A receiver also notices a peer
// process that is gone (kUnavailable) without waiting for the deadline.
#ifndef COHORT_NET_SHM_TRANSPORT_H_
#define COHORT_NET_SHM_TRANSPORT_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "collective/transport.h"

namespace cohort::net {

struct ShmTransportOptions {
  // Bytes of each sender's ring (a multiple of 4 KiB, at least 1 MiB): how
  // much one peer may have in flight to this rank.
  size_t ring_bytes = size_t{2} << 20;
};

class ShmTransport final : public collective::Transport {
 public:
  // Creates this rank's inbox; endpoint() ("shm://NAME") is where peers
  // find it.
  static StatusOr<std::unique_ptr<ShmTransport>> Create(int rank, int size,
                                                        const ShmTransportOptions& options = {});
  ~ShmTransport() override;
  const std::string& endpoint() const { return endpoint_; }
  // Maps every other rank's inbox; endpoints[r] is rank r's endpoint().
  // kInvalidArgument for an endpoint that is not a segment of this shape.
  Status Connect(const std::vector<std::string>& endpoints);
  // Removes the segment's name (the mappings stay): call once every peer
  // has connected. Done at destruction otherwise.
  void Unlink();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Writes into the peer's ring, or, when it is full, queues a copy that a
  // later Send, Receive or Flush writes.
  Status Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override;
  StatusOr<collective::Message> Receive(int peer, TimeMs deadline) override;
  // Bodies of 64 KiB and more go by reference when the peer may read this
  // process's memory (probed at Connect: process_vm_readv, which ptrace
  // rules such as Yama's may forbid); the peer then reads them in place,
  // one copy instead of two, and Flush waits until it has.
  Status SendFinal(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override;
  StatusOr<collective::Message> ReceiveInto(int peer, TimeMs deadline, size_t head_bytes,
                                            std::span<uint8_t> body, bool* landed) override;
  Status Flush(TimeMs deadline) override;
  // Bumps the epoch of every ring whose peer has not read all it was sent
  // by reference: those records are no longer read (an error there).
  void Revoke() override;
  size_t window_bytes() const override { return options_.ring_bytes / 2; }

  struct Segment;  // A mapped inbox (shm_transport.cc).
  struct Reader;   // This rank's end of one inbound ring.

 private:
  ShmTransport(int rank, int size, const ShmTransportOptions& options);
  // A record of a peer's ring, held until `ticket` goes: bytes in place, or
  // (direct) a head and a DirectRef to the body in the peer's memory.
  struct Record {
    std::shared_ptr<const void> ticket;
    const uint8_t* bytes;
    uint64_t length;
    bool direct;
  };
  // Writes one message if the ring has room (false when it has not);
  // `direct`: a head and a reference.
  StatusOr<bool> TryWrite(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body,
                          bool direct);
  // The next record from `peer`, waiting until `deadline`.
  StatusOr<Record> Next(int peer, TimeMs deadline);
  StatusOr<collective::Message> Materialize(int peer, Record rec);
  // A direct record's body into `out` (its size checked), counted as read.
  Status ReadDirect(int peer, const Record& rec, std::span<uint8_t> out);
  // Whether a peer has not yet read every body sent it by reference.
  bool DirectPending(int* peer) const;
  // Writes queued messages while their rings have room.
  Status FlushSome();

  int rank_, size_;
  int pauses_;  // Wait-loop turns that spin before turns that yield.
  ShmTransportOptions options_;
  std::string name_, endpoint_;
  bool unlinked_ = false;
  std::shared_ptr<Segment> inbox_;
  std::vector<std::shared_ptr<Segment>> peers_;  // Their inboxes, by rank.
  std::vector<std::shared_ptr<Reader>> readers_;
  std::vector<std::deque<std::vector<uint8_t>>> queues_;  // Waiting for ring space, by peer.
  size_t queued_ = 0;
  std::vector<uint64_t> direct_sent_;  // Bodies sent by reference, by peer.
  std::vector<int> pids_;              // Each peer's process, from its header at Connect.
};

}  // namespace cohort::net

#endif  // COHORT_NET_SHM_TRANSPORT_H_
