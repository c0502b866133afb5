#include "coordinator/daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "coordinator/metrics.h"
#include "coordinator/open_run.h"
#include "coordinator/report.h"
#include "coordinator/round_engine.h"
#include "coordinator/secagg_plan.h"
#include "crypto/key_files.h"
#include "datasets/shard.h"
#include "net/connection_guard.h"
#include "net/curve.h"
#include "net/endpoint.h"
#include "net/zmq_codec.h"
#include "proto/config_io.h"
#include "store/run_store.h"
#include "train/backend.h"
#include "train/model_config.h"
#include "train/trainer.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::coordinator {
namespace {

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << bytes;
    if (!out) return UnavailableError(tmp + ": cannot write");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return UnavailableError(path + ": " + ec.message());
  return OkStatus();
}

// RoundEngine::limits() lets a secure-aggregation header grow by this much
// per cohort member; the frame limit is set once, for the largest cohort.
constexpr size_t kSecAggHeaderBytesPerMember = 256;
// The cohort size the frame limit allows for when rounds.max_clients_per_round
// is 0 (no cap).
constexpr size_t kCohortBoundWhenUncapped = 4096;

// The largest header frame the engine will ever accept from a client.
size_t MaxClientHeaderBytes(const config::RunConfig& config) {
  size_t bytes = config.net().max_header_bytes();
  if (config.secagg().aggregation() != config::PLAIN) {
    const size_t cohort = config.rounds().max_clients_per_round() != 0
                              ? config.rounds().max_clients_per_round()
                              : kCohortBoundWhenUncapped;
    bytes += kSecAggHeaderBytesPerMember * cohort;
  }
  return bytes;
}

// Without a handshake timeout a connection could stay unauthenticated, and
// hold its frame, for as long as its peer likes.
Status CheckDaemonOptions(const DaemonOptions& options) {
  if (options.handshake_timeout_ms < 100 || options.handshake_timeout_ms > 600000) {
    return InvalidArgumentError("handshake timeout of " +
                                std::to_string(options.handshake_timeout_ms) +
                                " ms: must be in [100, 600000]");
  }
  if (options.max_unauthenticated == 0) {
    return InvalidArgumentError("at most 0 connections waiting to authenticate: must be >= 1");
  }
  return net::CheckEndpoint("--bind", options.bind);
}

// The first round's (FedBuff: each group's) secure-aggregation plan, and a
// warning when it tolerates no dropout (coordinator/secagg_plan.h).
void AnnouncePlan(const config::RunConfig& config) {
  const uint32_t first = FirstRoundClients(config);
  for (const std::string& line : DescribePlan(config, first)) spdlog::info("plan: {}", line);
  if (auto warning = NoDropoutWarning(config, first)) spdlog::warn("{}", *warning);
}

// --dump-sums DIR: each securely aggregated round's unmasked sum and the
// names whose inputs it holds, as DIR/round-N.u32 and DIR/round-N.names.
RoundEngine::SumObserver DumpSumsTo(const std::string& dir) {
  return
      [dir](uint32_t round, std::span<const uint32_t> sum, const std::vector<std::string>& names) {
        const std::string base = dir + "/round-" + std::to_string(round);
        std::string list;
        for (const auto& n : names) list += n + "\n";
        std::string bytes(reinterpret_cast<const char*>(sum.data()), sum.size_bytes());
        Status st = WriteFileAtomically(base + ".u32", bytes);
        if (st.ok()) st = WriteFileAtomically(base + ".names", list);
        if (!st.ok()) spdlog::error("--dump-sums: {}", st.message());
      };
}

// What the daemon cannot do for a fedbuff run (the config's own
// conflicts are refused when it is loaded: proto/config_io.cc CheckFedBuff),
// refused before the run directory is touched.
Status CheckFedBuffOptions(const DaemonOptions& options) {
  if (options.config.has_fedbuff() && !options.dump_sums.empty()) {
    return InvalidArgumentError(
        "--dump-sums and fedbuff: the daemon dumps the unmasked sums of synchronous rounds; a "
        "fedbuff group's sum stays inside its group's engine and is not dumped (leave out "
        "--dump-sums)");
  }
  return OkStatus();
}

