#include "client/daemon.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "client/local_trainer.h"
#include "client/metrics.h"
#include "client/session.h"
#include "client/wait_report.h"
#include "common/clock.h"
#include "crypto/digest.h"
#include "crypto/key_files.h"
#include "net/curve.h"
#include "net/endpoint.h"
#include "net/link_monitor.h"
#include "net/zmq_codec.h"
#include "train/train_progress.h"

namespace cohort::client {
namespace {

// Secure-aggregation messages from the coordinator grow with the cohort (keys,
// shares and signatures of up to a million clients).
constexpr size_t kMaxHeaderBytes = size_t{64} << 20;

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

// The DEALER socket to the coordinator, not yet connected.
zmq::socket_t CoordinatorSocket(zmq::context_t& context) {
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
  return socket;
}

// --identity, or a fresh key for this process.
StatusOr<crypto::Ed25519KeyPair> LoadOrGenerateIdentity(const ClientOptions& options) {
  if (!options.identity.empty()) return crypto::LoadIdentity(options.identity);
  return crypto::GenerateEd25519();
}

// CURVE with the pinned coordinator key (unless --insecure), then connect.
Status ConnectToCoordinator(const ClientOptions& options, const crypto::Ed25519KeyPair& identity,
                            zmq::socket_t& socket) {
  COHORT_RETURN_IF_ERROR(net::CheckEndpoint("--coordinator", options.coordinator));
  if (options.insecure) {
    spdlog::warn("CURVE is off (--insecure): traffic to the coordinator is plaintext");
  } else {
    if (options.identity.empty() || options.coordinator_key.empty()) {
      return InvalidArgumentError(
          "the client needs --identity and --coordinator-key (or --insecure for local "
          "development)");
    }
    COHORT_ASSIGN_OR_RETURN(crypto::CurveKeys mine, crypto::CurveKeysFor(identity));
    COHORT_ASSIGN_OR_RETURN(crypto::X25519Public curve,
                            crypto::CurvePublicFor(identity.public_key));
    spdlog::info("this client's CURVE key is {} (from {})", crypto::Hex(curve), options.identity);
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
  return OkStatus();
}

// The identity keys of --peers (none without it).
StatusOr<std::vector<crypto::Ed25519Public>> LoadPeers(const ClientOptions& options) {
  std::vector<crypto::Ed25519Public> peers;
  if (options.peers.empty()) return peers;
  COHORT_ASSIGN_OR_RETURN(auto allowed, crypto::LoadAllowlist(options.peers));
  if (allowed.empty())
    return InvalidArgumentError("--peers " + options.peers + " has no .pub files");
  for (const auto& a : allowed) peers.push_back(a.key);
  return peers;
}

// --dump-inputs: each secure round's encoded input to DIR/NAME.round-N.u32.
InputObserver DumpInputs(const ClientOptions& options) {
  if (options.dump_inputs.empty()) return InputObserver();
  return [&options](uint32_t round, std::span<const uint32_t> input) {
    const std::string path =
        options.dump_inputs + "/" + options.name + ".round-" + std::to_string(round) + ".u32";
    if (FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(input.data(), sizeof(uint32_t), input.size(), f);
      std::fclose(f);
    } else {
      spdlog::error("cannot write {}", path);
    }
  };
}

// The bytes of a message's frames, as they cross the socket.
uint64_t FrameBytes(std::span<const zmq::message_t> frames) {
  uint64_t bytes = 0;
  for (const zmq::message_t& f : frames) bytes += f.size();
  return bytes;
}

// One local training job, run on a worker thread so the main loop keeps
// heartbeating and can hear a replacement task.
struct Job {
  TrainTask task;
  std::vector<float> local;
  std::atomic<bool> cancel{false};
  std::atomic<bool> done{false};  // The trainer returned.
  StatusOr<train::TrainResult> result = CancelledError("not run");
  std::optional<train::EvalResult> eval;  // Federated evaluation, when asked and done.
};

// The daemon's I/O loop: the session's messages to and from the coordinator
// and the one training job, whose thread signals its end on an inproc pair.
class EventLoop {
 public:
  EventLoop(const ClientOptions& options, LocalTrainer& trainer,
            const crypto::Ed25519KeyPair* identity, zmq::context_t& context, zmq::socket_t& socket,
            net::LinkMonitor& link)
      : options_(options),
        trainer_(trainer),
        socket_(socket),
        link_(link),
        waits_({.coordinator = options.coordinator,
                .identity = options.identity,
                .coordinator_key = options.coordinator_key,
                .insecure = options.insecure}),
        done_rx_(context, zmq::socket_type::pair),
        done_tx_(context, zmq::socket_type::pair),
        session_(
            options.name, trainer.num_samples(),
            [&trainer](const config::ModelConfig& config) { return trainer.BuildModel(config); },
            identity, FaultPlan{options.fault_stage, options.fault_round, options.fault_misbehave},
            DumpInputs(options)) {
    done_rx_.bind("inproc://training-done");
    done_tx_.connect("inproc://training-done");
    if (options.metrics != nullptr) metrics_.emplace(options.metrics->registry());
  }
  ~EventLoop() { StopJob(); }

  Session& session() { return session_; }

  // Until the session exits or `stop` becomes true (kCancelled); then tells
  // the site's workers the run is over.
  Status Run(const std::atomic<bool>& stop) {
    Apply(session_.Start(SteadyNowMs()));
    while (!exit_ && !stop.load()) {
      const TimeMs wait = std::clamp<TimeMs>(session_.NextWakeup() - SteadyNowMs(), 0, 200);
      zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                 {done_rx_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(wait));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return UnavailableError(std::string("poll: ") + e.what());
      }
      if (items[1].revents & ZMQ_POLLIN) OnJobSignal();
      ReceiveMessages();
      if (!exit_) Apply(session_.OnTick(SteadyNowMs()));
      ExplainWait();
    }
    if (!exit_) {
      // A job that ended as `stop` came (a Python fit that raised
      // SystemExit) still goes to the session: its Goodbye says why.
      zmq::pollitem_t done[] = {{done_rx_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        if (zmq::poll(done, 1, std::chrono::milliseconds(0)) > 0) OnJobSignal();
      } catch (const zmq::error_t&) {  // EINTR: the job is stopped below.
      }
    }
    StopJob();
    if (!exit_) Apply(session_.Leave(SteadyNowMs()));  // Sent within the socket's linger.
    trainer_.Finish();
    return exit_.value_or(CancelledError("stopped"));
  }

 private:
  // Says why this client waits for the coordinator, if it does.
  void ExplainWait() {
    const TimeMs now = SteadyNowMs();
    link_.Poll(now);
    std::optional<std::string> line = waits_.Step(link_.events(), session_.welcomed(), now);
    if (!line) return;
    if (link_.events().up() && session_.welcomed()) {
      spdlog::info("{}", *line);
    } else {
      spdlog::warn("{}", *line);
    }
  }

  void Apply(Actions a) {
    for (auto& o : a.send) {
      std::vector<zmq::message_t> frames =
          o.words.empty() ? net::EncodeEnvelope(o.header, std::span<const float>(o.payload))
                          : net::EncodeEnvelope(o.header, std::span<const uint32_t>(o.words));
      const uint64_t bytes = FrameBytes(frames);
      // A failed send (not connected) is retried by the session's timers.
      if (net::SendFrames(socket_, "", std::move(frames)) && metrics_) metrics_->AddSent(bytes);
    }
    for (const auto& line : a.printed) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    if (a.cancel_training) StopJob();
    if (a.train) StartJob(std::move(*a.train));
    if (a.exit) exit_ = std::move(a.exit);
  }

  void StartJob(TrainTask task) {
    StopJob();
    job_ = std::make_unique<Job>();
    job_->task = std::move(task);
    job_->local = job_->task.global;
    job_->task.options.progress = train::EpochProgress("round " + std::to_string(job_->task.round),
                                                       job_->task.options.epochs, stderr);
    worker_ = std::thread([this, j = job_.get()]() {
      if (j->task.evaluate) Evaluate(*j);
      j->result = trainer_.Train(j->task, j->local, &j->cancel);
      j->done = true;
      // The signal names its task: a cancelled job's signal is recognised
      // as stale. This PAIR end is used only by the one live worker.
      const uint64_t id = j->task.task_id;
      done_tx_.send(zmq::buffer(&id, sizeof(id)), zmq::send_flags::none);
    });
  }

  // Worker thread: the task's model on this client's test split, before it
  // trains (j.local is still the global model).
  void Evaluate(Job& j) {
    StatusOr<train::EvalResult> e = trainer_.Evaluate(j.task, j.local);
    if (e.ok()) {
      j.eval = *e;
    } else {
      spdlog::warn("round {}: the coordinator asks for federated evaluation; not evaluated: {}",
                   j.task.round, e.status().message());
    }
  }

  void StopJob() {
    if (job_) job_->cancel = true;
    if (job_ && worker_.joinable() && !job_->done) {
      // Cohort's trainer stops at its next batch; a Python fit cannot be
      // interrupted, and this loop waits for it to return.
      spdlog::info(
          "round {}: the coordinator moved on; waiting for this client's training of it to "
          "stop (a Python fit runs until it returns)",
          job_->task.round);
    }
    if (worker_.joinable()) worker_.join();
    job_.reset();
  }

  // A job's end: handed to the session unless the job was replaced since.
  void OnJobSignal() {
    zmq::message_t signal;
    (void)done_rx_.recv(signal);
    uint64_t id = 0;
    if (signal.size() == sizeof(id)) std::memcpy(&id, signal.data(), sizeof(id));
    if (!job_ || job_->task.task_id != id) return;
    if (worker_.joinable()) worker_.join();
    std::unique_ptr<Job> done = std::move(job_);
    if (metrics_ && done->result.ok()) metrics_->RecordTraining(done->task.round, *done->result);
    Apply(session_.OnTrainingDone(id, done->result, done->local, SteadyNowMs(), done->eval));
  }

  // What the coordinator sent, up to 1000 messages before the next tick.
  void ReceiveMessages() {
    for (int budget = 0; budget < 1000 && !exit_ && net::TryReceive(socket_, false, raw_);
         ++budget) {
      if (metrics_) metrics_->AddReceived(FrameBytes(raw_.frames));
      net::Limits limits;
      limits.max_header_bytes = kMaxHeaderBytes;
      // Twice the model: a train.scaffold task carries the control variate too.
      limits.max_payload_floats = std::max<size_t>(2 * session_.num_params(), 1);
      auto env = net::DecodeEnvelope(raw_.frames, limits);
      if (!env.ok()) {
        spdlog::warn("ignored a malformed message from the coordinator: {}",
                     env.status().message());
        continue;
      }
      Apply(session_.OnMessage(*env, SteadyNowMs()));
    }
  }

  const ClientOptions& options_;
  LocalTrainer& trainer_;
  zmq::socket_t& socket_;
  net::LinkMonitor& link_;
  WaitReporter waits_;
  zmq::socket_t done_rx_, done_tx_;
  Session session_;
  std::unique_ptr<Job> job_;
  std::thread worker_;
  std::optional<Status> exit_;
  net::RawMessage raw_;
  std::optional<ClientMetrics> metrics_;
};

}  // namespace

Status RunClient(const ClientOptions& options, LocalTrainer& trainer,
                 const std::atomic<bool>& stop) {
  if (options.dp_max_rounds > 0 && options.state_dir.empty()) {
    // The cap counts noised rounds in the state directory's ledger: without
    // one, a restart would forget them and the cap would hold per process.
    return InvalidArgumentError("--dp-max-rounds requires --state-dir");
  }
  if (options.share_label_counts && options.dp_noise_multiplier > 0) {
    return InvalidArgumentError(
        "--share-label-counts with --dp-noise-multiplier: the label counts would reach the "
        "coordinator in the clear, and distributed DP does not trust it with this client's data");
  }
  if (!options.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.state_dir, ec);
    if (ec || !std::filesystem::is_directory(options.state_dir)) {
      return InvalidArgumentError("--state-dir " + options.state_dir + ": not a directory" +
                                  (ec ? " (" + ec.message() + ")" : ""));
    }
  }
  KeepLargeBuffers();
  zmq::context_t context(1);
  zmq::socket_t socket = CoordinatorSocket(context);
  COHORT_ASSIGN_OR_RETURN(const crypto::Ed25519KeyPair identity, LoadOrGenerateIdentity(options));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<net::LinkMonitor> link,
                          net::LinkMonitor::Watch(context, socket, SteadyNowMs()));
  COHORT_RETURN_IF_ERROR(ConnectToCoordinator(options, identity, socket));
  COHORT_ASSIGN_OR_RETURN(std::vector<crypto::Ed25519Public> peers, LoadPeers(options));

