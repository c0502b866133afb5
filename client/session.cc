#include "client/session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "common/bytes.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::client {
namespace {

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

wire::Header Header() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

}  // namespace

Session::Session(std::string name, uint64_t num_samples, ModelBuilder build_model,
                 uint32_t pause_before_update_round)
    : name_(std::move(name)),
      num_samples_(num_samples),
      build_model_(std::move(build_model)),
      pause_round_(pause_before_update_round) {}

void Session::Send(wire::Header header, std::vector<float> payload, TimeMs now, Actions& a) {
  last_sent_ = now;
  a.send.push_back({std::move(header), std::move(payload)});
}

void Session::SendHello(TimeMs now, Actions& a) {
  wire::Header h = Header();
  h.mutable_hello()->set_client_name(name_);
  h.mutable_hello()->set_num_samples(num_samples_);
  h.mutable_hello()->set_code_version(COHORT_VERSION);
  Send(std::move(h), {}, now, a);
}

// Unwelcomed clients retry hello quickly (the send fails while unconnected).
TimeMs Session::Interval() const {
  return welcomed_ ? heartbeat_ms_ : std::min<TimeMs>(heartbeat_ms_, 250);
}

TimeMs Session::NextWakeup() const { return last_sent_ + Interval(); }

Actions Session::Start(TimeMs now) {
  Actions a;
  last_heard_ = now;
  SendHello(now, a);
  return a;
}

Actions Session::OnTick(TimeMs now) {
  Actions a;
  if (finished_ || now - last_sent_ < Interval()) return a;
  // Until welcomed, or when the coordinator has gone quiet, say hello.
  if (!welcomed_ || now - last_heard_ > 3 * heartbeat_ms_) {
    SendHello(now, a);
  } else {
    wire::Header h = Header();
    h.mutable_heartbeat();
    Send(std::move(h), {}, now, a);
  }
  return a;
}

Actions Session::OnTrainingDone(uint64_t task_id, const StatusOr<train::TrainResult>& result,
                                std::span<const float> local, TimeMs now) {
  Actions a;
  if (!running_ || running_->task_id != task_id) return a;  // Replaced meanwhile.
  TrainTask task = std::move(*running_);
  running_.reset();
  if (!result.ok()) {
    spdlog::error("round {}: training failed: {}", task.round, result.status().message());
    return a;
  }
  last_completed_task_ = task_id;
  std::vector<float> delta(local.begin(), local.end());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] -= task.global[i];
  if (pause_round_ == task.round) {
    a.printed.push_back("paused before update of round " + std::to_string(task.round));
    spdlog::warn("fault injection: withholding the update of round {}", task.round);
    return a;
  }
  wire::Header h = Header();
  auto* u = h.mutable_update();
  u->set_round(task.round);
  u->set_task_id(task_id);
  u->set_num_samples(num_samples_);
  u->set_train_loss(result->mean_loss);
  u->set_train_accuracy(result->accuracy);
  u->set_train_seconds(result->seconds);
  spdlog::info("round {}: trained {} samples in {:.2f} s, loss {:.4f}", task.round, result->samples,
               result->seconds, result->mean_loss);
  Send(std::move(h), std::move(delta), now, a);
  return a;
}

Actions Session::OnMessage(const net::Envelope& env, TimeMs now) {
  Actions a;
  last_heard_ = now;
  const wire::Header& h = env.header;
  switch (h.body_case()) {
    case wire::Header::kWelcome: {
      const auto& w = h.welcome();
      if (num_params_ == 0) {
        auto built = build_model_(w.model());
        if (!built.ok()) {
          a.exit = built.status();
          return a;
        }
        num_params_ = *built;
      }
      if (w.num_params() != num_params_) {
        a.exit = FailedPreconditionError(
            "coordinator's model has " + std::to_string(w.num_params()) +
            " parameters, the local build has " + std::to_string(num_params_));
        return a;
      }
      if (std::isfinite(w.heartbeat_s()) && w.heartbeat_s() > 0) {
        heartbeat_ms_ = std::clamp<TimeMs>(static_cast<TimeMs>(w.heartbeat_s() * 1000), 50, 60000);
      }
      if (!welcomed_) spdlog::info("registered with run {}", w.run_name());
      welcomed_ = true;
      break;
    }
    case wire::Header::kTask: {
      const auto& t = h.task();
      if (num_params_ == 0) {
        spdlog::warn("task before welcome; ignored");
        break;
      }
      if ((running_ && running_->task_id == t.task_id()) || last_completed_task_ == t.task_id()) {
        break;  // A re-sent task we already have.
      }
      Status ok = CheckTask(t, env, num_params_);
      if (!ok.ok()) {
        spdlog::warn("round {}: bad task ignored: {}", t.round(), ok.message());
        break;
      }
      TrainTask task;
      task.round = t.round();
      task.task_id = t.task_id();
      task.global = env.payloads[0];
      task.options.epochs = t.train().local_epochs();
      task.options.batch_size = t.train().batch_size();
      task.options.sgd.learning_rate = t.train().learning_rate();
      task.options.sgd.momentum = t.train().momentum();
      task.options.sgd.weight_decay = t.train().weight_decay();
      task.options.seed = t.train_seed();
      spdlog::info("round {}: task received", t.round());
      a.cancel_training = running_.has_value();
      running_ = task;
      a.train = std::move(task);
      break;
    }
    case wire::Header::kHeartbeatAck:
      break;
    case wire::Header::kError: {
      const auto& e = h.error();
      if (e.code() == wire::UNKNOWN_CLIENT) {
        spdlog::info("coordinator does not know this client (restarted?); registering again");
        welcomed_ = false;
        SendHello(now, a);
      } else {
        spdlog::warn("coordinator error (round {}): {}", e.round(), e.message());
      }
      break;
    }
    case wire::Header::kReject:
      a.cancel_training = running_.has_value();
      running_.reset();
      a.exit = FailedPreconditionError("coordinator rejected this client: " + h.reject().reason());
      break;
    case wire::Header::kFinished: {
      spdlog::info("run finished after {} rounds", h.finished().rounds());
      // Acknowledge, so the coordinator can close without waiting.
      wire::Header ack = Header();
      ack.mutable_heartbeat();
      Send(std::move(ack), {}, now, a);
      a.cancel_training = running_.has_value();
      running_.reset();
      finished_ = true;
      a.exit = OkStatus();
      break;
    }
    default:
      spdlog::warn("ignored unexpected {} message from the coordinator", net::BodyName(h));
      break;
  }
  return a;
}

}  // namespace cohort::client
