#include "sim/simulator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "aggregation/secagg_stage.h"
#include "client/fault_filter.h"
#include "client/session.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/progress.h"
#include "common/rng.h"
#include "coordinator/open_run.h"
#include "coordinator/report.h"
#include "crypto/digest.h"
#include "crypto/keys.h"
#include "datasets/shard.h"
#include "datasets/split.h"
#include "proto/config_io.h"
#include "sim/executors.h"
#include "sim/mpi_executors.h"
#include "train/device.h"
#include "train/model_config.h"
#include "train/trainer.h"

namespace cohort::sim {
namespace {

using aggregation::SecAggStage;

// c's training samples per class.
std::vector<uint64_t> LabelCounts(const VirtualClient& c) {
  if (c.whole) return datasets::LabelCounts(*c.source);
  std::vector<uint64_t> counts(c.source->num_classes, 0);
  for (uint32_t row : c.rows) ++counts[c.source->labels[row]];
  return counts;
}

// The length of c's next spell, online or offline as c is now, in virtual
// ms: exponential, on average `availability` (online) or the rest of
// `period_ms`.
TimeMs SpellLength(VirtualClient& c, double availability, double period_ms) {
  const double mean = (c.online ? availability : 1 - availability) * period_ms;
  return std::max<TimeMs>(1, TimeMs(std::llround(-mean * std::log1p(-c.spells.UniformDouble()))));
}

// Every client-*.shard of `dir`, by name, with a fresh identity each.
StatusOr<std::vector<VirtualClient>> LoadClients(const std::string& dir) {
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto& path = entry.path();
    if (path.extension() == ".shard" && path.stem().string().rfind("client-", 0) == 0) {
      paths.push_back(path);
    }
  }
  if (ec) return InvalidArgumentError(dir + ": " + ec.message());
  if (paths.empty()) {
    return InvalidArgumentError(dir + ": no client-*.shard files (`cohort partition` writes them)");
  }
  std::sort(paths.begin(), paths.end());
  std::vector<VirtualClient> clients(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    clients[i].name = paths[i].stem().string();
    COHORT_ASSIGN_OR_RETURN(datasets::Dataset data, datasets::ReadShard(paths[i].string()));
    clients[i].source = std::make_shared<const datasets::Dataset>(std::move(data));
    COHORT_ASSIGN_OR_RETURN(clients[i].data_sha256, crypto::FileSha256Hex(paths[i].string()));
    COHORT_ASSIGN_OR_RETURN(clients[i].identity, crypto::GenerateEd25519());
  }
  return clients;
}

// The config's data.partition, split in memory as `cohort partition` would
// split it (the same names, rows and order); the test set, if any, into
// `test`. Clients left with no rows are skipped (they could not register).
StatusOr<std::vector<VirtualClient>> SplitClients(const config::PartitionConfig& p,
                                                  uint32_t clients_flag, datasets::Dataset* test,
                                                  bool* has_test) {
  datasets::SplitOptions o;
  o.format = p.format();
  o.train_images = p.train_images();
  o.train_labels = p.train_labels();
  o.test_images = p.test_images();
  o.test_labels = p.test_labels();
  o.samples = p.samples();
  o.test_samples = p.test_samples();
  o.features = p.features();
  o.classes = p.classes();
  o.clients = clients_flag != 0 ? clients_flag : p.clients();
  o.scheme = p.scheme();
  o.seed = p.seed();
  auto loaded = datasets::LoadAndSplit(o);
  if (!loaded.ok()) return loaded.status().WithContext("data.partition");
  datasets::Split split = std::move(*loaded);
  auto train = std::make_shared<const datasets::Dataset>(std::move(split.train));
  *test = std::move(split.test);
  *has_test = split.has_test;
  std::vector<VirtualClient> clients;
  clients.reserve(split.parts.size());
  for (size_t k = 0; k < split.parts.size(); ++k) {
    char name[32];
    std::snprintf(name, sizeof(name), "client-%03zu", k);
    if (split.parts[k].empty()) {
      spdlog::warn("{} has no samples in this split: left out", name);
      continue;
    }
    VirtualClient& c = clients.emplace_back();
    c.name = name;
    c.source = train;
    c.whole = false;
    c.rows = std::move(split.parts[k]);
    COHORT_ASSIGN_OR_RETURN(c.identity, crypto::GenerateEd25519());
  }
  return clients;
}

// The stage a client message belongs to, by its body (kNone for messages
// outside the protocol's stages).
SecAggStage StageOf(const wire::Header& h) {
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      return SecAggStage::kCommitSeed;
    case wire::Header::kSecaggKeys:
      return SecAggStage::kAdvertiseKeys;
    case wire::Header::kSecaggShares:
      return SecAggStage::kShareKeys;
    case wire::Header::kSecaggShareCheck:
      return SecAggStage::kCheckShares;
    case wire::Header::kSecaggConfirm:
      return SecAggStage::kConfirmChecked;
    case wire::Header::kUpdate:
      return SecAggStage::kMaskedInput;
    case wire::Header::kSecaggSignature:
      return SecAggStage::kConsistency;
    case wire::Header::kSecaggUnmask:
      return SecAggStage::kUnmasking;
    default:
      return SecAggStage::kNone;
  }
}

