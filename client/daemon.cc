#include "client/daemon.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

#include "client/session.h"
#include "client/site.h"
#include "common/clock.h"
#include "crypto/key_files.h"
#include "datasets/shard.h"
#include "net/curve.h"
#include "net/envelope.h"
#include "proto/config_io.h"
#include "train/backend.h"
#include "train/device.h"
#include "train/model_config.h"
#include "train/trainer.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::client {
namespace {

// Secure-aggregation messages from the coordinator grow with the cohort (keys,
// shares and signatures of up to a million clients).
constexpr size_t kMaxHeaderBytes = size_t{64} << 20;

// One local training job, run on a worker thread so the main loop keeps
// heartbeating and can hear a replacement task.
struct Job {
  TrainTask task;
  std::vector<float> local;
  std::atomic<bool> cancel{false};
  StatusOr<train::TrainResult> result = CancelledError("not run");
};

// Every round allocates and frees buffers the size of the model (the task,
// the trained copy, the update). By default glibc maps each one afresh and
// unmaps it on free (its threshold follows the largest block freed so far,
// and a masked update is a few words longer than the model), so every
// round pays a page fault and a zeroed page per 4 KiB. Keeping them in the
// heap recycles the memory; the daemon's footprint stays at its peak.
void KeepLargeBuffers() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace

Status RunClient(const ClientOptions& options, const std::atomic<bool>& stop) {
  KeepLargeBuffers();
  COHORT_ASSIGN_OR_RETURN(datasets::Dataset data, datasets::ReadShard(options.data));
  spdlog::info("loaded {} samples from {}", data.size(), options.data);
  std::string device_note;
  COHORT_ASSIGN_OR_RETURN(
      auto backend,
      train::NewBackend({.device = options.device, .threads = options.threads}, &device_note));
  if (!device_note.empty()) spdlog::info("{}", device_note);
  spdlog::info("training on {}", backend->Name());
  // The shard stays in backend memory for the whole run.
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<train::DeviceDataset> device_data,
                          train::DeviceDataset::Upload(backend.get(), data));

  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  // No queueing to a coordinator that is not connected: what would queue is
  // stale by the time it reconnects. The session re-sends Hello until a
  // Welcome arrives.
  socket.set(zmq::sockopt::immediate, 1);
  socket.set(zmq::sockopt::linger, 1000);
  socket.set(zmq::sockopt::reconnect_ivl_max, 2000);
  // What a peer may make ZeroMQ buffer in one frame, also before CURVE has
  // authenticated the coordinator.
  socket.set(zmq::sockopt::maxmsgsize, net::MaxFrameBytes(kMaxHeaderBytes));
  zmq::socket_t done_rx(context, zmq::socket_type::pair);
  zmq::socket_t done_tx(context, zmq::socket_type::pair);
  done_rx.bind("inproc://training-done");
  done_tx.connect("inproc://training-done");
  crypto::Ed25519KeyPair identity;
  if (!options.identity.empty()) {
    COHORT_ASSIGN_OR_RETURN(identity, crypto::LoadIdentity(options.identity));
  } else {
    COHORT_ASSIGN_OR_RETURN(identity, crypto::GenerateEd25519());
  }
  // The site's group, on a context of its own (its ZAP handler, when the
  // site runs over tcp).
  zmq::context_t site_context(1);
  std::unique_ptr<Site> site;
  uint64_t samples = data.size();
  if (options.site_size > 1) {
    net::GroupOptions group{.rank = 0,
                            .size = options.site_size,
                            .master = options.site_master,
                            .transport = options.site_transport,
                            .host = options.site_host,
                            .encrypt = options.site_encrypt,
                            .insecure = options.site_insecure};
    if (!options.site_allow.empty()) {
      if (options.identity.empty()) {
        return InvalidArgumentError(
            "client: --site-allow needs --identity (the key the site's workers pin)");
      }
      // This client is rank 0: its own key is the one the workers pin.
      COHORT_ASSIGN_OR_RETURN(group.allowlist, crypto::LoadAllowlist(options.site_allow));
      group.identity = &identity;
      group.master_key = identity.public_key;
    }
    COHORT_ASSIGN_OR_RETURN(site,
                            Site::Join(site_context, group, backend.get(), device_data.get()));
    samples = site->total_samples();
    spdlog::info("site of {} ranks ({}): {} samples, {} of them here", site->size(),
                 net::Describe(group), samples, data.size());
  }
  if (options.insecure) {
    spdlog::warn("CURVE is off (--insecure): traffic to the coordinator is plaintext");
  } else {
    if (options.identity.empty() || options.coordinator_key.empty()) {
      return InvalidArgumentError(
          "the client needs --identity and --coordinator-key (or --insecure for local "
          "development)");
    }
    COHORT_ASSIGN_OR_RETURN(crypto::CurveKeys mine, crypto::CurveKeysFor(identity));
    COHORT_ASSIGN_OR_RETURN(crypto::Ed25519Public server,
                            crypto::LoadPublicKey(options.coordinator_key));
    COHORT_ASSIGN_OR_RETURN(crypto::X25519Public server_curve, crypto::CurvePublicFor(server));
    COHORT_RETURN_IF_ERROR(net::SetUpCurveClient(socket, mine, server_curve));
  }
  try {
    socket.connect(options.coordinator);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("cannot connect to " + options.coordinator + ": " + e.what());
  }

