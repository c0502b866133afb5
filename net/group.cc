#include "net/group.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sodium.h>

#include <atomic>
#include <cstring>
#include <string_view>
#include <thread>

#include "net/curve.h"
#include "net/join.h"
#include "net/rendezvous.h"
#include "net/tcp_transport.h"
#include "net/zmq_transport.h"

namespace cohort::net {

namespace {

// The keys and the ZAP handler of an authenticated group, kept as long as
// its sockets. The handler answers on its own thread: handshakes (and
// reconnections) happen whenever ZeroMQ makes them.
struct Security {
  crypto::CurveKeys keys;
  std::unique_ptr<ZapHandler> zap;
  std::atomic<bool> stop{false};
  std::thread thread;
  ~Security() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

StatusOr<std::shared_ptr<Security>> StartSecurity(zmq::context_t& context, const GroupOptions& o) {
  auto s = std::make_shared<Security>();
  COHORT_ASSIGN_OR_RETURN(s->keys, crypto::CurveKeysFor(*o.identity));
  COHORT_ASSIGN_OR_RETURN(s->zap, ZapHandler::Create(context, o.allowlist));
  Security* raw = s.get();
  s->thread = std::thread([raw] {
    while (!raw->stop.load()) {
      zmq::pollitem_t item{raw->zap->socket().handle(), 0, ZMQ_POLLIN, 0};
      try {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) > 0) raw->zap->AnswerReady();
      } catch (const zmq::error_t&) {
        return;  // The context is closing.
      }
    }
  });
  return s;
}

// Rank `name`'s CURVE key, from the allowlist.
StatusOr<crypto::X25519Public> KeyOf(const GroupOptions& o, const std::string& name) {
  for (const crypto::AllowedKey& a : o.allowlist) {
    if (a.name == name) return crypto::CurvePublicFor(a.key);
  }
  return InvalidArgumentError("no key named \"" + name + "\" in the allowlist");
}

// The data over ZeroMQ CURVE: every inbox admits only the allowlist, and a
// message counts only under the key of the rank it claims.
StatusOr<std::unique_ptr<collective::Transport>> JoinEncrypted(zmq::context_t& context,
                                                               const GroupOptions& o,
                                                               std::shared_ptr<Security> security,
                                                               RendezvousSecurity rs,
                                                               TimeMs deadline) {
  ZmqTransportOptions options;
  options.curve = &security->keys;
  COHORT_ASSIGN_OR_RETURN(
      auto zmq, ZmqTransport::Bind(context, o.rank, o.size, "tcp://" + o.host + ":0", options));
  COHORT_ASSIGN_OR_RETURN(
      std::vector<std::string> endpoints,
      Rendezvous(context, o.rank, o.size, o.master, zmq->endpoint(), deadline, &rs));
  std::vector<CurvePeer> peers(o.size);
  for (int r = 0; r < o.size; ++r) {
    peers[r].name = (*rs.names)[r];
    COHORT_ASSIGN_OR_RETURN(peers[r].key, KeyOf(o, peers[r].name));
  }
  COHORT_RETURN_IF_ERROR(zmq->Connect(endpoints, peers));
  zmq->KeepAlive(std::move(security));
  return std::unique_ptr<collective::Transport>(std::move(zmq));
}

// The data over plain TCP: each connection proves the key the two ranks
// agree from their identities (X25519), nothing more.
StatusOr<std::unique_ptr<collective::Transport>> JoinAuthenticatedTcp(zmq::context_t& context,
                                                                      const GroupOptions& o,
                                                                      const RendezvousSecurity& rs,
                                                                      TimeMs deadline) {
  COHORT_ASSIGN_OR_RETURN(auto tcp, TcpTransport::Listen(o.rank, o.size, o.host));
  COHORT_ASSIGN_OR_RETURN(
      std::vector<std::string> endpoints,
      Rendezvous(context, o.rank, o.size, o.master, tcp->endpoint(), deadline, &rs));
  COHORT_ASSIGN_OR_RETURN(crypto::X25519KeyPair mine, crypto::X25519For(*o.identity));
  std::vector<SecretBytes> pair_keys(o.size);
  for (int r = 0; r < o.size; ++r) {
    if (r == o.rank) continue;
    COHORT_ASSIGN_OR_RETURN(crypto::X25519Public theirs, KeyOf(o, (*rs.names)[r]));
    COHORT_ASSIGN_OR_RETURN(SecretBytes agreed,
                            crypto::AgreeX25519(mine.secret_key, mine.public_key, theirs));
    // A key for this use only (the same identities agree keys elsewhere).
    static constexpr uint8_t kLabel[] = "cohort tcp transport pair key v1";
    auto key = crypto::Hash256({kLabel}, agreed.bytes());
    pair_keys[r] = SecretBytes(key.size());
    std::memcpy(pair_keys[r].bytes().data(), key.data(), key.size());
    sodium_memzero(key.data(), key.size());
  }
  COHORT_RETURN_IF_ERROR(tcp->Connect(endpoints, std::move(pair_keys), deadline));
  return std::unique_ptr<collective::Transport>(std::move(tcp));
}

StatusOr<std::unique_ptr<collective::Transport>> JoinAuthenticated(zmq::context_t& context,
                                                                   const GroupOptions& o,
                                                                   TimeMs deadline) {
  std::string my_name;
  for (const crypto::AllowedKey& a : o.allowlist) {
    if (a.key == o.identity->public_key) my_name = a.name;
  }
  if (my_name.empty()) {
    return InvalidArgumentError("rank " + std::to_string(o.rank) +
                                ": this rank's key is not in the allowlist");
  }
  COHORT_ASSIGN_OR_RETURN(std::shared_ptr<Security> security, StartSecurity(context, o));
  std::vector<std::string> names;
  RendezvousSecurity rs{.mine = &security->keys, .my_name = my_name, .names = &names};
  COHORT_ASSIGN_OR_RETURN(rs.master, crypto::CurvePublicFor(o.master_key));
  if (o.encrypt) return JoinEncrypted(context, o, std::move(security), rs, deadline);
  return JoinAuthenticatedTcp(context, o, rs, deadline);
}

}  // namespace