// The engine the run has, set up for the daemon: --dump-sums on synchronous
// rounds; a resumed FedBuff run waits rounds.client_timeout_s for the
// clients of its schedule to register again (they reconnect by themselves).
ProtocolEngine* PrepareEngine(const DaemonOptions& options, OpenRun& run) {
  if (run.fedbuff) {
    run.fedbuff->set_registration_grace(static_cast<TimeMs>(
        std::llround(double{options.config.rounds().client_timeout_s()} * 1000)));
  } else if (!options.dump_sums.empty()) {
    run.engine->set_sum_observer(DumpSumsTo(options.dump_sums));
  }
  return run.protocol();
}

// Who may connect: under CURVE the ZAP handler (bound before the ROUTER
// accepts anything) and each allowlisted name's identity key.
struct Security {
  std::unique_ptr<net::ZapHandler> zap;  // Null: --insecure.
  std::map<std::string, crypto::Ed25519Public> identities;
};

StatusOr<Security> SetUpSecurity(const DaemonOptions& options, zmq::context_t& context,
                                 zmq::socket_t& socket) {
  Security security;
  if (options.insecure) {
    spdlog::warn("CURVE is off (--insecure): traffic is plaintext and any client may join");
    return security;
  }
  if (options.identity.empty() || options.allowlist.empty()) {
    return InvalidArgumentError(
        "the coordinator needs --identity and --allow (or --insecure for local development)");
  }
  COHORT_ASSIGN_OR_RETURN(crypto::Ed25519KeyPair identity, crypto::LoadIdentity(options.identity));
  COHORT_ASSIGN_OR_RETURN(std::optional<crypto::CurveKeys> curve, crypto::CurveKeysFor(identity));
  COHORT_ASSIGN_OR_RETURN(auto list, crypto::LoadAllowlist(options.allowlist));
  for (const auto& entry : list) security.identities[entry.name] = entry.key;
  COHORT_ASSIGN_OR_RETURN(security.zap, net::ZapHandler::Create(context, list));
  spdlog::info("CURVE on; {} client keys in the allowlist {}", security.zap->size(),
               options.allowlist);
  COHORT_RETURN_IF_ERROR(net::SetUpCurveServer(socket, *curve));
  curve.reset();  // libzmq has its copy; ours is wiped now.
  return security;
}

// The ROUTER's limits. Frames beyond the largest one an envelope may have
// drop the connection inside ZeroMQ before they are buffered; smaller
// oversize frames are rejected by DecodeEnvelope with a logged reason.
// Payloads travel in chunks, so the limit does not grow with the model: it
// is what one connection may make ZeroMQ buffer before its handshake, and
// the guard caps how many such connections there are. Returns the limit.
int64_t ConfigureRouter(const DaemonOptions& options, zmq::socket_t& socket) {
  // An unroutable reply (peer gone) fails fast instead of vanishing.
  socket.set(zmq::sockopt::router_mandatory, 1);
  const int64_t max_frame = net::MaxFrameBytes(MaxClientHeaderBytes(options.config));
  socket.set(zmq::sockopt::maxmsgsize, max_frame);
  socket.set(zmq::sockopt::handshake_ivl, options.handshake_timeout_ms);
  socket.set(zmq::sockopt::linger, 2000);
  socket.set(zmq::sockopt::sndhwm, 100000);
  return max_frame;
}