  // Lineage: the coordinator stores which data each round trained on.
  std::string data_sha256;  // None for a trainer without a shard file (Python's fit).
  if (!options.data.empty()) {
    COHORT_ASSIGN_OR_RETURN(data_sha256, crypto::FileSha256Hex(options.data));
  }

  EventLoop loop(options, trainer, &identity, context, socket, *link);
  if (!peers.empty()) loop.session().set_peers(std::move(peers));
  loop.session().set_data_sha256(std::move(data_sha256));
  if (options.share_label_counts) loop.session().set_label_counts(trainer.label_counts());
  if (options.require_secure) loop.session().set_require_secure(true);
  loop.session().set_min_corrupt_fraction(options.corrupt_fraction);
  loop.session().set_dp_noise_multiplier(options.dp_noise_multiplier);
  loop.session().set_dp_max_rounds(options.dp_max_rounds);
  if (!options.state_dir.empty()) {
    loop.session().set_state_dir(options.state_dir);
  } else {
    spdlog::info(
        "no --state-dir: distributed DP's ledger of noised rounds (and SCAFFOLD's control "
        "variate) live in this process only, and a restart forgets them");
  }
  if (!options.insecure && !options.coordinator_key.empty()) {
    // Names the run in distributed DP's ledger, with the run's name.
    COHORT_ASSIGN_OR_RETURN(crypto::Ed25519Public coordinator,
                            crypto::LoadPublicKey(options.coordinator_key));
    loop.session().set_coordinator_key(std::string(coordinator.begin(), coordinator.end()));
  }
  return loop.Run(stop);
}

Status RunClient(const ClientOptions& options, const std::atomic<bool>& stop) {
  KeepLargeBuffers();
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<LocalTrainer> trainer, NewNativeTrainer(options));
  return RunClient(options, *trainer, stop);
}

}  // namespace cohort::client
