// The ZeroMQ transport: one rank per process (or thread), over tcp:// between
// hosts or ipc:// on one host. Each rank binds one PULL socket (its inbox)
// and connects a PUSH socket to every peer's; a message is two frames, the
// sender's rank and the bytes. Every frame is checked: a malformed one is
// dropped and counted, never trusted.
//
// A peer that goes away is noticed, not waited for: a socket monitor sees
// the connection to its inbox close (its process ended or was killed), and
// ZeroMQ heartbeats close that connection when the peer stops answering
// (its host froze, or the network between went down).
#ifndef COHORT_NET_ZMQ_TRANSPORT_H_
#define COHORT_NET_ZMQ_TRANSPORT_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "collective/collective.h"
#include "collective/transport.h"
#include "crypto/key_files.h"

namespace cohort::net {

struct ZmqTransportOptions {
  int send_timeout_ms = 30000;  // A peer that takes nothing for this long fails Send.
  // Larger frames are refused by ZeroMQ before they are buffered.
  int64_t max_message_bytes = collective::kMaxCollectiveMessageBytes;
  // Messages an inbox holds at most before senders wait (with the size cap:
  // about 1 GiB).
  int receive_queue = 4096;
  // A heartbeat to each peer this often; a peer that answers nothing for
  // heartbeat_timeout_ms has its connection closed (ZMQ_HEARTBEAT_IVL,
  // ZMQ_HEARTBEAT_TIMEOUT; the peer closes ours after as long, TTL).
  // Multiples of 100 ms.
  int heartbeat_interval_ms = 1000;
  int heartbeat_timeout_ms = 5000;
  // Once a peer's connection has closed and nothing more has come from it
  // for this long (what it sent just before arrives first), it is gone.
  int gone_grace_ms = 500;
  // CURVE (authenticated and encrypted): this rank's keys. The inbox then
  // admits only clients its context's ZAP handler admits, and Connect needs
  // every peer's key and allowlist name. Null: plaintext, and the sender
  // rank in each message is taken on trust.
  const crypto::CurveKeys* curve = nullptr;
};

// A peer as CURVE knows it: the public key its inbox serves with, and the
// allowlist name (ZAP User-Id) its messages arrive with.
struct CurvePeer {
  crypto::X25519Public key{};
  std::string name;
};

class ZmqTransport final : public collective::Transport {
 public:
  // Binds this rank's inbox at `bind` (e.g. "tcp://127.0.0.1:0",
  // "ipc:///tmp/cohort-rank-3"); endpoint() is then where peers reach it.
  static StatusOr<std::unique_ptr<ZmqTransport>> Bind(zmq::context_t& context, int rank, int size,
                                                      const std::string& bind,
                                                      const ZmqTransportOptions& options = {});
  const std::string& endpoint() const { return endpoint_; }
  // Connects to every other rank; endpoints[r] is rank r's endpoint(). With
  // CURVE, peers[r] is rank r's key and name: a message that claims rank r
  // but was not sent with r's key is dropped and counted.
  Status Connect(const std::vector<std::string>& endpoints,
                 const std::vector<CurvePeer>& peers = {});
  // Keeps `resource` (the context's ZAP handler) until the sockets close.
  void KeepAlive(std::shared_ptr<void> resource) { keep_alive_ = std::move(resource); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // kUnavailable "zmq transport: rank N is gone ..." once rank N is gone
  // (see Receive).
  Status Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override;
  // What rank `peer` sent, in order. kUnavailable "zmq transport: rank N is
  // gone (...)" when the peer's connection, once up, closed (its process
  // ended or was killed: within gone_grace_ms) or it answered no heartbeat
  // (within heartbeat_timeout_ms + gone_grace_ms), and everything it sent
  // before has been received; for good, every later call says the same.
  // kDeadlineExceeded when the peer is there but sent nothing in time, or
  // never connected.
  StatusOr<collective::Message> Receive(int peer, TimeMs deadline) override;
  // Messages dropped because their frames were malformed.
  uint64_t dropped() const { return dropped_; }
  ~ZmqTransport() override { StopMonitors(); }

 private:
  ZmqTransport(zmq::context_t& context, int rank, int size, const ZmqTransportOptions& options);
  // Stops the connection monitors and closes their sockets: a monitor left
  // running past its socket leaks the events it queued (LeakSanitizer, in
  // make test-asan).
  void StopMonitors();
  // Reads what the monitor of the connection to `peer` reported.
  void ReadMonitor(int peer);
  // The peer's error once it is gone (OK until then).
  Status Gone(int peer);
  // Takes one message from the inbox when one is there (true), without
  // waiting.
  StatusOr<bool> ReadInbox();

  // What this rank knows of its connection to one peer's inbox.
  struct Link {
    bool up = false;         // The handshake succeeded and it has not closed since.
    bool closed = false;     // It was up, then closed, and has not come back.
    TimeMs quiet_since = 0;  // Closed, and nothing from the peer since.
    Status gone;             // Not OK once the peer is gone, for good.
  };

  std::shared_ptr<void> keep_alive_;  // First: destroyed after the sockets.
  zmq::context_t& context_;
  int rank_, size_;
  ZmqTransportOptions options_;
  zmq::socket_t inbox_;
  std::string endpoint_;
  std::vector<zmq::socket_t> out_;
  std::vector<zmq::socket_t> monitors_;  // Events of out_[r] (ZMQ_PAIR), by peer.
  std::vector<Link> links_;
  std::vector<std::deque<collective::Message>> pending_;  // Arrived early, by sender.
  std::vector<std::string> names_;  // CURVE: the User-Id of each rank's messages.
  uint64_t dropped_ = 0;
};

}  // namespace cohort::net

#endif  // COHORT_NET_ZMQ_TRANSPORT_H_