// The sessions' Env: the daemons' own, logging to the same sinks under the
// name "client" at warn and above: each session logs a few info lines per
// round, which would drown the coordinator's; its warnings and errors
// still show.
std::unique_ptr<Env> SessionsEnv() {
  const auto& sinks = spdlog::default_logger()->sinks();
  auto log = std::make_shared<spdlog::logger>("client", sinks.begin(), sinks.end());
  log->set_level(std::max(spdlog::default_logger()->level(), spdlog::level::warn));
  return std::make_unique<LogRedirectEnv>(Env::Default(), std::move(log));
}

// A secure-aggregation stage message, either way. With --latency-ms a
// stage's round trip is charged on the way back: what the coordinator
// sends arrives at once (so nothing overtakes anything: a secure task's
// SecAggStart still comes first), and the client's reply lands two link
// latencies later, on a queue ordered by arrival. Only the checked list
// waits its round trip on the way out, because the masked input it
// releases is model-sized: it then goes up at once, as a task's download
// and an update's upload are in the job's time. No model ever waits on the
// queue.
bool IsSecAgg(const wire::Header& h) {
  switch (h.body_case()) {
    case wire::Header::kSecaggStart:
    case wire::Header::kSecaggSeed:
    case wire::Header::kSecaggKeys:
    case wire::Header::kSecaggConfirm:
    case wire::Header::kSecaggShares:
    case wire::Header::kSecaggShareCheck:
    case wire::Header::kSecaggChecked:
    case wire::Header::kSecaggSurvivors:
    case wire::Header::kSecaggSignature:
    case wire::Header::kSecaggUnmaskRequest:
    case wire::Header::kSecaggUnmask:
      return true;
    default:
      return false;
  }
}

// The engine, the sessions and the executors wired together.
class Simulation {
 public:
  Simulation(const SimOptions& options, coordinator::OpenRun& run,
             coordinator::ProtocolEngine* engine, std::vector<VirtualClient>& clients,
             Executors& pool)
      : config_(options.config),
        dropout_(options.dropout),
        availability_(options.availability),
        period_ms_(options.availability_period_s * 1000),
        json_(options.json),
        sample_ms_(options.sample_ms),
        latency_ms_(options.latency_ms),
        store_(run.store.get()),
        engine_(engine),
        clients_(clients),
        pool_(pool),
        max_in_flight_(2 * pool.size()) {
    for (size_t i = 0; i < clients_.size(); ++i) {
      index_[clients_[i].name] = int(i);
      // Each virtual client is authenticated as itself, as CURVE and the
      // allowlist authenticate a daemon: the engine holds its Hello to that.
      senders_.push_back({clients_[i].name, clients_[i].identity.public_key});
    }
  }

  Status Run(const std::atomic<bool>& stop) {
    // A resumed FedBuff run's clock goes on from its schedule (0 otherwise).
    now_ = engine_->start_time();
    for (size_t i = 0; i < clients_.size(); ++i) {
      Apply(int(i), clients_[i].session->Start(now_));
    }
    while (!engine_->done()) {
      if (stop.load()) {
        CancelAll();
        return CancelledError("stopped after round " +
                              std::to_string(engine_->last_committed_round()));
      }
      if (!engine_->store_error().ok()) {
        CancelAll();
        return engine_->store_error();
      }
      if (!executors_error_.ok()) {
        CancelAll();
        return executors_error_;
      }
      if (!to_engine_.empty()) {
        auto [i, envelope] = std::move(to_engine_.front());
        to_engine_.pop_front();
        Deliver(engine_->OnMessage(clients_[i].name, envelope, now_, &senders_[i]));
      } else if (!wire_.empty() && wire_.begin()->first <= now_) {
        DeliverWire();
      } else if (!finished_.empty() && finished_.begin()->first <= now_) {
        // Due now: delivered before more tasks go out, so finished models
        // do not pile up (memory stays a few models).
        DeliverFinished();
      } else if (!held_.empty() && pool_.in_flight() < max_in_flight_) {
        // The held task due first: executors work in virtual order, so
        // finished results seldom wait for an earlier one still to come.
        Held h = std::move(held_.begin()->second);
        held_.erase(held_.begin());
        task_sent_ = h.sent;
        std::vector<coordinator::Outgoing> one;
        one.push_back(std::move(h.task));
        Deliver(std::move(one), /*released=*/true);
        task_sent_.reset();
      } else {
        COHORT_RETURN_IF_ERROR(Step());
      }
    }
    CancelAll();  // Stragglers still training: nobody needs their work now.
    return engine_->store_error();
  }