// Binds, then says where: the log, --endpoint-file and stdout.
Status BindAndAnnounce(const DaemonOptions& options, int64_t max_frame,
                       const ProtocolEngine& engine, zmq::socket_t& socket) {
  try {
    socket.bind(options.bind);
  } catch (const zmq::error_t& e) {
    return UnavailableError("cannot bind " + options.bind + ": " + e.what());
  }
  spdlog::info(
      "transport limits: frames of at most {} bytes, {} ms to authenticate, at most {} "
      "connections waiting to (about {} MiB before authentication)",
      max_frame, options.handshake_timeout_ms, options.max_unauthenticated,
      (static_cast<uint64_t>(max_frame) * options.max_unauthenticated) >> 20);
  const std::string endpoint = net::LastEndpoint(socket);
  spdlog::info("listening on {} (run {}, {} parameters, resuming after {} {})", endpoint,
               options.config.name(), engine.num_params(),
               options.config.has_fedbuff() ? "version" : "round", engine.last_committed_round());
  if (!options.endpoint_file.empty()) {
    COHORT_RETURN_IF_ERROR(WriteFileAtomically(options.endpoint_file, endpoint + "\n"));
  }
  std::printf("coordinator listening on %s\n", endpoint.c_str());
  std::fflush(stdout);
  return OkStatus();
}

// The engine's time line (protocol_engine.h) on the daemon's steady clock:
// made at the daemon's start, it reads the engine's start_time() then (0,
// or for a resumed FedBuff run the opening of its earliest group in flight)
// and goes on with the steady clock. A resumed run's groups re-open at
// their engine times as they come; their deadlines run from there.
class EngineClock {
 public:
  explicit EngineClock(TimeMs start) : offset_(start - SteadyNowMs()) {}
  TimeMs Now() const { return SteadyNowMs() + offset_; }

 private:
  TimeMs offset_;
};

// The daemon's I/O loop: the one place the engine meets the socket and the
// real clock. Polls the ROUTER (and ZAP), hands the engine every decoded
// message and the time, and sends what it returns.
class IoLoop {
 public:
  // `metrics` (may be null) gets every committed round, with its clients'
  // records read back from `store`. The engine's clock starts now.
  IoLoop(const DaemonOptions& options, ProtocolEngine& engine, zmq::socket_t& socket,
         Security& security, net::ConnectionGuard& guard, store::RunStore& store,
         CoordinatorMetrics* metrics)
      : options_(options),
        config_(options.config),
        engine_(engine),
        clock_(engine.start_time()),
        socket_(socket),
        security_(security),
        guard_(guard),
        store_(store),
        metrics_(metrics) {}

  // Until `stop`, a store error, or the run is done and every client has
  // acknowledged Finished (or the grace period ran out).
  Status Run(const std::atomic<bool>& stop) {
    // After the last round, serve a little longer so every client hears
    // Finished and acknowledges it; closing with unread client messages would
    // make the kernel reset connections and lose the Finished still in flight.
    const TimeMs grace_ms = static_cast<TimeMs>(3000 * config_.net().heartbeat_s()) + 500;
    std::optional<TimeMs> done_at;
    while (!stop.load()) {
      if (options_.reload != nullptr && options_.reload->exchange(false)) Reload();
      if (engine_.done()) {
        if (!done_at) done_at = clock_.Now();
        const TimeMs now = clock_.Now();
        if (engine_.all_acknowledged_finish(now) || now - *done_at > grace_ms) break;
      }
      if (!engine_.store_error().ok()) return engine_.store_error();
      StatusOr<bool> polled = Poll();
      if (!polled.ok()) return polled.status();
      if (!*polled) continue;
      Drain();
      ticked_at_ = clock_.Now();
      SendAll(engine_.OnTick(*ticked_at_));
    }
    return OkStatus();
  }

