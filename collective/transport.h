// Bytes between the ranks of a group, for the peer collectives
// (collective/collective.h). Gloo's shape: one small interface here, with
// the backends in net/: in-process (N ranks as threads: tests, a site's
// simulated ranks), shared memory (ranks on one host), TCP (a connection per
// pair, proving the pair's key), ZeroMQ (CURVE between hosts) and MPI.
#ifndef COHORT_COLLECTIVE_TRANSPORT_H_
#define COHORT_COLLECTIVE_TRANSPORT_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace cohort::collective {

// A received message. Its bytes stay valid while it lives; no copy is made
// to hand them over (the owner is the transport's own buffer).
class Message {
 public:
  Message() = default;
  Message(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes)
      : owner_(std::move(owner)), bytes_(bytes) {}
  explicit Message(std::vector<uint8_t> bytes) {
    auto v = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
    bytes_ = std::span<const uint8_t>(*v);
    owner_ = std::move(v);
  }
  std::span<const uint8_t> bytes() const { return bytes_; }
  const uint8_t* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }

 private:
  std::shared_ptr<const void> owner_;
  std::span<const uint8_t> bytes_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Queues one message, `head` then `body`, for `peer` and returns without
  // waiting for the peer (the transport copies them once); messages from
  // one rank to another arrive in the order sent.
  virtual Status Send(int peer, std::span<const uint8_t> head,
                      std::span<const uint8_t> body = {}) = 0;
  // How many bytes one peer can take ahead of its reading without the
  // transport copying or holding them back: a collective sends at most this
  // far ahead of what it receives from the same exchange.
  virtual size_t window_bytes() const { return SIZE_MAX; }
  // Waits until everything sent has been handed over to the peers, for a
  // transport that may hold messages back (shared memory, when a ring is
  // full); they move on only during Send, Receive and Flush.
  virtual Status Flush(TimeMs deadline) {
    (void)deadline;
    return OkStatus();
  }
  // The next message from `peer`, waiting until `deadline` (a SteadyNowMs()
  // time): kDeadlineExceeded when none came in time, kUnavailable when the
  // peer is known to be gone.
  virtual StatusOr<Message> Receive(int peer, TimeMs deadline) = 0;

  // Single-copy transfers, for bodies the sender leaves unchanged until its
  // next Flush returns. SendFinal is Send, except that a transport may hand
  // the receiver a reference to `body` instead of its bytes (shared memory:
  // the receiver reads it out of the sender's memory, Linux CMA); Flush
  // then also waits until the peer has read it.
  virtual Status SendFinal(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) {
    return Send(peer, head, body);
  }
  // Withdraws what SendFinal sent and no peer has read yet, before the
  // sender lets its bodies change (a collective that failed): a peer's
  // later read of one fails instead of returning what the memory holds then.
  virtual void Revoke() {}
  // Receive, with the bytes after the first `head_bytes` written straight
  // into `body` when the message has exactly head_bytes + body.size()
  // bytes (*landed = true; the Message may then hold the head alone).
  // Otherwise the whole message comes back and `body` is left alone. The
  // caller checks the head afterwards: a message that proves not to be the
  // one expected may already have overwritten `body`.
  virtual StatusOr<Message> ReceiveInto(int peer, TimeMs deadline, size_t head_bytes,
                                        std::span<uint8_t> body, bool* landed) {
    StatusOr<Message> m = Receive(peer, deadline);
    *landed = m.ok() && m->size() == head_bytes + body.size();
    if (*landed && !body.empty()) std::memcpy(body.data(), m->data() + head_bytes, body.size());
    return m;
  }
};

}  // namespace cohort::collective

#endif  // COHORT_COLLECTIVE_TRANSPORT_H_
