#include "coordinator/client_registry.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace cohort::coordinator {
namespace {

constexpr size_t kMaxNameLength = 64;
constexpr uint64_t kMaxSamples = uint64_t{1} << 40;
constexpr int kMaxClasses = 1 << 16;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (unsigned char c : name) {
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

// A SHA-256 digest as the store keeps it.
bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

// What is wrong with a Hello's label_counts, if anything: at most
// kMaxClasses classes, summing to num_samples.
std::optional<std::string> CheckLabelCounts(const wire::Hello& hello) {
  if (hello.label_counts().empty()) return std::nullopt;
  if (hello.label_counts_size() > kMaxClasses) {
    return "hello: label_counts has " + std::to_string(hello.label_counts_size()) +
           " classes, more than " + std::to_string(kMaxClasses);
  }
  uint64_t sum = 0;
  for (uint64_t c : hello.label_counts()) {
    if (c > kMaxSamples) return std::string("hello: a label count above 2^40");
    sum += c;
  }
  if (sum != hello.num_samples()) {
    return "hello: label_counts sum to " + std::to_string(sum) + ", not num_samples (" +
           std::to_string(hello.num_samples()) + ")";
  }
  return std::nullopt;
}

}  // namespace

std::optional<ClientRegistry::Refusal> ClientRegistry::CheckHello(
    const wire::Hello& hello, const AuthenticatedPeer* sender, bool secure,
    std::optional<crypto::Ed25519Public>& identity) const {
  auto refuse = [](std::string reason) { return Refusal{false, std::move(reason)}; };
  if (!ValidName(hello.client_name())) {
    return refuse("invalid client name: 1-64 characters of [A-Za-z0-9._-]");
  }
  if (sender != nullptr && hello.client_name() != sender->name) {
    return refuse("client name \"" + hello.client_name() +
                  "\" does not match this key's allowlist name \"" + sender->name + "\"");
  }
  if (sender != nullptr &&
      hello.identity_key() != std::string(reinterpret_cast<const char*>(sender->identity.data()),
                                          sender->identity.size())) {
    return refuse("identity key in hello is not the allowlisted key of \"" + sender->name + "\"");
  }
  if (hello.num_samples() == 0 || hello.num_samples() > kMaxSamples) {
    return Refusal{true, "hello: num_samples must be in [1, 2^40]"};
  }
  if (!hello.data_sha256().empty() && !IsSha256Hex(hello.data_sha256())) {
    return Refusal{true, "hello: data_sha256 must be empty or 64 lowercase hex digits"};
  }
  if (auto bad = CheckLabelCounts(hello)) return Refusal{true, *bad};
  if (hello.identity_key().size() == crypto::kEd25519PublicBytes) {
    identity.emplace();
    std::memcpy(identity->data(), hello.identity_key().data(), identity->size());
    // One key, one client: the same key under two names would count one
    // participant twice in a cohort (and make --peers clients refuse it).
    auto owner = identity_owner_.find(*identity);
    if (owner != identity_owner_.end() && owner->second != hello.client_name()) {
      return refuse("identity key already registered by client \"" + owner->second + "\"");
    }
  } else if (!hello.identity_key().empty() || secure) {
    return refuse(
        "this run uses secure aggregation: hello must carry the client's 32-byte Ed25519 "
        "identity key");
  }
  return std::nullopt;
}

void ClientRegistry::EvictOtherOwner(const std::string& peer, const std::string& name) {
  auto it = peer_to_name_.find(peer);
  if (it == peer_to_name_.end() || it->second == name) return;
  Client& previous = clients_[it->second];
  SetInactive(it->second);
  if (previous.identity) identity_owner_.erase(*previous.identity);
  clients_.erase(it->second);
}

ClientRegistry::Registration ClientRegistry::Register(
    const std::string& peer, const wire::Hello& hello,
    const std::optional<crypto::Ed25519Public>& identity, TimeMs now) {
  const std::string& name = hello.client_name();
  Client& c = clients_[name];
  Registration r;
  r.is_new = c.peer.empty();
  r.reconnected = !c.peer.empty() && c.peer != peer;
  if (r.reconnected) {
    // Either a reconnect or a second process using the same name; names are
    // not authenticated until CURVE keys are (a later issue).
    env_->Log().warn("client {}: now on a new connection", name);
    peer_to_name_.erase(c.peer);
  }
  EvictOtherOwner(peer, name);
  // A shard does not change under a running process: a Hello on the same
  // connection that claims another sample count is refused (the count
  // stays), and a selected client that tries it leaves the round. A new
  // connection (a restarted process) may bring a new count.
  r.recount = !r.is_new && !r.reconnected && c.num_samples != hello.num_samples();
  if (r.recount) {
    env_->Log().warn(
        "client {}: hello claims {} samples on the same connection, registered with {}; "
        "kept {}",
        name, hello.num_samples(), c.num_samples, c.num_samples);
  } else {
    c.num_samples = hello.num_samples();
    c.data_sha256 = hello.data_sha256();
    c.label_counts.assign(hello.label_counts().begin(), hello.label_counts().end());
  }
  c.peer = peer;
  Seen(name, now);
  if (c.identity && c.identity != identity) identity_owner_.erase(*c.identity);
  if (identity) identity_owner_[*identity] = name;
  c.identity = identity;
  c.wants_roster = hello.wants_roster();
  peer_to_name_[peer] = name;
  env_->Log().info("client {} {} ({} samples, {} registered)", name,
                   r.is_new ? "registered" : "re-registered", c.num_samples, clients_.size());
  return r;
}

const std::string* ClientRegistry::NameOf(const std::string& peer) const {
  auto it = peer_to_name_.find(peer);
  return it == peer_to_name_.end() ? nullptr : &it->second;
}

const ClientRegistry::Client* ClientRegistry::Find(const std::string& name) const {
  auto it = clients_.find(name);
  return it == clients_.end() ? nullptr : &it->second;
}

const std::string& ClientRegistry::PeerOf(const std::string& name) const {
  static const std::string* const kNoPeer = new std::string();
  const Client* c = Find(name);
  return c != nullptr ? c->peer : *kNoPeer;
}

std::vector<std::string> ClientRegistry::ActiveNames() const {
  std::vector<std::string> names;
  for (const auto& [name, c] : clients_) {
    if (c.active) names.push_back(name);
  }
  return names;
}

void ClientRegistry::Seen(const std::string& name, TimeMs now) {
  auto it = clients_.find(name);
  if (it == clients_.end()) return;
  Client& c = it->second;
  timeouts_.erase({TimeoutOf(c), name});
  c.last_seen = now;
  c.active = true;
  timeouts_.emplace(TimeoutOf(c), name);
}

void ClientRegistry::SetInactive(const std::string& name) {
  auto it = clients_.find(name);
  if (it == clients_.end()) return;
  it->second.active = false;
  timeouts_.erase({TimeoutOf(it->second), name});
}

std::vector<std::string> ClientRegistry::ExpireSilent(TimeMs now) {
  std::vector<std::string> silent;
  while (!timeouts_.empty() && timeouts_.begin()->first <= now) {
    const std::string name = timeouts_.begin()->second;
    SetInactive(name);
    silent.push_back(name);
  }
  std::sort(silent.begin(), silent.end());
  return silent;
}

std::optional<TimeMs> ClientRegistry::NextTimeout() const {
  if (timeouts_.empty()) return std::nullopt;
  return timeouts_.begin()->first;
}

bool ClientRegistry::AllAcknowledgedFinish(TimeMs now) const {
  // A client dropped from the last round is marked unavailable but may well
  // be alive; wait for every client heard from within the client timeout
  // (the daemon bounds the wait by its grace period), excluded ones too:
  // they hear Finished only by speaking, and a daemon gone before that
  // leaves them waiting for it.
  for (const auto& [name, c] : clients_) {
    if (acknowledged_finish_.count(name) != 0) continue;
    if (c.active || now - c.last_seen <= timeout_ms_) return false;
  }
  return true;
}

}  // namespace cohort::coordinator
