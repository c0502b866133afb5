#include "net/curve.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "common/secret_bytes.h"

namespace cohort::net {
namespace {

// libzmq takes a CURVE key as 32 raw bytes, 40 Z85 characters or 41 with the
// NUL; with 41 it makes a std::string of the key inside zmq_setsockopt, and
// with 40 a stack copy. 32 raw bytes it only copies into the socket's
// options, so the secret is decoded here into SecretBytes (wiped on return).
Status SetSecretKey(zmq::socket_t& socket, const SecretBytes& secret_z85) {
  if (secret_z85.size() != 41 || secret_z85.bytes()[40] != 0) {
    return InvalidArgumentError("CURVE secret key is not 40 Z85 characters");
  }
  SecretBytes raw(32);
  if (zmq_z85_decode(raw.bytes().data(),
                     reinterpret_cast<const char*>(secret_z85.bytes().data())) == nullptr) {
    return InvalidArgumentError("CURVE secret key is not valid Z85");
  }
  socket.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(raw.bytes().data(), raw.size()));
  return OkStatus();
}

// The CURVE key of each allowlist entry, to its name.
StatusOr<std::map<crypto::X25519Public, std::string>> CurveAllowlist(
    const std::vector<crypto::AllowedKey>& allowlist) {
  std::map<crypto::X25519Public, std::string> allowed;
  for (const auto& entry : allowlist) {
    auto key = crypto::CurvePublicFor(entry.key);
    if (!key.ok()) return key.status().WithContext("allowlist entry " + entry.name);
    allowed[*key] = entry.name;
  }
  return allowed;
}

}  // namespace

Status SetUpCurveServer(zmq::socket_t& socket, const crypto::CurveKeys& keys) {
  try {
    socket.set(zmq::sockopt::curve_server, 1);
    COHORT_RETURN_IF_ERROR(SetSecretKey(socket, keys.secret_z85));
    socket.set(zmq::sockopt::zap_domain, kZapDomain);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(std::string("cannot set up a CURVE server: ") + e.what());
  }
  return OkStatus();
}

Status SetUpCurveClient(zmq::socket_t& socket, const crypto::CurveKeys& mine,
                        const crypto::X25519Public& server) {
  if (mine.public_z85.size() != 40) {
    return InvalidArgumentError("CURVE public key is not 40 Z85 characters");
  }
  try {
    socket.set(zmq::sockopt::curve_serverkey, zmq::const_buffer(server.data(), server.size()));
    socket.set(zmq::sockopt::curve_publickey, mine.public_z85);
    COHORT_RETURN_IF_ERROR(SetSecretKey(socket, mine.secret_z85));
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(std::string("cannot set up a CURVE client: ") + e.what());
  }
  return OkStatus();
}

ZapHandler::ZapHandler(zmq::context_t& context, std::map<crypto::X25519Public, std::string> allowed)
    : socket_(context, zmq::socket_type::rep), allowed_(std::move(allowed)) {}

StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Create(
    zmq::context_t& context, const std::vector<crypto::AllowedKey>& allowlist) {
  COHORT_ASSIGN_OR_RETURN(auto allowed, CurveAllowlist(allowlist));
  std::unique_ptr<ZapHandler> handler(new ZapHandler(context, std::move(allowed)));
  handler->socket_.set(zmq::sockopt::linger, 0);
  try {
    // The endpoint libzmq sends every ZAP request of this context to.
    handler->socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("cannot bind the ZAP handler: ") + e.what());
  }
  return handler;
}

Status ZapHandler::Replace(const std::vector<crypto::AllowedKey>& allowlist) {
  COHORT_ASSIGN_OR_RETURN(auto allowed, CurveAllowlist(allowlist));
  for (const auto& [key, name] : allowed_) {
    if (!allowed.count(key)) revoked_[key] = name;
  }
  for (const auto& entry : allowed) revoked_.erase(entry.first);
  allowed_ = std::move(allowed);
  return OkStatus();
}

ZapDecision ZapHandler::Decide(const std::vector<std::string>& request) const {
  if (request.size() < 7 || request[0] != "1.0") return {"400", "malformed ZAP request", ""};
  if (request[2] != kZapDomain) return {"400", "unknown ZAP domain", ""};
  if (request[5] != "CURVE" || request[6].size() != crypto::kX25519PublicBytes) {
    return {"400", "only CURVE clients are admitted", ""};
  }
  crypto::X25519Public key;
  std::memcpy(key.data(), request[6].data(), key.size());
  auto it = allowed_.find(key);
  if (it == allowed_.end()) {
    auto revoked = revoked_.find(key);
    if (revoked != revoked_.end()) {
      spdlog::warn(
          "rejected a connection from {}: CURVE key {} is {}'s, revoked from the allowlist",
          request[3].substr(0, 64), crypto::Hex(key), revoked->second);
      return {"400", "key revoked", ""};
    }
    spdlog::warn(
        "rejected a connection from {}: CURVE key {} is not in the allowlist (a client logs "
        "its CURVE key when it starts)",
        request[3].substr(0, 64), crypto::Hex(key));
    return {"400", "key not in the allowlist", ""};
  }
  return {"200", "OK", it->second};
}

void ZapHandler::AnswerReady() {
  for (;;) {
    std::vector<std::string> request;
    for (;;) {
      zmq::message_t m;
      if (!socket_.recv(m, zmq::recv_flags::dontwait)) break;
      const bool more = m.more();
      // A bounded copy: only the short fields are ever read.
      request.emplace_back(static_cast<const char*>(m.data()), std::min<size_t>(m.size(), 256));
      if (!more) break;
    }
    if (request.empty()) return;
    // REP must answer every request it received, or it takes no other.
    const ZapDecision d = request.size() >= 2 ? Decide(request) : ZapDecision{"400", "", ""};
    const std::string request_id = request.size() >= 2 ? request[1] : "";
    const std::string reply[] = {"1.0", request_id, d.status_code, d.status_text, d.user_id, ""};
    for (size_t i = 0; i < std::size(reply); ++i) {
      socket_.send(zmq::buffer(reply[i]),
                   i + 1 < std::size(reply) ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
}

}  // namespace cohort::net