 private:
  // Waits for a message, the engine's next deadline, or at most 200 ms (to
  // see `stop`: signals do not interrupt zmq_poll reliably across
  // versions). A deadline the last tick already reached is one the engine
  // waits out for a message (a resumed FedBuff group waiting for its
  // members to register): no busy loop on it. False when interrupted.
  StatusOr<bool> Poll() {
    const TimeMs now = clock_.Now();
    TimeMs wait = 200;
    if (auto next = engine_.NextWakeup(); next && (!ticked_at_ || *next > *ticked_at_)) {
      wait = std::clamp<TimeMs>(*next - now, 0, 200);
    }
    net::ZapHandler* zap = security_.zap.get();
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                               {zap ? zap->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, zap ? 2 : 1, std::chrono::milliseconds(wait));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return false;
      return UnavailableError(std::string("poll: ") + e.what());
    }
    if (zap && (items[1].revents & ZMQ_POLLIN)) zap->AnswerReady();
    return true;
  }

  // Hands the engine everything that is ready, then lets time advance.
  void Drain() {
    for (int budget = 0; budget < 10000 && net::TryReceive(socket_, true, raw_); ++budget) {
      const TimeMs now = clock_.Now();
      guard_.Authenticated(raw_.source_fd);
      auto envelope = net::DecodeEnvelope(raw_.frames, engine_.limits());
      if (!envelope.ok()) {
        SendAll(engine_.OnMalformed(raw_.peer, envelope.status()));
      } else if (security_.zap) {
        // Under CURVE a client's name and its signing identity are its
        // allowlist entry; the engine holds a Hello to them. A connection
        // admitted under a key revoked since is refused, even once its name
        // is allowed again (with another key).
        auto identity = security_.identities.find(raw_.user_id);
        if (identity == security_.identities.end() || revoked_peers_.count(raw_.peer) != 0) {
          RefuseRevoked();
          continue;
        }
        peers_of_[raw_.user_id].insert(raw_.peer);
        const AuthenticatedPeer sender{raw_.user_id, identity->second};
        SendAll(engine_.OnMessage(raw_.peer, *envelope, now, &sender));
      } else {
        SendAll(engine_.OnMessage(raw_.peer, *envelope, now, nullptr));
      }
    }
  }

  // SIGHUP: the allowlist again. A name whose key is gone or changed is
  // revoked (DaemonOptions::reload).
  void Reload() {
    if (!security_.zap) {
      spdlog::warn("SIGHUP: no allowlist to reload (--insecure)");
      return;
    }
    auto list = crypto::LoadAllowlist(options_.allowlist);
    const Status replaced = list.ok() ? security_.zap->Replace(*list) : list.status();
    if (!replaced.ok()) {
      spdlog::error("SIGHUP: the allowlist was not reloaded; the old one stays: {}",
                    replaced.message());
      return;
    }
    std::map<std::string, crypto::Ed25519Public> next;
    for (const auto& entry : *list) next[entry.name] = entry.key;
    std::vector<std::string> revoked;
    for (const auto& [name, key] : security_.identities) {
      auto it = next.find(name);
      if (it == next.end() || it->second != key) revoked.push_back(name);
    }
    const size_t added = std::count_if(next.begin(), next.end(), [this](const auto& entry) {
      return security_.identities.count(entry.first) == 0;
    });
    security_.identities = std::move(next);
    spdlog::info("SIGHUP: reloaded the allowlist {}: {} client keys, {} new, {} revoked",
                 options_.allowlist, security_.identities.size(), added, revoked.size());
    for (const std::string& name : revoked) {
      spdlog::warn("client {}: key revoked (not in the allowlist {} any more); refused from now on",
                   name, options_.allowlist);
      refused_.erase(name);
      for (const std::string& peer : peers_of_[name]) revoked_peers_.insert(peer);
      peers_of_.erase(name);
      SendAll(engine_.Revoke(name, kRevokedReason, clock_.Now()));
    }
  }

  // A message on a connection whose key was revoked: a Reject, and one log
  // line per name (a client that ignores the Reject cannot flood the log).
  void RefuseRevoked() {
    if (refused_.insert(raw_.user_id).second) {
      spdlog::warn("refused a message from {}: its key was revoked from the allowlist",
                   raw_.user_id);
    }
    SendAll({RejectMessage(raw_.peer, kRevokedReason)});
  }

  void SendAll(std::vector<Outgoing> out) {
    for (auto& o : out) {
      if (!net::SendFrames(socket_, o.peer, net::EncodeEnvelope(o.header, o.payload))) {
        spdlog::debug("could not send {} to a peer that is gone", net::BodyName(o.header));
      }
    }
    for (const store::RoundRecord& r : engine_.TakeCommitted()) {
      PrintRound(r, config_.rounds().num_rounds());
      if (metrics_ != nullptr) RecordMetrics(r);
    }
  }

  // A metric is not worth stopping the run for: a failed read leaves the
  // round's per-client figures out, logged.
  // Not inlined, so that bench/observability_share.sh can count it by name.
  [[gnu::noinline]] void RecordMetrics(const store::RoundRecord& r) {
    StatusOr<std::vector<store::ClientRoundRecord>> clients = store_.ClientRounds(r.round);
    if (!clients.ok()) {
      spdlog::warn("metrics: round {}: its clients' records: {}", r.round,
                   clients.status().message());
    }
    metrics_->RecordRound(r, clients.ok() ? *clients : std::vector<store::ClientRoundRecord>());
  }

  static constexpr char kRevokedReason[] = "key revoked: no longer in the coordinator's allowlist";

  const DaemonOptions& options_;
  const config::RunConfig& config_;
  ProtocolEngine& engine_;
  EngineClock clock_;
  std::optional<TimeMs> ticked_at_;  // The engine time of the last OnTick.
  zmq::socket_t& socket_;
  Security& security_;
  net::ConnectionGuard& guard_;
  store::RunStore& store_;
  CoordinatorMetrics* metrics_;
  net::RawMessage raw_;
  std::set<std::string> refused_;  // Revoked names whose messages were refused.
  // Under CURVE: the connections (ROUTER routing ids) each name spoke on,
  // and those whose name was revoked while they were open.
  std::map<std::string, std::set<std::string>> peers_of_;
  std::set<std::string> revoked_peers_;
};

}  // namespace