 private:
  // Nothing to do at this instant: the next event in virtual time. A job
  // due first (or one whose executor a held task waits for) is waited for
  // in wall time; a finished one is delivered when its due time comes;
  // otherwise the clock jumps to the next wakeup.
  Status Step() {
    const TimeMs kNever = std::numeric_limits<TimeMs>::max();
    TimeMs wakeup = engine_->NextWakeup().value_or(kNever);
    if (!wakeups_.empty()) wakeup = std::min(wakeup, wakeups_.begin()->first);
    const TimeMs running = pool_.earliest_due().value_or(kNever);
    const TimeMs waiting = held_.empty() ? kNever : held_.begin()->first;
    const TimeMs ready = finished_.empty() ? kNever : finished_.begin()->first;
    const TimeMs arriving = wire_.empty() ? kNever : wire_.begin()->first;
    // A finished job due before anything still to run or compute is
    // delivered at its time (the clock moves to it).
    if (ready != kNever && ready <= std::min({wakeup, running, waiting, arriving})) {
      DeliverFinished();
      return OkStatus();
    }
    if ((!held_.empty() && pool_.in_flight() > 0) ||
        (running != kNever && running <= std::min({wakeup, ready, arriving}))) {
      COHORT_ASSIGN_OR_RETURN(Finished f, pool_.Take());
      ++trained_;
      ShowProgress();
      const TimeMs due = f.due;
      finished_.emplace(due, std::move(f));
      return OkStatus();
    }
    if (arriving != kNever && arriving <= wakeup) {  // A message lands first.
      now_ = std::max(now_, arriving);
      DeliverWire();
      return OkStatus();
    }
    if (wakeup == kNever) {
      return InternalError("simulation stalled: nothing to do and nothing to wait for");
    }
    now_ = std::max(now_, wakeup);
    Deliver(engine_->OnTick(now_));
    // Only the sessions due act on a tick (the others' OnTick does nothing);
    // in index order, as a pass over all of them would.
    std::vector<int> due;
    for (auto it = wakeups_.begin(); it != wakeups_.end() && it->first <= now_; ++it) {
      due.push_back(it->second);
    }
    std::sort(due.begin(), due.end());
    for (int i : due) Apply(i, clients_[i].session->OnTick(now_));
    return OkStatus();
  }

  // The message on the simulated network that lands first (at its time).
  void DeliverWire() {
    auto node = wire_.extract(wire_.begin());
    now_ = std::max(now_, node.key());
    InFlight& m = node.mapped();
    if (!m.to_engine && !Online(m.client, now_)) return;  // Switched off meanwhile.
    if (m.to_engine) {
      Deliver(engine_->OnMessage(clients_[m.client].name, m.envelope, now_, &senders_[m.client]));
    } else {
      Apply(m.client, clients_[m.client].session->OnMessage(m.envelope, now_));
    }
  }

  // The earliest finished job, at its due time.
  void DeliverFinished() {
    Finished f = std::move(finished_.begin()->second);
    finished_.erase(finished_.begin());
    now_ = std::max(now_, f.due);
    Apply(f.client, clients_[f.client].session->OnTrainingDone(f.task_id, f.result, f.local, now_));
  }

  // Stops every job in flight (the pool waits for them as it goes).
  void CancelAll() {
    for (auto& c : clients_) {
      if (c.cancel) *c.cancel = true;
    }
  }

  // Whether client i is online at virtual time t (t never goes back).
  bool Online(int i, TimeMs t) {
    VirtualClient& c = clients_[i];
    while (t >= c.toggle_at) {
      c.online = !c.online;
      c.toggle_at += Spell(c);
      spdlog::debug("{}: {} at {:.1f} s (simulated)", c.name, c.online ? "online" : "offline",
                    t / 1000.0);
    }
    return c.online;
  }
  TimeMs Spell(VirtualClient& c) const { return SpellLength(c, availability_, period_ms_); }

  // One way across a client's link, in virtual milliseconds.
  TimeMs Latency(int i) const { return TimeMs(std::llround(clients_[i].latency_ms)); }

  // Virtual milliseconds from a task's sending to its update's arrival:
  // down, train, up.
  TimeMs JobTime(int i, uint32_t epochs) const {
    return TimeMs(std::llround(ComputeMs(i, epochs) + 2 * clients_[i].latency_ms));
  }
  // Virtual milliseconds of client i's training.
  double ComputeMs(int i, uint32_t epochs) const {
    return double(clients_[i].size()) * epochs * sample_ms_ * clients_[i].slowness;
  }

  // `released`: a held task, now handed out (the front of the line).
  void Deliver(std::vector<coordinator::Outgoing> out, bool released = false) {
    for (auto& o : out) {
      auto it = index_.find(o.peer);
      if (it == index_.end()) continue;
      if (!Online(it->second, now_)) continue;  // Switched off: nothing arrives.
      if (o.header.has_task() || o.header.has_secagg_start()) PlanDropout(it->second, o.header);
      if (o.header.has_task()) CountTask(it->second, o.header);
      if (o.header.has_task() && !released &&
          (!held_.empty() || pool_.in_flight() >= max_in_flight_)) {
        // Each task becomes a model copy in its client's job: hand tasks
        // out only as executors come free (memory: a few models, not one
        // per client of the round). They share the round's model until
        // then, and keep the virtual time they were sent at.
        const TimeMs due = now_ + JobTime(it->second, config_.train().local_epochs());
        held_.emplace(due, Held{now_, std::move(o)});
        continue;
      }
      net::Envelope e;
      e.header = std::move(o.header);
      if (o.payload) e.payloads.push_back(*o.payload);
      if (latency_ms_ > 0 && e.header.has_secagg_checked()) {
        // The checked list waits a round trip: the masked input it
        // releases then leaves at once (see IsSecAgg).
        wire_.emplace(now_ + 2 * Latency(it->second), InFlight{it->second, false, std::move(e)});
        continue;
      }
      Apply(it->second, clients_[it->second].session->OnMessage(e, now_));
    }
    for (const store::RoundRecord& r : engine_->TakeCommitted()) ShowRound(r);
  }

