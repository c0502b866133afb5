#include "coordinator/daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "coordinator/round_engine.h"
#include "coordinator/run_store.h"
#include "crypto/key_files.h"
#include "datasets/shard.h"
#include "net/envelope.h"
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

void PrintRound(const RoundRecord& r, uint32_t total) {
  std::printf("round %3u/%u  clients %u/%u  dropped %u  train_loss %.4f", r.round, total,
              r.participants, r.selected, r.dropped, r.train_loss);
  if (r.test_accuracy >= 0) {
    std::printf("  test_acc %.4f  test_loss %.4f", r.test_accuracy, r.test_loss);
  }
  std::printf("  %.2fs\n", r.seconds);
  std::fflush(stdout);
}

// One ZAP request (RFC 27): frames version, request id, domain, address,
// routing id, mechanism, credentials (the client's 32-byte CURVE key).
void AnswerZap(zmq::socket_t& zap, const std::map<crypto::X25519Public, std::string>& allowed) {
  std::vector<zmq::message_t> frames;
  for (;;) {
    zmq::message_t m;
    if (!zap.recv(m, zmq::recv_flags::dontwait)) break;
    const bool more = m.more();
    frames.push_back(std::move(m));
    if (!more) break;
  }
  if (frames.size() < 2) return;
  std::string code = "400", text = "malformed ZAP request", user;
  if (frames.size() >= 7 && frames[5].to_string() == "CURVE" && frames[6].size() == 32) {
    crypto::X25519Public key;
    std::memcpy(key.data(), frames[6].data(), 32);
    auto it = allowed.find(key);
    if (it != allowed.end()) {
      code = "200";
      text = "OK";
      user = it->second;
    } else {
      text = "key not in the allowlist";
      spdlog::warn("rejected a connection from {}: CURVE key {} is not in the allowlist",
                   frames[3].to_string(), crypto::Z85(key));
    }
  }
  std::vector<std::string> reply = {"1.0", frames[1].to_string(), code, text, user, ""};
  for (size_t i = 0; i < reply.size(); ++i) {
    zap.send(zmq::buffer(reply[i]),
             i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

}  // namespace

Status RunCoordinator(const DaemonOptions& options, const std::atomic<bool>& stop) {
  const config::RunConfig& config = options.config;
  std::error_code ec;
  std::filesystem::create_directories(options.run_dir, ec);
  if (ec)
    return UnavailableError(options.run_dir + ": cannot create run directory: " + ec.message());

  COHORT_ASSIGN_OR_RETURN(auto backend, train::NewCpuBackend(1));
  COHORT_ASSIGN_OR_RETURN(auto model, train::BuildModel(config.model(), backend.get()));
  std::vector<float> init(model->num_params());
  model->Init(init, config.seed());

  Evaluator evaluator;
  std::shared_ptr<datasets::Dataset> test;
  if (config.data().has_test_shard() && !config.data().test_shard().empty()) {
    COHORT_ASSIGN_OR_RETURN(datasets::Dataset data,
                            datasets::ReadShard(config.data().test_shard()));
    COHORT_RETURN_IF_ERROR(
        train::CheckCompatible(*model, data).WithContext(config.data().test_shard()));
    test = std::make_shared<datasets::Dataset>(std::move(data));
    evaluator = [&model, test](std::span<const float> params) -> StatusOr<EvalMetrics> {
      COHORT_ASSIGN_OR_RETURN(train::EvalResult r, train::Evaluate(*model, params, *test));
      return EvalMetrics{r.loss, r.accuracy};
    };
  }

  COHORT_ASSIGN_OR_RETURN(auto store, OpenSqliteRunStore(options.run_dir + "/run.db"));
  COHORT_ASSIGN_OR_RETURN(auto engine,
                          RoundEngine::Create(config, std::move(init), store.get(), evaluator,
                                              COHORT_VERSION, SteadyNowMs()));
  if (!options.dump_sums.empty()) {
    engine->set_sum_observer([dir = options.dump_sums](uint32_t round,
                                                       std::span<const uint32_t> sum,
                                                       const std::vector<std::string>& names) {
      const std::string base = dir + "/round-" + std::to_string(round);
      std::string list;
      for (const auto& n : names) list += n + "\n";
      std::string bytes(reinterpret_cast<const char*>(sum.data()), sum.size_bytes());
      Status st = WriteFileAtomically(base + ".u32", bytes);
      if (st.ok()) st = WriteFileAtomically(base + ".names", list);
      if (!st.ok()) spdlog::error("--dump-sums: {}", st.message());
    });
  }
  if (engine->done()) {
    spdlog::info("run already complete ({} rounds committed)", engine->last_committed_round());
    return OkStatus();
  }

  zmq::context_t context(1);
  // ZAP: ZeroMQ asks this socket whether a CURVE client key may connect. It
  // must be bound before the ROUTER accepts anything.
  zmq::socket_t zap(context, zmq::socket_type::rep);
  std::map<crypto::X25519Public, std::string> allowed;      // CURVE key -> name.
  std::map<std::string, crypto::Ed25519Public> identities;  // Name -> identity key.
  std::optional<crypto::CurveKeys> curve;
  if (options.insecure) {
    spdlog::warn("CURVE is off (--insecure): traffic is plaintext and any client may join");
  } else {
    if (options.identity.empty() || options.allowlist.empty()) {
      return InvalidArgumentError(
          "the coordinator needs --identity and --allow (or --insecure for local development)");
    }
    COHORT_ASSIGN_OR_RETURN(crypto::Ed25519KeyPair identity,
                            crypto::LoadIdentity(options.identity));
    COHORT_ASSIGN_OR_RETURN(curve, crypto::CurveKeysFor(identity));
    COHORT_ASSIGN_OR_RETURN(auto list, crypto::LoadAllowlist(options.allowlist));
    for (const auto& entry : list) {
      COHORT_ASSIGN_OR_RETURN(crypto::X25519Public pk, crypto::CurvePublicFor(entry.key));
      allowed[pk] = entry.name;
      identities[entry.name] = entry.key;
    }
    spdlog::info("CURVE on; {} client keys in the allowlist {}", allowed.size(), options.allowlist);
    zap.bind("inproc://zeromq.zap.01");
  }
  zmq::socket_t socket(context, zmq::socket_type::router);
  if (curve) {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey,
               std::string(reinterpret_cast<const char*>(curve->secret_z85.bytes().data()), 40));
    socket.set(zmq::sockopt::zap_domain, "cohort");
  }
  // An unroutable reply (peer gone) fails fast instead of vanishing.
  socket.set(zmq::sockopt::router_mandatory, 1);
  // Frames beyond this size drop the connection inside ZeroMQ before they are
  // buffered; smaller oversize frames are rejected by DecodeEnvelope with a
  // logged reason.
  const int64_t max_msg = static_cast<int64_t>(engine->num_params()) * 4 + (4 << 20);
  socket.set(zmq::sockopt::maxmsgsize, max_msg);
  socket.set(zmq::sockopt::linger, 2000);
  socket.set(zmq::sockopt::sndhwm, 100000);
  try {
    socket.bind(options.bind);
  } catch (const zmq::error_t& e) {
    return UnavailableError("cannot bind " + options.bind + ": " + e.what());
  }
  const std::string endpoint = net::LastEndpoint(socket);
  spdlog::info("listening on {} (run {}, {} parameters, resuming after round {})", endpoint,
               config.name(), engine->num_params(), engine->last_committed_round());
  if (!options.endpoint_file.empty()) {
    COHORT_RETURN_IF_ERROR(WriteFileAtomically(options.endpoint_file, endpoint + "\n"));
  }
  std::printf("coordinator listening on %s\n", endpoint.c_str());
  std::fflush(stdout);

  auto send_all = [&](std::vector<Outgoing> out) {
    for (auto& o : out) {
      if (!net::SendFrames(socket, o.peer, net::EncodeEnvelope(o.header, o.payload))) {
        spdlog::debug("could not send {} to a peer that is gone", net::BodyName(o.header));
      }
    }
    for (const RoundRecord& r : engine->TakeCommitted())
      PrintRound(r, config.rounds().num_rounds());
  };

  net::RawMessage raw;
  // After the last round, serve a little longer so every client hears
  // Finished and acknowledges it; closing with unread client messages would
  // make the kernel reset connections and lose the Finished still in flight.
  const TimeMs grace_ms = static_cast<TimeMs>(3000 * config.net().heartbeat_s()) + 500;
  std::optional<TimeMs> done_at;
  while (!stop.load()) {
    if (engine->done()) {
      if (!done_at) done_at = SteadyNowMs();
      if (engine->all_acknowledged_finish() || SteadyNowMs() - *done_at > grace_ms) break;
    }
    if (!engine->store_error().ok()) return engine->store_error();
    TimeMs now = SteadyNowMs();
    // Wake for the engine's next deadline, and at least every 200 ms to see
    // `stop` (signals do not interrupt zmq_poll reliably across versions).
    TimeMs wait = 200;
    if (auto next = engine->NextWakeup()) wait = std::clamp<TimeMs>(*next - now, 0, 200);
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                               {zap.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, curve ? 2 : 1, std::chrono::milliseconds(wait));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return UnavailableError(std::string("poll: ") + e.what());
    }
    if (curve && (items[1].revents & ZMQ_POLLIN)) AnswerZap(zap, allowed);
    // Drain everything that is ready, then let time advance.
    for (int budget = 0; budget < 10000 && net::TryReceive(socket, true, raw); ++budget) {
      now = SteadyNowMs();
      auto envelope = net::DecodeEnvelope(raw.frames, engine->limits());
      if (!envelope.ok()) {
        send_all(engine->OnMalformed(raw.peer, envelope.status()));
      } else if (curve && envelope->header.has_hello() &&
                 (envelope->header.hello().client_name() != raw.user_id ||
                  envelope->header.hello().identity_key() !=
                      std::string(reinterpret_cast<const char*>(identities[raw.user_id].data()),
                                  crypto::kEd25519PublicBytes))) {
        // Under CURVE a client's name and its signing identity are its
        // allowlist entry: no client may speak or sign for another.
        const auto& hello = envelope->header.hello();
        const bool name_ok = hello.client_name() == raw.user_id;
        spdlog::warn("rejected hello: key of {} claims {}", raw.user_id,
                     name_ok ? "another identity key"
                             : "the name \"" + hello.client_name().substr(0, 80) + "\"");
        wire::Header reject;
        reject.set_version(wire::VERSION_1);
        reject.mutable_reject()->set_reason(
            name_ok ? "identity key in hello is not the allowlisted key of \"" + raw.user_id + "\""
                    : "client name \"" + hello.client_name() +
                          "\" does not match this key's allowlist name \"" + raw.user_id + "\"");
        (void)net::SendFrames(socket, raw.peer, net::EncodeEnvelope(reject));
      } else {
        send_all(engine->OnMessage(raw.peer, *envelope, now));
      }
    }
    send_all(engine->OnTick(SteadyNowMs()));
  }
  if (!engine->store_error().ok()) return engine->store_error();
  if (!engine->done())
    return CancelledError("stopped after round " + std::to_string(engine->last_committed_round()));
  return OkStatus();
}

}  // namespace cohort::coordinator