  std::vector<crypto::Ed25519Public> peers;
  if (!options.peers.empty()) {
    COHORT_ASSIGN_OR_RETURN(auto allowed, crypto::LoadAllowlist(options.peers));
    if (allowed.empty())
      return InvalidArgumentError("--peers " + options.peers + " has no .pub files");
    for (const auto& a : allowed) peers.push_back(a.key);
  }

  std::unique_ptr<train::Model> model;
  config::ModelConfig model_config;  // What `model` was built from (the site's workers need it).
  Session session(
      options.name, samples,
      [&](const config::ModelConfig& config) -> StatusOr<size_t> {
        // The coordinator's model is untrusted: the same caps as a config
        // file's, before anything is allocated for it.
        config::RunConfig check;
        *check.mutable_model() = config;
        COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(check).WithContext("coordinator's model"));
        COHORT_ASSIGN_OR_RETURN(model, train::BuildModel(config, backend.get()));
        COHORT_RETURN_IF_ERROR(train::CheckCompatible(*model, data).WithContext(options.data));
        model_config = config;
        return model->num_params();
      },
      &identity, FaultPlan{options.fault_stage, options.fault_round, options.fault_misbehave},
      options.dump_inputs.empty()
          ? InputObserver()
          : [&options](uint32_t round, std::span<const uint32_t> input) {
              const std::string path = options.dump_inputs + "/" + options.name + ".round-" +
                                       std::to_string(round) + ".u32";
              if (FILE* f = std::fopen(path.c_str(), "wb")) {
                std::fwrite(input.data(), sizeof(uint32_t), input.size(), f);
                std::fclose(f);
              } else {
                spdlog::error("cannot write {}", path);
              }
            });
  if (!peers.empty()) session.set_peers(std::move(peers));
  if (options.require_secure) session.set_require_secure(true);
  session.set_min_corrupt_fraction(options.corrupt_fraction);

  std::unique_ptr<Job> job;
  std::thread worker;
  auto stop_job = [&]() {
    if (job) job->cancel = true;
    if (worker.joinable()) worker.join();
    job.reset();
  };
  std::optional<Status> exit;
  auto apply = [&](Actions a) {
    for (auto& o : a.send) {
      // A failed send (not connected) is retried by the session's timers.
      (void)net::SendFrames(
          socket, "",
          o.words.empty() ? net::EncodeEnvelope(o.header, std::span<const float>(o.payload))
                          : net::EncodeEnvelope(o.header, std::span<const uint32_t>(o.words)));
    }
    for (const auto& line : a.printed) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    if (a.cancel_training) stop_job();
    if (a.train) {
      stop_job();
      job = std::make_unique<Job>();
      job->task = std::move(*a.train);
      job->local = job->task.global;
      Job* j = job.get();
      worker = std::thread([j, &model, &model_config, &site, &device_data, &done_tx]() {
        j->result =
            site ? site->Train(model_config, *model, j->local, j->task.options, &j->cancel)
                 : train::TrainLocal(*model, j->local, *device_data, j->task.options, &j->cancel);
        // The signal names its task: a cancelled job's signal is recognised
        // as stale. This PAIR end is used only by the one live worker.
        const uint64_t id = j->task.task_id;
        done_tx.send(zmq::buffer(&id, sizeof(id)), zmq::send_flags::none);
      });
    }
    if (a.exit) exit = std::move(a.exit);
  };

  apply(session.Start(SteadyNowMs()));
  net::RawMessage raw;
  while (!exit && !stop.load()) {
    const TimeMs wait = std::clamp<TimeMs>(session.NextWakeup() - SteadyNowMs(), 0, 200);
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
      uint64_t id = 0;
      if (signal.size() == sizeof(id)) std::memcpy(&id, signal.data(), sizeof(id));
      if (job && job->task.task_id == id) {
        if (worker.joinable()) worker.join();
        std::unique_ptr<Job> done = std::move(job);
        apply(session.OnTrainingDone(id, done->result, done->local, SteadyNowMs()));
      }
    }
    for (int budget = 0; budget < 1000 && !exit && net::TryReceive(socket, false, raw); ++budget) {
      net::Limits limits;
      limits.max_header_bytes = kMaxHeaderBytes;
      limits.max_payload_floats = std::max<size_t>(session.num_params(), 1);
      auto env = net::DecodeEnvelope(raw.frames, limits);
      if (!env.ok()) {
        spdlog::warn("ignored a malformed message from the coordinator: {}",
                     env.status().message());
        continue;
      }
      apply(session.OnMessage(*env, SteadyNowMs()));
    }
    if (!exit) apply(session.OnTick(SteadyNowMs()));
  }
  stop_job();
  if (site) site->Finish();
  return exit.value_or(CancelledError("stopped"));
}

}  // namespace cohort::client