  // Called after every call into session i (all go through Apply): its
  // next wakeup, kept in wakeups_.
  void RefreshWakeup(int i) {
    if (wakeup_of_.empty()) wakeup_of_.assign(clients_.size(), std::nullopt);
    if (wakeup_of_[i]) wakeups_.erase({*wakeup_of_[i], i});
    wakeup_of_[i] = clients_[i].session->NextWakeup();
    wakeups_.emplace(*wakeup_of_[i], i);
  }

  void Apply(int i, client::Actions a) {
    RefreshWakeup(i);
    VirtualClient& c = clients_[i];
    for (auto& out : a.send) {
      // A client that dropped out sends nothing from its stage on.
      const SecAggStage stage = StageOf(out.header);
      if (c.drop_stage != SecAggStage::kNone && stage >= c.drop_stage) continue;
      if (!Online(i, now_)) continue;  // Switched off: nothing leaves.
      const bool delayed = latency_ms_ > 0 && IsSecAgg(out.header);
      net::Envelope e = client::AsEnvelope(std::move(out));
      if (delayed) {
        wire_.emplace(now_ + 2 * Latency(i), InFlight{i, true, std::move(e)});
        continue;
      }
      to_engine_.push_back({i, std::move(e)});
    }
    for (const auto& line : a.printed) std::printf("%s: %s\n", c.name.c_str(), line.c_str());
    if ((a.cancel_training || a.train) && c.cancel) *c.cancel = true;
    if (a.train) {
      c.cancel = std::make_shared<std::atomic<bool>>(false);
      const TimeMs due = task_sent_.value_or(now_) + JobTime(i, a.train->options.epochs);
      const double train_seconds = ComputeMs(i, a.train->options.epochs) / 1000.0;
      Status submitted = pool_.Submit({i, std::move(*a.train), c.cancel, due, train_seconds});
      if (executors_error_.ok()) executors_error_ = std::move(submitted);
    }
    if (a.exit && !a.exit->ok()) spdlog::warn("{}: {}", c.name, a.exit->ToString());
  }

  // On the first message of a round for client i: whether, and where, it
  // drops out in that round (from the seed, the round and its name).
  void PlanDropout(int i, const wire::Header& h) {
    const uint32_t round = h.has_task() ? h.task().round() : h.secagg_start().round();
    VirtualClient& c = clients_[i];
    if (dropout_ <= 0 || c.drop_round == round) return;
    c.drop_round = round;
    c.drop_stage = SecAggStage::kNone;
    Rng rng(DeriveSeed(config_.seed(), 0xd209 + uint64_t(round), Fnv1a64(c.name)));
    if (rng.UniformDouble() >= dropout_) return;
    const bool secure = config_.secagg().aggregation() != config::PLAIN;
    // A secure client drops before any stage but advertise_keys: that one
    // follows its commitment by one round trip, so a crash between them is
    // rare, and on a sparse graph it stops the whole round (the seed needs
    // every committed contribution; docs/architecture.md).
    constexpr int kStagesBut1 = static_cast<int>(aggregation::kSecAggStages.size()) - 1;
    const int pick = int(rng.UniformDouble() * kStagesBut1) % kStagesBut1;
    c.drop_stage =
        secure ? aggregation::kSecAggStages[pick == 0 ? 0 : pick + 1] : SecAggStage::kMaskedInput;
    spdlog::info("round {}: {} drops out before {} (simulated)", round, c.name,
                 aggregation::StageName(c.drop_stage));
  }

  // The live line (a terminal only): a bar of the clients trained of those
  // sent a task this round, their rate and what is left at that pace
  // (common/progress). Made at the round's first trained client, when every
  // task of the round has been counted.
  void ShowProgress() {
    if (json_ || selected_ == 0) return;
    if (!progress_) {
      ProgressOptions options;
      options.unit = "clients trained";
      // Off a terminal the round lines on stdout are the plain lines.
      if (Progress::AutoMode(stderr) != ProgressMode::kBar) options.mode = ProgressMode::kOff;
      options.min_interval_s = 0.25;
      options.clock = [env = display_env_] { return env->MonotonicSeconds(); };
      progress_ = std::make_unique<Progress>("round " + std::to_string(round_), selected_, stderr,
                                             std::move(options));
    }
    progress_->Update(std::min(trained_, selected_));
  }
  void CountTask(int i, const wire::Header& h) {
    if (h.task().round() != round_) {
      round_ = h.task().round();
      selected_ = trained_ = 0;
      counted_.clear();
      progress_.reset();
    }
    if (counted_.insert(i).second) ++selected_;
  }
  void ShowRound(const store::RoundRecord& r) {
    if (progress_ && r.round == round_) progress_->Finish();
    if (!json_) {
      coordinator::PrintRound(r, config_.rounds().num_rounds());
      if (sample_ms_ > 0 || latency_ms_ > 0) {
        std::printf("  simulated round time %.2fs\n", r.clock_seconds);
        std::fflush(stdout);
      }
      return;
    }
    auto clients = store_->ClientRounds(r.round);
    // clock_seconds: the round on the virtual clock, beside the wall time;
    // virtual_time_s: the virtual clock at its commit (FedBuff's groups
    // overlap, so their clock_seconds do not add up to it).
    std::string json = coordinator::RoundJson(
        r, clients.ok() ? *clients : std::vector<store::ClientRoundRecord>{});
    char at[64];
    std::snprintf(at, sizeof(at), ",\"virtual_time_s\":%.3f}", now_ / 1000.0);
    if (!json.empty() && json.back() == '}') json.replace(json.size() - 1, 1, at);
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
  }

