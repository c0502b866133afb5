#include "client/daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common/bytes.h"
#include "common/clock.h"
#include "crypto/key_files.h"
#include "datasets/shard.h"
#include "net/envelope.h"
#include "train/backend.h"
#include "train/model_config.h"
#include "train/trainer.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::client {
namespace {

// One local training job, run on a worker thread so the main loop keeps
// heartbeating and can hear a replacement task.
struct Job {
  uint32_t round = 0;
  uint64_t task_id = 0;
  std::vector<float> global;
  std::vector<float> local;
  train::TrainOptions options;
  std::atomic<bool> cancel{false};
  StatusOr<train::TrainResult> result = CancelledError("not run");
};

Status CheckTask(const wire::RoundTask& task, const net::Envelope& env, size_t num_params) {
  if (task.round() == 0) return InvalidArgumentError("task for round 0");
  if (env.payloads.size() != 1 || env.payloads[0].size() != num_params) {
    return InvalidArgumentError("task model has " +
                                std::to_string(env.payloads.empty() ? 0 : env.payloads[0].size()) +
                                " values, expected " + std::to_string(num_params));
  }
  if (!AllFinite(env.payloads[0])) return InvalidArgumentError("task model has NaN or Inf");
  const auto& t = task.train();
  if (t.local_epochs() == 0 || t.local_epochs() > 1000 || t.batch_size() == 0 ||
      t.batch_size() > 65536 || !std::isfinite(t.learning_rate()) || t.learning_rate() <= 0 ||
      !std::isfinite(t.momentum()) || t.momentum() < 0 || t.momentum() >= 1 ||
      !std::isfinite(t.weight_decay()) || t.weight_decay() < 0) {
    return InvalidArgumentError("task has out-of-range training settings");
  }
  return OkStatus();
}

}  // namespace