Status RunCoordinator(const DaemonOptions& options, const std::atomic<bool>& stop) {
  COHORT_RETURN_IF_ERROR(CheckDaemonOptions(options));
  COHORT_RETURN_IF_ERROR(CheckFedBuffOptions(options));
  COHORT_ASSIGN_OR_RETURN(
      OpenRun run, OpenFederatedRun(options.config, options.run_dir, nullptr, "cohort coordinator",
                                    options.initial_model));
  ProtocolEngine* engine = PrepareEngine(options, run);
  std::optional<CoordinatorMetrics> metrics;
  if (options.metrics != nullptr) {
    metrics.emplace(options.metrics->registry(), options.config.train().local_epochs());
    metrics->SetLastRound(engine->last_committed_round());
  }
  if (engine->done()) {
    spdlog::info("run already complete ({} rounds committed)", engine->last_committed_round());
    return OkStatus();
  }
  AnnouncePlan(options.config);
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::router);
  COHORT_ASSIGN_OR_RETURN(Security security, SetUpSecurity(options, context, socket));
  const int64_t max_frame = ConfigureRouter(options, socket);
  net::GuardOptions guard_options;
  guard_options.max_unauthenticated = options.max_unauthenticated;
  guard_options.handshake_timeout_ms = options.handshake_timeout_ms;
  COHORT_ASSIGN_OR_RETURN(auto guard, net::ConnectionGuard::Watch(context, socket, guard_options));
  COHORT_RETURN_IF_ERROR(BindAndAnnounce(options, max_frame, *engine, socket));
  IoLoop loop(options, *engine, socket, security, *guard, *run.store,
              metrics ? &*metrics : nullptr);
  COHORT_RETURN_IF_ERROR(loop.Run(stop));
  if (!engine->store_error().ok()) return engine->store_error();
  if (!engine->finish_reason().empty()) std::printf("%s\n", engine->finish_reason().c_str());
  if (!engine->done())
    return CancelledError("stopped after round " + std::to_string(engine->last_committed_round()));
  return OkStatus();
}

}  // namespace cohort::coordinator