  const config::RunConfig& config_;
  double dropout_;
  double availability_, period_ms_;
  bool json_;
  double sample_ms_, latency_ms_;
  // Training finished in wall time, waiting for its due virtual time.
  std::multimap<TimeMs, Finished> finished_;
  store::RunStore* store_;
  uint32_t round_ = 0;
  size_t selected_ = 0, trained_ = 0;
  std::set<int> counted_;
  std::unique_ptr<Progress> progress_;  // This round's live line, once it has one.
  // The live line's clock: real time, since it tells a person how long a
  // round takes on this machine; nothing it reads is stored or decides.
  Env* display_env_ = Env::Default();
  coordinator::ProtocolEngine* engine_;  // Synchronous rounds or FedBuff's groups.
  std::vector<VirtualClient>& clients_;
  std::vector<coordinator::AuthenticatedPeer> senders_;  // By client.
  // Every session's next wakeup, so that the earliest and the sessions due
  // cost O(log n) a step instead of a pass over every client.
  std::set<std::pair<TimeMs, int>> wakeups_;
  std::vector<std::optional<TimeMs>> wakeup_of_;
  Executors& pool_;
  Status executors_error_;            // The first job the executors could not take: ends the run.
  std::map<std::string, int> index_;  // By name: the engine's peer for each client.
  std::deque<std::pair<int, net::Envelope>> to_engine_;
  // Messages on the simulated network (with --latency-ms), by arrival time;
  // equal times keep their sending order.
  struct InFlight {
    int client;
    bool to_engine;
    net::Envelope envelope;
  };
  std::multimap<TimeMs, InFlight> wire_;
  // Tasks waiting for an executor, by the virtual time their update would
  // be due, with the time they were sent.
  struct Held {
    TimeMs sent;
    coordinator::Outgoing task;
  };
  std::multimap<TimeMs, Held> held_;
  std::optional<TimeMs> task_sent_;  // While a held task is handed out.
  size_t max_in_flight_;
  TimeMs now_ = 0;
};

// The clients of --shards, or of the config's data.partition split in
// memory (its test set into `test`).
StatusOr<std::vector<VirtualClient>> VirtualClients(const SimOptions& o, datasets::Dataset* test,
                                                    bool* in_memory_test) {
  if (!o.shards.empty()) return LoadClients(o.shards);
  if (o.config.data().has_partition()) {
    return SplitClients(o.config.data().partition(), o.clients, test, in_memory_test);
  }
  return InvalidArgumentError(
      "simulate: no clients: give --shards DIR, or a data.partition section in the config");
}

// A double as a person reads it: 1e-300, 0.25, 12.
std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

// The clients a round needs at once: rounds.start_clients and min_clients,
// and 3 for secure aggregation.
// With fedbuff, a group's fedbuff.buffer_size.
uint32_t NeededClients(const config::RunConfig& c) {
  const uint32_t group = c.has_fedbuff() ? c.fedbuff().buffer_size() : 0;
  return std::max<uint32_t>({c.rounds().start_clients(), c.rounds().min_clients(),
                             c.secagg().aggregation() != config::PLAIN ? 3u : 1u, group});
}

// Availability that cannot finish a run (--availability 1e-300 was
// accepted, and the simulation never ended): a round needs `needed`
// clients online at once, while on average clients x availability are;
// and online spells shorter than a second on average leave no time for
// a task's round trip.
Status CheckAvailability(const SimOptions& o, size_t clients, uint32_t needed) {
  // Finite and bounded, so no virtual time overflows.
  if (!(o.availability > 0 && o.availability <= 1 && o.availability_period_s >= 1 &&
        o.availability_period_s <= 1e7)) {
    return InvalidArgumentError(
        "simulate: --availability must be in (0, 1] and --availability-period-s in [1, 1e7]");
  }
  if (o.availability >= 1) return OkStatus();
  const double online = o.availability * double(clients);
  const double spell_s = o.availability * o.availability_period_s;
  const double floor = std::max(double(needed) / double(clients), 1.0 / o.availability_period_s);
  if (online < needed) {
    return InvalidArgumentError(
        "simulate: --availability " + Number(o.availability) + " cannot finish: on average " +
        Number(online) + " of the " + std::to_string(clients) +
        " clients would be online, and a round needs " + std::to_string(needed) +
        " at once (rounds.start_clients, min_clients); use at least " + Number(floor));
  }
  if (spell_s < 1) {
    return InvalidArgumentError("simulate: --availability " + Number(o.availability) +
                                " cannot finish: online spells would average " + Number(spell_s) +
                                " s of --availability-period-s " + Number(o.availability_period_s) +
                                ", under the 1 s a round trip needs; use at least " +
                                Number(floor) + " or a longer --availability-period-s");
  }
  return OkStatus();
}

