// The clients a coordinator knows: the name each registered under, the
// connection (peer) it speaks on, its identity key, its sample count, and
// when it was last heard from. Hello's rules for names and keys live here;
// what a Hello means for a round is the round engine's.
#ifndef COHORT_COORDINATOR_CLIENT_REGISTRY_H_
#define COHORT_COORDINATOR_CLIENT_REGISTRY_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/env.h"
#include "crypto/keys.h"
#include "proto/wire.pb.h"

namespace cohort::coordinator {

// Who the transport says sent a message: under CURVE, the allowlist entry
// of the key that authenticated the connection (the simulator: the
// virtual client). A Hello must then claim this name and identity key, so
// no client may speak or sign for another, whoever drives the engine.
struct AuthenticatedPeer {
  std::string name;
  crypto::Ed25519Public identity{};
};

// Not thread-safe; never touches the clock or a socket (time comes in as
// `now`). Names and peers are untrusted input: nothing here aborts on them.
class ClientRegistry {
 public:
  struct Client {
    std::string peer;
    TimeMs last_seen = 0;
    bool active = false;  // Set by Seen.
    uint64_t num_samples = 0;
    std::string data_sha256;             // Its shard's SHA-256 (hex) from Hello; empty: not sent.
    std::vector<uint64_t> label_counts;  // Samples per class (opt-in Hello); empty: not sent.
    std::optional<crypto::Ed25519Public> identity;  // From Hello.
    bool wants_roster = false;                      // From Hello.
  };

  // A client silent for more than `timeout_ms` times out (ExpireSilent).
  // `env` (not owned; outlives the registry) takes the log lines.
  ClientRegistry(TimeMs timeout_ms, Env* env) : timeout_ms_(timeout_ms), env_(env) {}

  // Why `hello` may not register, or nothing; `identity` gets its key.
  // `malformed`: the Hello itself is bad (a sample count out of range);
  // otherwise the client is refused (a bad name, a name or key other than
  // the authenticated `sender`'s, no identity key where `secure`, a key
  // another client holds).
  struct Refusal {
    bool malformed = false;
    std::string reason;
  };
  std::optional<Refusal> CheckHello(const wire::Hello& hello, const AuthenticatedPeer* sender,
                                    bool secure,
                                    std::optional<crypto::Ed25519Public>& identity) const;

  // Registers (or re-registers) a Hello that CheckHello let through, from
  // `peer`, at `now`. A client that takes over another name's peer evicts
  // that name. On the same peer a client keeps its sample count (a shard
  // does not change under a running process): `recount` says it claimed
  // another one.
  struct Registration {
    bool is_new = false;
    bool reconnected = false;  // Registered before, on another peer.
    bool recount = false;
  };
  Registration Register(const std::string& peer, const wire::Hello& hello,
                        const std::optional<crypto::Ed25519Public>& identity, TimeMs now);

  // The name registered on `peer`, or null.
  const std::string* NameOf(const std::string& peer) const;
  // Null, or an empty peer, for a name not registered.
  const Client* Find(const std::string& name) const;
  const std::string& PeerOf(const std::string& name) const;
  // Throws std::out_of_range for an unknown name: for names the engine
  // took from the registry itself.
  const Client& at(const std::string& name) const { return clients_.at(name); }
  size_t size() const { return clients_.size(); }
  const std::map<std::string, Client>& clients() const { return clients_; }  // By name.
  std::vector<std::string> ActiveNames() const;                              // Sorted.

  // The client was heard from at `now`: active until it times out.
  void Seen(const std::string& name, TimeMs now);
  // Not selected again until it speaks. Nothing for an unknown name.
  void SetInactive(const std::string& name);
  // Marks every active client silent past the timeout inactive; their names,
  // sorted.
  std::vector<std::string> ExpireSilent(TimeMs now);
  // When the next active client times out; absent when none is active.
  std::optional<TimeMs> NextTimeout() const;

  void AcknowledgeFinish(const std::string& name) { acknowledged_finish_.insert(name); }
  // Every client heard from within the timeout has acknowledged Finished.
  bool AllAcknowledgedFinish(TimeMs now) const;

 private:
  TimeMs TimeoutOf(const Client& c) const { return c.last_seen + timeout_ms_ + 1; }
  // Removes the client registered on `peer` under another name than `name`.
  void EvictOtherOwner(const std::string& peer, const std::string& name);

  TimeMs timeout_ms_;
  Env* env_;
  std::map<std::string, Client> clients_;  // By name.
  // The active clients by the time they time out: the next wakeup and the
  // timeout scan cost O(log n), not a pass over every registered client.
  // Every change of a client's last_seen or active goes through Seen and
  // SetInactive, so that it holds exactly the active clients.
  std::set<std::pair<TimeMs, std::string>> timeouts_;
  std::map<crypto::Ed25519Public, std::string> identity_owner_;  // Key -> its client's name.
  std::map<std::string, std::string> peer_to_name_;
  std::set<std::string> acknowledged_finish_;  // Names, after the run is done.
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_CLIENT_REGISTRY_H_