Status RunClient(const ClientOptions& options, const std::atomic<bool>& stop) {
  COHORT_ASSIGN_OR_RETURN(datasets::Dataset data, datasets::ReadShard(options.data));
  spdlog::info("loaded {} samples from {}", data.size(), options.data);
  COHORT_ASSIGN_OR_RETURN(auto backend, train::NewCpuBackend(options.threads));

  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  // No queueing to a coordinator that is not connected: what would queue is
  // stale by the time it reconnects. Hello is re-sent on every heartbeat
  // until a Welcome arrives.
  socket.set(zmq::sockopt::immediate, 1);
  socket.set(zmq::sockopt::linger, 1000);
  socket.set(zmq::sockopt::reconnect_ivl_max, 2000);
  zmq::socket_t done_rx(context, zmq::socket_type::pair);
  zmq::socket_t done_tx(context, zmq::socket_type::pair);
  done_rx.bind("inproc://training-done");
  done_tx.connect("inproc://training-done");
  if (options.insecure) {
    spdlog::warn("CURVE is off (--insecure): traffic to the coordinator is plaintext");
  } else {
    if (options.identity.empty() || options.coordinator_key.empty()) {
      return InvalidArgumentError(
          "the client needs --identity and --coordinator-key (or --insecure for local "
          "development)");
    }
    COHORT_ASSIGN_OR_RETURN(crypto::Ed25519KeyPair identity,
                            crypto::LoadIdentity(options.identity));
    COHORT_ASSIGN_OR_RETURN(crypto::CurveKeys mine, crypto::CurveKeysFor(identity));
    COHORT_ASSIGN_OR_RETURN(crypto::Ed25519Public server,
                            crypto::LoadPublicKey(options.coordinator_key));
    COHORT_ASSIGN_OR_RETURN(crypto::X25519Public server_curve, crypto::CurvePublicFor(server));
    socket.set(zmq::sockopt::curve_serverkey, crypto::Z85(server_curve));
    socket.set(zmq::sockopt::curve_publickey, mine.public_z85);
    socket.set(zmq::sockopt::curve_secretkey,
               std::string(reinterpret_cast<const char*>(mine.secret_z85.bytes().data()), 40));
  }
  try {
    socket.connect(options.coordinator);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("cannot connect to " + options.coordinator + ": " + e.what());
  }

  std::unique_ptr<train::Model> model;
  size_t num_params = 0;
  bool welcomed = false;
  TimeMs heartbeat_ms = 1000;
  TimeMs last_heard = SteadyNowMs();
  TimeMs last_sent = 0;
  std::unique_ptr<Job> job;
  std::thread worker;
  uint64_t last_completed_task = 0;

  auto send = [&](const wire::Header& header, std::span<const float> payload = {}) {
    last_sent = SteadyNowMs();
    return net::SendFrames(socket, "", net::EncodeEnvelope(header, payload));
  };
  auto send_hello = [&]() {
    wire::Header h;
    h.set_version(wire::VERSION_1);
    h.mutable_hello()->set_client_name(options.name);
    h.mutable_hello()->set_num_samples(data.size());
    h.mutable_hello()->set_code_version(COHORT_VERSION);
    send(h);
  };
  auto finish_job = [&]() {
    if (worker.joinable()) worker.join();
  };
  auto cancel_job = [&]() {
    if (job) job->cancel = true;
    finish_job();
    job.reset();
  };

  send_hello();
  net::RawMessage raw;
  Status exit_status = CancelledError("stopped");
  bool running = true;
  while (running && !stop.load()) {
    const TimeMs now = SteadyNowMs();
    // Unwelcomed clients retry hello quickly; the send fails while unconnected.
    const TimeMs interval = welcomed ? heartbeat_ms : std::min<TimeMs>(heartbeat_ms, 250);
    const TimeMs wait = std::clamp<TimeMs>(last_sent + interval - now, 0, 200);
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                               {done_rx.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(wait));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return UnavailableError(std::string("poll: ") + e.what());
    }

    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t signal;
      (void)done_rx.recv(signal);
      finish_job();
      if (job && !job->cancel && job->result.ok()) {
        const train::TrainResult& r = *job->result;
        std::vector<float>& delta = job->local;
        for (size_t i = 0; i < delta.size(); ++i) delta[i] -= job->global[i];
        last_completed_task = job->task_id;
        if (options.pause_before_update_round == job->round) {
          std::printf("paused before update of round %u\n", job->round);
          std::fflush(stdout);
          spdlog::warn("fault injection: withholding the update of round {}", job->round);
        } else {
          wire::Header h;
          h.set_version(wire::VERSION_1);
          auto* u = h.mutable_update();
          u->set_round(job->round);
          u->set_task_id(job->task_id);
          u->set_num_samples(data.size());
          u->set_train_loss(r.mean_loss);
          u->set_train_accuracy(r.accuracy);
          u->set_train_seconds(r.seconds);
          send(h, delta);
          spdlog::info("round {}: trained {} samples in {:.2f} s, loss {:.4f}", job->round,
                       r.samples, r.seconds, r.mean_loss);
        }
      } else if (job && !job->cancel) {
        spdlog::error("round {}: training failed: {}", job->round, job->result.status().message());
      }
      job.reset();
    }

    for (int budget = 0; budget < 1000 && net::TryReceive(socket, false, raw); ++budget) {
      last_heard = SteadyNowMs();
      net::Limits limits;
      limits.max_payload_floats = std::max<size_t>(num_params, 1);
      auto env = net::DecodeEnvelope(raw.frames, limits);
      if (!env.ok()) {
        spdlog::warn("ignored a malformed message from the coordinator: {}",
                     env.status().message());
        continue;
      }
      const wire::Header& h = env->header;
      switch (h.body_case()) {
        case wire::Header::kWelcome: {
          const auto& w = h.welcome();
          if (!model) {
            auto built = train::BuildModel(w.model(), backend.get());
            if (!built.ok()) return built.status().WithContext("coordinator's model");
            model = std::move(built).value();
            COHORT_RETURN_IF_ERROR(train::CheckCompatible(*model, data).WithContext(options.data));
            num_params = model->num_params();
          }
          if (w.num_params() != num_params) {
            return FailedPreconditionError(
                "coordinator's model has " + std::to_string(w.num_params()) +
                " parameters, the local build has " + std::to_string(num_params));
          }
          if (std::isfinite(w.heartbeat_s()) && w.heartbeat_s() > 0) {
            heartbeat_ms =
                std::clamp<TimeMs>(static_cast<TimeMs>(w.heartbeat_s() * 1000), 50, 60000);
          }
          if (!welcomed) spdlog::info("registered with run {}", w.run_name());
          welcomed = true;
          break;
        }
        case wire::Header::kTask: {
          const auto& t = h.task();
          if (!model) {
            spdlog::warn("task before welcome; ignored");
            break;
          }
          if ((job && job->task_id == t.task_id()) || last_completed_task == t.task_id()) {
            break;  // A re-sent task we already have.
          }
          Status ok = CheckTask(t, *env, num_params);
          if (!ok.ok()) {
            spdlog::warn("round {}: bad task ignored: {}", t.round(), ok.message());
            break;
          }
          cancel_job();
          job = std::make_unique<Job>();
          job->round = t.round();
          job->task_id = t.task_id();
          job->global = env->payloads[0];
          job->local = job->global;
          job->options.epochs = t.train().local_epochs();
          job->options.batch_size = t.train().batch_size();
          job->options.sgd.learning_rate = t.train().learning_rate();
          job->options.sgd.momentum = t.train().momentum();
          job->options.sgd.weight_decay = t.train().weight_decay();
          job->options.seed = t.train_seed();
          spdlog::info("round {}: task received", t.round());
          Job* j = job.get();
          worker = std::thread([j, &model, &data, &done_tx]() {
            j->result = train::TrainLocal(*model, j->local, data, j->options, &j->cancel);
            // zmq sockets are not thread-safe, but this PAIR end is used only
            // here, one job at a time (the main thread joins before reuse).
            done_tx.send(zmq::str_buffer("done"), zmq::send_flags::none);
          });
          break;
        }
        case wire::Header::kHeartbeatAck:
          break;
        case wire::Header::kError: {
          const auto& e = h.error();
          if (e.code() == wire::UNKNOWN_CLIENT) {
            spdlog::info("coordinator does not know this client (restarted?); registering again");
            welcomed = false;
            send_hello();
          } else {
            spdlog::warn("coordinator error (round {}): {}", e.round(), e.message());
          }
          break;
        }
        case wire::Header::kReject:
          cancel_job();
          return FailedPreconditionError("coordinator rejected this client: " +
                                         h.reject().reason());
        case wire::Header::kFinished:
          spdlog::info("run finished after {} rounds", h.finished().rounds());
          {
            // Acknowledge, so the coordinator can close without waiting.
            wire::Header ack;
            ack.set_version(wire::VERSION_1);
            ack.mutable_heartbeat();
            send(ack);
          }
          exit_status = OkStatus();
          running = false;
          break;
        default:
          spdlog::warn("ignored unexpected {} message from the coordinator", net::BodyName(h));
          break;
      }
      if (!running) break;
    }

    const TimeMs t = SteadyNowMs();
    if (running &&
        t - last_sent >= (welcomed ? heartbeat_ms : std::min<TimeMs>(heartbeat_ms, 250))) {
      // Until welcomed, or when the coordinator has gone quiet, say hello.
      if (!welcomed || t - last_heard > 3 * heartbeat_ms) {
        send_hello();
      } else {
        wire::Header h;
        h.set_version(wire::VERSION_1);
        h.mutable_heartbeat();
        send(h);
      }
    }
  }
  cancel_job();
  return exit_status;
}

}  // namespace cohort::client