// --fault-misbehave and --fault-misbehave-fraction: a known behaviour and a
// fraction, both or neither.
Status CheckMisbehave(const SimOptions& o) {
  if (!(o.misbehave_fraction >= 0 && o.misbehave_fraction <= 1)) {
    return InvalidArgumentError("simulate: --fault-misbehave-fraction must be in [0, 1]");
  }
  if (o.misbehave.empty() != (o.misbehave_fraction == 0)) {
    return InvalidArgumentError(
        "simulate: --fault-misbehave and --fault-misbehave-fraction go together (what the "
        "misbehaving clients do, and how many of them)");
  }
  if (!o.misbehave.empty() &&
      std::find(std::begin(client::kMisbehaviours), std::end(client::kMisbehaviours),
                o.misbehave) == std::end(client::kMisbehaviours)) {
    return InvalidArgumentError("simulate: --fault-misbehave: unknown behaviour \"" + o.misbehave +
                                "\"");
  }
  return OkStatus();
}

// Every option that depends on the clients, checked before the run
// directory is touched: a refused simulation leaves no run behind.
Status CheckSimOptions(const SimOptions& o, size_t clients) {
  const uint32_t needed = NeededClients(o.config);
  if (needed > clients) {
    return InvalidArgumentError("simulate: the config needs " + std::to_string(needed) +
                                " clients to start a round (rounds.start_clients, min_clients" +
                                (o.config.has_fedbuff() ? ", fedbuff.buffer_size), " : "), ") +
                                (o.shards.empty() ? std::string("the split") : o.shards) + " has " +
                                std::to_string(clients));
  }
  COHORT_RETURN_IF_ERROR(CheckAvailability(o, clients, needed));
  // Finite and bounded, so no virtual time overflows: an hour a sample, a
  // day a link, and spreads up to 10 (e^(10 x 5) is already absurd).
  if (!(o.sample_ms >= 0 && o.sample_ms <= 3.6e6 && o.speed_sigma >= 0 && o.speed_sigma <= 10 &&
        o.latency_ms >= 0 && o.latency_ms <= 8.64e7 && o.latency_sigma >= 0 &&
        o.latency_sigma <= 10)) {
    return InvalidArgumentError(
        "simulate: --sample-ms must be in [0, 3600000], --latency-ms in [0, 86400000], "
        "--speed-sigma and --latency-sigma in [0, 10]");
  }
  if (!(o.dropout >= 0 && o.dropout <= 1)) {
    return InvalidArgumentError("simulate: --dropout must be in [0, 1]");
  }
  if (o.dropout > 0 && o.config.has_fedbuff()) {
    return InvalidArgumentError(
        "simulate: --dropout draws each client's dropout per round, and fedbuff's groups are "
        "not rounds of the run; it is not simulated with fedbuff yet (stragglers, "
        "--speed-sigma, still drop out of their group at its deadline)");
  }
  return CheckMisbehave(o);
}

// The clients that play o.misbehave: round(fraction x n) of them, drawn
// from the seed.
std::set<size_t> Misbehaving(const SimOptions& o, size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(DeriveSeed(o.config.seed(), 0xbad, 0));
  rng.Shuffle(std::span<size_t>(order));
  const auto k = static_cast<size_t>(std::llround(o.misbehave_fraction * double(n)));
  return {order.begin(), order.begin() + static_cast<std::ptrdiff_t>(std::min(k, n))};
}

// Client c's draws from the seed (slowness, availability spells, link
// latency) and its session, which trains the run's own `model`.
Status SetUpClient(VirtualClient& c, const SimOptions& o, const train::Model& model,
                   client::FaultPlan plan, Env* sessions_env) {
  COHORT_RETURN_IF_ERROR(train::CheckCompatible(model, *c.source).WithContext(c.name));
  Rng rng(DeriveSeed(o.config.seed(), 0x5eed, Fnv1a64(c.name)));
  c.slowness = std::exp(o.speed_sigma * rng.Normal());
  if (o.availability < 1) {
    c.spells = Rng(DeriveSeed(o.config.seed(), 0xa7a1, Fnv1a64(c.name)));
    c.online = c.spells.UniformDouble() < o.availability;
    c.toggle_at = SpellLength(c, o.availability, o.availability_period_s * 1000);
  }
  Rng link(DeriveSeed(o.config.seed(), 0x1a7e, Fnv1a64(c.name)));
  // A client's link is at most a day, however far its draw.
  c.latency_ms = std::min(8.64e7, o.latency_ms * std::exp(o.latency_sigma * link.Normal()));
  if (o.sample_ms > 0 || o.latency_ms > 0) {
    const double ms =
        double(c.size()) * o.config.train().local_epochs() * o.sample_ms * c.slowness +
        2 * std::llround(c.latency_ms);
    spdlog::debug(
        "{}: slowness {:.3f}, latency {:.0f} ms, a task's round trip takes {:.0f} virtual ms",
        c.name, c.slowness, c.latency_ms, ms);
  }
  const uint64_t samples = c.size();
  c.session = std::make_unique<client::Session>(
      c.name, samples,
      [params = model.num_params()](const config::ModelConfig&) -> StatusOr<size_t> {
        return params;  // The run's own model: built and checked by the caller.
      },
      &c.identity, std::move(plan), client::InputObserver{}, sessions_env);
  c.session->set_data_sha256(c.data_sha256);
  // One host, no privacy boundary: every virtual client shares its label
  // counts, so the run report shows the split's label skew.
  c.session->set_label_counts(LabelCounts(c));
  return OkStatus();
}