bool UsesSharedMemory(const GroupOptions& o) {
  return o.transport == "shm" || (o.transport == "auto" && o.master.rfind("ipc://", 0) == 0);
}

Status LoadGroupKeys(const std::string& identity_file, const std::string& allow_dir,
                     const std::string& master_key_file, const std::string& who,
                     crypto::Ed25519KeyPair* identity, GroupOptions* options) {
  if (identity_file.empty()) return OkStatus();
  if (allow_dir.empty() || master_key_file.empty()) {
    return InvalidArgumentError(who + ": --identity needs --allow and --master-key");
  }
  COHORT_ASSIGN_OR_RETURN(*identity, crypto::LoadIdentity(identity_file));
  COHORT_ASSIGN_OR_RETURN(options->allowlist, crypto::LoadAllowlist(allow_dir));
  COHORT_ASSIGN_OR_RETURN(options->master_key, crypto::LoadPublicKey(master_key_file));
  options->identity = identity;
  return OkStatus();
}

std::string Describe(const GroupOptions& o) {
  if (o.transport == "mpi") return "MPI";
  if (UsesSharedMemory(o)) return "shared memory";
  if (o.identity == nullptr) return "tcp: plaintext, not authenticated";
  return o.encrypt ? "tcp, ZeroMQ CURVE: authenticated and encrypted"
                   : "tcp: authenticated, not encrypted";
}

namespace {

// Every backend a group can join over, by the name GroupOptions::transport
// gives ("auto" picks shm or tcp).
struct TransportEntry {
  const char* name;
  JoinFunction join;
};
constexpr TransportEntry kTransports[] = {
    {"shm", JoinSharedMemory},
    {"tcp", JoinNetwork},
    {"mpi", JoinMpi},
};

}  // namespace

StatusOr<std::unique_ptr<collective::Transport>> JoinNetwork(const JoinRequest& r) {
  const GroupOptions& o = r.options;
  if (o.identity != nullptr) return JoinAuthenticated(r.context, o, r.deadline);
  if (!o.insecure) {
    return FailedPreconditionError(
        "ranks over tcp authenticate each other: give this rank an identity key, the allowlist "
        "of the group's keys and rank 0's public key (or say it is insecure, on a trusted "
        "network only)");
  }
  COHORT_ASSIGN_OR_RETURN(auto tcp, TcpTransport::Listen(o.rank, o.size, o.host));
  COHORT_ASSIGN_OR_RETURN(
      std::vector<std::string> endpoints,
      Rendezvous(r.context, o.rank, o.size, o.master, tcp->endpoint(), r.deadline));
  COHORT_RETURN_IF_ERROR(tcp->Connect(endpoints, {}, r.deadline));
  return std::unique_ptr<collective::Transport>(std::move(tcp));
}

namespace {

// ZeroMQ binds an address or an interface, never a host name (it resolves
// names only to connect), and a node list or MASTER_ADDR names hosts
// (Slurm: rank 0 meets the others at the first node's name). A name that
// resolves becomes its first IPv4 address, for every rank alike; anything
// else (an address, an interface, "*") is left to the transport.
std::string NumericHost(const std::string& host) {
  in_addr v4;
  if (host.empty() || host == "*" || host.front() == '[' || host.find(':') != std::string::npos ||
      inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return host;
  }
  StatusOr<std::string> address = ResolveIpv4(host);
  return address.ok() ? *address : host;
}

// tcp://HOST:PORT with HOST as NumericHost makes it; other endpoints as they are.
std::string NumericEndpoint(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  const size_t colon = endpoint.rfind(':');
  if (endpoint.rfind(kTcp, 0) != 0 || colon == std::string::npos || colon < kTcp.size()) {
    return endpoint;
  }
  const std::string host = endpoint.substr(kTcp.size(), colon - kTcp.size());
  return std::string(kTcp) + NumericHost(host) + endpoint.substr(colon);
}

}  // namespace

StatusOr<std::string> ResolveIpv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list); rc != 0 || !list) {
    return NotFoundError("host \"" + host.substr(0, 100) +
                         "\" does not resolve to an IPv4 address (" + gai_strerror(rc) + ")");
  }
  char text[INET_ADDRSTRLEN] = {};
  const auto* addr = reinterpret_cast<const sockaddr_in*>(list->ai_addr);
  inet_ntop(AF_INET, &addr->sin_addr, text, sizeof(text));
  freeaddrinfo(list);
  return std::string(text);
}

StatusOr<std::unique_ptr<collective::Transport>> JoinGroup(zmq::context_t& context,
                                                           const GroupOptions& options,
                                                           const collective::CollectiveOptions& c) {
  GroupOptions o = options;
  o.host = NumericHost(o.host);
  o.master = NumericEndpoint(o.master);
  const std::string name =
      o.transport == "auto" ? (UsesSharedMemory(o) ? "shm" : "tcp") : o.transport;
  std::string names = "auto";
  for (size_t i = 0; i < std::size(kTransports); ++i) {
    const TransportEntry& t = kTransports[i];
    if (name == t.name) return t.join({context, o, c, SteadyNowMs() + c.timeout_ms});
    names += (i + 1 == std::size(kTransports) ? " or " : ", ") + std::string(t.name);
  }
  return InvalidArgumentError("transport \"" + o.transport + "\": expected " + names);
}

}  // namespace cohort::net
