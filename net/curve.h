// ZeroMQ CURVE (RFC 26) and the ZAP allowlist (RFC 27): the one place both
// daemons set up transport security.
#ifndef COHORT_NET_CURVE_H_
#define COHORT_NET_CURVE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "crypto/key_files.h"
#include "crypto/keys.h"

namespace cohort::net {

// The ZAP domain of the coordinator's CURVE sockets.
inline constexpr char kZapDomain[] = "cohort";

// Makes `socket` a CURVE server with the secret key of `keys`, authenticated
// through ZAP in kZapDomain. Call before bind(). The secret reaches libzmq as
// 32 raw bytes decoded into SecretBytes, with no std::string copy on the way
// (libzmq keeps its own copy for the socket's life). kInvalidArgument when the
// key is malformed or libzmq refuses it.
Status SetUpCurveServer(zmq::socket_t& socket, const crypto::CurveKeys& keys);

// Makes `socket` a CURVE client with the key pair `mine` that talks only to a
// server whose CURVE public key is `server`. Call before connect(). Errors and
// secret handling as SetUpCurveServer.
Status SetUpCurveClient(zmq::socket_t& socket, const crypto::CurveKeys& mine,
                        const crypto::X25519Public& server);

// The answer to one ZAP request. Exposed for tests.
struct ZapDecision {
  std::string status_code;  // "200" admitted, "400" refused.
  std::string status_text;
  std::string user_id;  // The allowlist name when admitted.
};

// Answers ZeroMQ's ZAP requests for one context: a CURVE client whose key is
// in the allowlist is admitted with its allowlist name as User-Id (what
// RawMessage::user_id then reads); any other key, mechanism or domain is
// refused, and a refused CURVE key is logged. Not thread-safe: one thread
// polls socket() and calls AnswerReady().
class ZapHandler {
 public:
  // Binds the ZAP endpoint of `context`. Create it before any CURVE server
  // socket of `context` binds and keep it until those sockets are closed.
  // kInvalidArgument names an allowlist entry that is not a valid key;
  // kUnavailable when the endpoint cannot be bound (one handler per context).
  static StatusOr<std::unique_ptr<ZapHandler>> Create(
      zmq::context_t& context, const std::vector<crypto::AllowedKey>& allowlist);

  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  zmq::socket_t& socket() { return socket_; }
  size_t size() const { return allowed_.size(); }

  // A reloaded allowlist: connections from now on are checked against it
  // (connections already admitted stay open: the daemon refuses their
  // messages). A key it drops is remembered with its name, so a refused
  // connection from it is logged as that client's revoked key. Errors as
  // Create's, and then the old list stays.
  Status Replace(const std::vector<crypto::AllowedKey>& allowlist);

  // Answers every request that is waiting; never blocks. A malformed request
  // is answered with "400" when it has a request id, else dropped.
  void AnswerReady();

  // The answer to a request given as its frames (version, request id, domain,
  // address, routing id, mechanism, credentials...).
  ZapDecision Decide(const std::vector<std::string>& request) const;

 private:
  ZapHandler(zmq::context_t& context, std::map<crypto::X25519Public, std::string> allowed);

  zmq::socket_t socket_;
  std::map<crypto::X25519Public, std::string> allowed_;  // CURVE key -> name.
  std::map<crypto::X25519Public, std::string> revoked_;  // Dropped by Replace.
};

}  // namespace cohort::net

#endif  // COHORT_NET_CURVE_H_
