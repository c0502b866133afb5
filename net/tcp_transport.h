// The TCP transport: ranks on hosts that reach each other over TCP, with no
// message library between them (Gloo's model). One connection per pair of
// ranks; a message is a 4-byte length and the bytes, written straight from
// the caller's buffers (what the socket does not take at once is copied to a
// queue that later calls write), and read into pooled buffers the collective
// sums from in place.
//
// Each connection opens with a handshake that binds it to one rank: the
// connecting (lower) rank says who it is and who it wants, both ends send a
// fresh nonce, and each proves it holds the key of the pair (a keyed
// BLAKE2b over the hello and both nonces). The pair's key comes from the two
// ranks' X25519 identity keys, so only those two can make it: no stranger
// joins, and no member speaks as another. The data that follows is neither
// encrypted nor authenticated message by message: for trusted fabrics. The
// encrypted alternative is ZmqTransport with CURVE. Without keys the
// handshake checks only the rank numbers (plaintext, taken on trust).
#ifndef COHORT_NET_TCP_TRANSPORT_H_
#define COHORT_NET_TCP_TRANSPORT_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "collective/collective.h"
#include "collective/transport.h"
#include "common/secret_bytes.h"

namespace cohort::net {

struct TcpTransportOptions {
  // What a peer takes ahead of its reading without copies: the socket
  // buffers, which Listen and Connect size to this.
  size_t window_bytes = size_t{1} << 20;
  // A longer message is a broken stream (kDataLoss naming the peer).
  size_t max_message_bytes = collective::kMaxCollectiveMessageBytes;
  // A connection that has not finished its handshake in this time is closed.
  int handshake_timeout_ms = 5000;
};

class TcpTransport final : public collective::Transport {
 public:
  // Listens on `host`, port 0; endpoint() ("tcp://HOST:PORT") is where
  // peers reach this rank.
  static StatusOr<std::unique_ptr<TcpTransport>> Listen(int rank, int size, const std::string& host,
                                                        const TcpTransportOptions& options = {});
  ~TcpTransport() override;
  const std::string& endpoint() const { return endpoint_; }

  // Connects to every higher rank and accepts every lower one, by
  // `deadline`; endpoints[r] is rank r's endpoint(). pair_keys[r] is the
  // 32-byte key this rank shares with rank r (empty: no authentication). A
  // connection that fails its handshake (a stranger, a wrong key, a rank
  // already connected) is closed, logged and counted, and the wait goes on;
  // idle ones make room for newer ones, so no number of strangers keeps a
  // rank out.
  // kDeadlineExceeded names the lower ranks that never connected;
  // kUnavailable names a higher rank that could not be reached or could not
  // prove the pair's key.
  Status Connect(const std::vector<std::string>& endpoints, std::vector<SecretBytes> pair_keys,
                 TimeMs deadline);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override;
  StatusOr<collective::Message> Receive(int peer, TimeMs deadline) override;
  Status Flush(TimeMs deadline) override;
  size_t window_bytes() const override { return options_.window_bytes; }
  // Connections closed during Connect because their handshake failed or
  // timed out, or were evicted for newer ones while the most handshakes ran
  // (the handshake: net/tcp_handshake.h).
  uint64_t refused() const { return refused_; }

  struct Peer;  // One connection (tcp_transport.cc).
  struct Pool;  // Receive buffers.

 private:
  TcpTransport(int rank, int size, const TcpTransportOptions& options);
  Status ConnectTo(int peer, const std::string& endpoint, TimeMs deadline);
  std::string Missing() const;  // The lower ranks not connected yet.
  // Closes the peer's connection for good: its error is `why` from now on.
  Status Break(int peer, Status why);
  // Writes what is queued for `peer` while its socket takes it.
  Status WriteQueued(int peer);
  // Waits (poll) until `peer` is readable or a queued write can move.
  Status Wait(int peer, TimeMs deadline);
  Status PeerError(int peer, const char* what, int err) const;

  int rank_, size_;
  TcpTransportOptions options_;
  int listen_fd_ = -1;
  std::string endpoint_;
  std::vector<SecretBytes> keys_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::shared_ptr<Pool> pool_;
  size_t queued_peers_ = 0;
  uint64_t refused_ = 0;
};

}  // namespace cohort::net

#endif  // COHORT_NET_TCP_TRANSPORT_H_