// train.scaffold: the virtual clients' c_i live in the simulator's memory,
// so a resume would start them at zeros while the stored c counts their
// changes: refused.
Status CheckScaffoldResume(const SimOptions& o, const coordinator::ProtocolEngine& engine) {
  if (!o.config.train().scaffold() || engine.last_committed_round() == 0) return OkStatus();
  return FailedPreconditionError(
      "cohort simulate: " + o.run_dir + " holds " + std::to_string(engine.last_committed_round()) +
      " committed rounds of a train.scaffold run; the virtual clients' control variates were "
      "kept in memory only, so it cannot be resumed (start it in a new --run-dir)");
}

// "cpu,cuda:0": a device list as the log shows it.
std::string Join(const std::vector<std::string>& list) {
  std::string out;
  for (const auto& d : list) out += (out.empty() ? "" : ",") + d;
  return out;
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandDevices(const std::string& devices, std::string* note) {
  std::vector<std::string> list;
  for (size_t at = 0; at <= devices.size();) {
    const size_t comma = std::min(devices.find(',', at), devices.size());
    const std::string d = devices.substr(at, comma - at);
    at = comma + 1;
    const bool number = !d.empty() && d.size() <= 3 && std::all_of(d.begin(), d.end(), [](char ch) {
      return ch >= '0' && ch <= '9';
    });
    if (number && !list.empty() && list.back().rfind("cuda", 0) == 0) {
      list.push_back("cuda:" + d);  // "cuda:0,1": another GPU.
    } else if (d == "all") {
      // Every GPU that opens, from cuda:0 up.
      std::string why;
      for (int k = 0; k < 64; ++k) {
        auto gpu = train::NewBackend({.device = "cuda:" + std::to_string(k)});
        if (!gpu.ok()) {
          if (k == 0) why = gpu.status().message();
          break;
        }
        list.push_back("cuda:" + std::to_string(k));
      }
      if (!why.empty()) {
        list.push_back("cpu");
        if (note != nullptr) *note = "--devices all: " + why + "; training on the CPU";
      }
    } else if (d == "cpu" || d == "auto" || d == "cuda" || d.rfind("cuda:", 0) == 0) {
      list.push_back(d);
    } else {
      return InvalidArgumentError("--devices " + d +
                                  ": must be cpu, auto, all, cuda:N or a list such as cuda:0,1");
    }
  }
  return list;
}

namespace {

// What a simulation cannot run, before anything is read: the shards are
// not what is wrong.
Status CheckSimulated(const config::RunConfig& c) {
  if (c.mode() == config::DATA_PARALLEL) {
    return InvalidArgumentError(
        "simulate: mode: DATA_PARALLEL is not simulated (it runs under `cohort launch --nproc N` "
        "or `cohort worker`); `cohort simulate` runs federated configs");
  }
  if (c.model().has_external()) {
    return InvalidArgumentError(
        "simulate: model.external is not simulated: the clients bring that model (Python "
        "clients, cohort.Client); `cohort simulate` trains Cohort's own models");
  }
  if (c.rounds().federated_eval_every() > 0) {
    return InvalidArgumentError(
        "simulate: rounds.federated_eval_every is not simulated yet (the daemons' clients "
        "evaluate on their own test splits); set it to 0");
  }
  return OkStatus();
}

// --devices expanded and --executors (0: one per device) checked.
StatusOr<std::vector<std::string>> ExecutorDevices(SimOptions& o) {
  std::string note;
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> devices, ExpandDevices(o.devices, &note));
  if (!note.empty()) spdlog::info("{}", note);
  if (o.executors == 0) o.executors = static_cast<int>(devices.size());
  if (o.executors < 1 || o.executors > 1024) {
    return InvalidArgumentError("simulate: --executors must be in [1, 1024]");
  }
  return devices;
}

// What the executors of every rank must agree on: the model and each
// client's name and data (its shard's hash, or its rows of the split).
uint64_t ClientsDigest(const config::ModelConfig& model,
                       const std::vector<VirtualClient>& clients) {
  std::string text = model.SerializeAsString();
  for (const VirtualClient& c : clients) {
    text += c.name + '\0' + std::to_string(c.size()) + '\0' + c.data_sha256 + '\0';
    text.append(reinterpret_cast<const char*>(c.rows.data()), c.rows.size() * sizeof(uint32_t));
  }
  return Fnv1a64(text);
}

// The simulation on rank 0 (or in the only process, `ranks` null).
Status RunEngine(const SimOptions& o_in, MpiRanks* ranks, const std::atomic<bool>& stop) {
  SimOptions o = o_in;
  COHORT_RETURN_IF_ERROR(CheckSimulated(o.config));
  std::vector<std::string> devices;
  // Under MPI rank 0 trains nothing: the hosting ranks' devices are theirs.
  if (ranks == nullptr) {
    COHORT_ASSIGN_OR_RETURN(devices, ExecutorDevices(o));
  }
  // Before the clients: their sessions log through it to the end.
  const std::unique_ptr<Env> sessions_env = SessionsEnv();
  datasets::Dataset test;
  bool in_memory_test = false;
  COHORT_ASSIGN_OR_RETURN(std::vector<VirtualClient> clients,
                          VirtualClients(o, &test, &in_memory_test));
  COHORT_RETURN_IF_ERROR(CheckSimOptions(o, clients.size()));
  std::unique_ptr<Executors> executors;
  if (ranks != nullptr) {
    COHORT_ASSIGN_OR_RETURN(executors,
                            ranks->Hosts(ClientsDigest(o.config.model(), clients), clients.size()));
  }
  COHORT_ASSIGN_OR_RETURN(
      coordinator::OpenRun run,
      coordinator::OpenFederatedRun(o.config, o.run_dir, in_memory_test ? &test : nullptr,
                                    "cohort simulate"));
  coordinator::ProtocolEngine* engine = run.protocol();
  if (engine->done()) {
    spdlog::info("run already complete ({} rounds committed)", engine->last_committed_round());
    return OkStatus();
  }
  COHORT_RETURN_IF_ERROR(CheckScaffoldResume(o, *engine));
  const std::set<size_t> misbehaving = Misbehaving(o, clients.size());
  for (size_t i = 0; i < clients.size(); ++i) {
    client::FaultPlan plan;
    if (misbehaving.count(i) != 0) {
      plan.misbehave = o.misbehave;
      spdlog::warn("fault injection: {} plays {} in every round", clients[i].name, o.misbehave);
    }
    COHORT_RETURN_IF_ERROR(SetUpClient(clients[i], o, *run.model, plan, sessions_env.get()));
  }
  std::string where = "on " + Join(devices);
  if (ranks == nullptr) {
    COHORT_ASSIGN_OR_RETURN(executors,
                            ExecutorPool::Create(o.executors, devices, o.config.model(), &clients));
  } else {
    where = "on " + std::to_string(ranks->size() - 1) + " hosting ranks";
  }
  spdlog::info("simulating {} clients ({} executors {}), run {}, {} parameters{}", clients.size(),
               executors->size(), where, o.config.name(), run.model->num_params(),
               o.config.has_fedbuff() ? ", buffered asynchronous aggregation (fedbuff)" : "");
  Simulation simulation(o, run, engine, clients, *executors);
  return simulation.Run(stop);
}

// A hosting rank: the same clients' data, an executor pool, and rank 0's
// jobs until it says stop. Its set-up's error goes to rank 0, which ends
// the run with it.
Status HostJobs(const SimOptions& o_in, MpiRanks& ranks) {
  SimOptions o = o_in;
  std::vector<VirtualClient> clients;
  std::unique_ptr<ExecutorPool> pool;
  uint64_t digest = 0;
  const Status setup = [&]() -> Status {
    COHORT_RETURN_IF_ERROR(CheckSimulated(o.config));
    COHORT_ASSIGN_OR_RETURN(const std::vector<std::string> devices, ExecutorDevices(o));
    datasets::Dataset test;
    bool in_memory_test = false;
    COHORT_ASSIGN_OR_RETURN(clients, VirtualClients(o, &test, &in_memory_test));
    digest = ClientsDigest(o.config.model(), clients);
    COHORT_ASSIGN_OR_RETURN(pool,
                            ExecutorPool::Create(o.executors, devices, o.config.model(), &clients));
    spdlog::info("rank {} of {}: {} executors on {} for {} clients", ranks.rank(), ranks.size(),
                 pool->size(), Join(devices), clients.size());
    return OkStatus();
  }();
  if (!setup.ok()) spdlog::error("rank {}: {}", ranks.rank(), setup.message());
  return ranks.Serve(setup, digest, clients.size(), pool.get());
}

// The integer in environment variable `name`, or 0 when unset.
StatusOr<int> EnvCount(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1 || n > 1000000) {
    return InvalidArgumentError(std::string(name) + "=" + v + ": not a number of ranks");
  }
  return static_cast<int>(n);
}

}  // namespace

StatusOr<int> LauncherWorldSize(std::string* source) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    COHORT_ASSIGN_OR_RETURN(const int n, EnvCount(name));
    if (n == 0) continue;
    *source = name;
    return n;
  }
  if (std::getenv("PMIX_RANK") != nullptr) {
    COHORT_ASSIGN_OR_RETURN(const int n, EnvCount("SLURM_STEP_NUM_TASKS"));
    if (n != 0) {
      *source = "SLURM_STEP_NUM_TASKS";
      return n;
    }
  }
  return 1;
}

Status RunSimulation(const SimOptions& o, const std::atomic<bool>& stop) {
  std::string source;
  COHORT_ASSIGN_OR_RETURN(const int world, LauncherWorldSize(&source));
  if (world == 1) return RunEngine(o, nullptr, stop);
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<MpiRanks> ranks, MpiRanks::Join(world, source));
  if (ranks->rank() != 0) return HostJobs(o, *ranks);
  return RunEngine(o, ranks.get(), stop);
}

}  // namespace cohort::sim
