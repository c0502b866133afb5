#include "worker/worker.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "collective/collective.h"
#include "common/clock.h"
#include "common/progress.h"
#include "common/rng.h"
#include "crypto/digest.h"
#include "datasets/shard.h"
#include "net/group.h"
#include "proto/config_io.h"
#include "store/run_dir_lock.h"
#include "store/run_store.h"
#include "train/device.h"
#include "train/dp_step.h"
#include "train/model_config.h"
#include "train/trainer.h"
#include "worker/metrics.h"

namespace cohort::worker {
namespace {

// The integer in environment variable `name`, or -1 when unset.
StatusOr<int> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 1000000) {
    return InvalidArgumentError(std::string(name) + "=" + v + ": not a rank or size");
  }
  return static_cast<int>(n);
}

std::string EnvString(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

std::string FirstSlurmHost(const std::string& nodelist) {
  // "a[01-04,07],b" -> "a01"; "a,b" -> "a"; "a" -> "a".
  const size_t comma = nodelist.find(',');
  const size_t bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return nodelist.substr(0, comma);
  }
  const size_t end = nodelist.find_first_of("-,]", bracket + 1);
  if (end == std::string::npos) return "";
  return nodelist.substr(0, bracket) + nodelist.substr(bracket + 1, end - bracket - 1);
}

Status ResolveRank(WorkerOptions& o) {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (o.rank >= 0) break;
    COHORT_ASSIGN_OR_RETURN(o.rank, EnvInt(name));
  }
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    if (o.world_size >= 0) break;
    COHORT_ASSIGN_OR_RETURN(o.world_size, EnvInt(name));
  }
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (o.local_rank >= 0) break;
    COHORT_ASSIGN_OR_RETURN(o.local_rank, EnvInt(name));
  }
  const std::string port = EnvString("MASTER_PORT").empty() ? "29500" : EnvString("MASTER_PORT");
  if (o.master.empty() && !EnvString("MASTER_ADDR").empty()) {
    o.master = "tcp://" + EnvString("MASTER_ADDR") + ":" + port;
  }
  // Slurm: rank 0 runs on the first host of the job's node list.
  if (o.master.empty() && !EnvString("SLURM_NODELIST").empty()) {
    const std::string host = FirstSlurmHost(EnvString("SLURM_NODELIST"));
    if (host.empty()) {
      return InvalidArgumentError("SLURM_NODELIST=" + EnvString("SLURM_NODELIST").substr(0, 80) +
                                  ": no first host in it");
    }
    o.master = "tcp://" + host + ":" + port;
  }
  if (o.rank < 0 || o.world_size < 1) {
    return InvalidArgumentError(
        "worker: no rank or world size (--rank/--world-size, or RANK/WORLD_SIZE, "
        "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS)");
  }
  if (o.rank >= o.world_size) {
    return InvalidArgumentError("worker: rank " + std::to_string(o.rank) + " of a world of " +
                                std::to_string(o.world_size));
  }
  if (o.master.empty() && o.world_size > 1 && o.transport != "mpi") {
    return InvalidArgumentError("worker: no rendezvous address (--master, or MASTER_ADDR)");
  }
  return OkStatus();
}

namespace {

// One rank's state for the whole run.
struct Rank {
  config::RunConfig config;
  int rank = 0, world = 1;
  Env* env = nullptr;  // Its clock times the epochs.
  std::unique_ptr<train::Backend> backend;
  std::unique_ptr<train::Model> model;
  std::unique_ptr<train::DeviceDataset> train_data, test_data;
  std::unique_ptr<store::RunDirLock> lock;  // Rank 0 only: the run directory's.
  std::unique_ptr<store::RunStore> store;   // Rank 0 only.
  collective::Communicator* comm = nullptr;
  collective::CollectiveOptions collective;
  // The gradients' all-reduce: `collective`, travelling as
  // data_parallel.gradient_dtype (models, metrics and checks stay float32).
  collective::CollectiveOptions gradients;
  // The backend sums the gradients on the device (NCCL).
  bool device_collectives = false;
  // Synchronous SGD's step (and local SGD's local steps); owned by RunWorker.
  train::DataParallelStep* step = nullptr;
  int64_t fault_kill_step = -1, fault_perturb_step = -1;  // Testing.
  std::vector<std::string> devices;                       // Every rank's backend (RankDevices).
  std::optional<WorkerMetrics> metrics;                   // With --metrics-addr.
};

// What a run starts from: rank 0's last checkpoint, or a fresh model.
struct Start {
  uint32_t epoch = 0;        // The last epoch done.
  std::vector<float> state;  // The optimizer's (Optimizer::SaveState); may be empty.
  uint64_t optimizer_steps = 0;
};

// Rank 0 reads the start from the run store (or creates the run); every rank
// gets it by broadcast: the model into `params`.
StatusOr<Start> StartModel(Rank& r, const std::string& run_dir, std::vector<float>& params) {
  Start out;
  // What rank 0 found in the store, sent to every rank as its bytes.
  struct Header {
    uint64_t epoch = 0;
    uint64_t state_models = 0;  // The optimizer state's length in model sizes (0, 1 or 2).
    uint64_t optimizer_steps = 0;
  } start;
  if (r.rank == 0) {
    COHORT_ASSIGN_OR_RETURN(r.lock, store::RunDirLock::Acquire(run_dir, "cohort worker rank 0"));
    COHORT_ASSIGN_OR_RETURN(r.store, store::OpenSqliteRunStore(run_dir + "/run.db"));
    COHORT_ASSIGN_OR_RETURN(std::optional<store::RunInfo> info, r.store->LoadRun());
    if (info) {
      // A restarted group, or a longer run (more epochs): never another model,
      // optimizer, data or seed on top of this run's checkpoints.
      COHORT_RETURN_IF_ERROR(
          config::CheckResumable(info->config_text, r.config).WithContext(run_dir));
      COHORT_ASSIGN_OR_RETURN(store::Checkpoint cp, r.store->LatestCheckpoint());
      if (cp.model.size() != params.size()) {
        return FailedPreconditionError(
            run_dir + ": the stored model has " + std::to_string(cp.model.size()) +
            " parameters, this config's " + std::to_string(params.size()));
      }
      params = cp.model;
      out.state = std::move(cp.velocity);
      start.epoch = cp.round;
      start.state_models = out.state.size() / params.size();
      start.optimizer_steps = cp.optimizer_steps;
      spdlog::info("resuming after epoch {}", cp.round);
    } else {
      r.model->Init(params, r.config.seed());
      const std::string config_text = config::ToText(r.config);
      std::string devices;
      for (const std::string& d : r.devices) devices += (devices.empty() ? "" : "; ") + d;
      store::RunInfo created{config_text,
                             r.config.seed(),
                             COHORT_VERSION,
                             0,
                             crypto::Sha256Hex(config_text),
                             static_cast<uint32_t>(r.world),
                             devices};
      COHORT_RETURN_IF_ERROR(r.store->CreateRun(created, {0, params, {}}));
    }
  }
  COHORT_RETURN_IF_ERROR(r.comm->Broadcast(params, 0, r.collective));
  COHORT_RETURN_IF_ERROR(r.comm->BroadcastBytesOf(std::span<Header>(&start, 1), 0, r.collective));
  out.epoch = static_cast<uint32_t>(start.epoch);
  out.optimizer_steps = start.optimizer_steps;
  if (start.state_models != 0) {
    out.state.resize(start.state_models * params.size());
    COHORT_RETURN_IF_ERROR(r.comm->Broadcast(out.state, 0, r.collective));
  }
  return out;
}

struct EpochResult {
  double loss = 0, accuracy = 0, seconds = 0;
  uint64_t steps = 0;
  // This rank's: its samples, and its seconds waiting on the other ranks'
  // sums (gradients, or local SGD's model averages).
  uint64_t samples = 0;
  double comm_seconds = 0;
  std::vector<store::RankRecord> ranks;  // Every rank's, after GatherRanks.
};

// What an epoch's steps use: the epoch's sample order and the summed loss
// and correct count, on the backend.
struct EpochState {
  train::DeviceArray<uint32_t> order;
  train::DeviceArray<double> stats;
};

bool AllFinite(std::span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// What every rank returns when `ranks` (train::FlaggedRanks) sent `what`
// with a value that is not finite.
Status NonFiniteError(const std::string& ranks, const std::string& what) {
  return DataLossError("rank(s) " + ranks + " sent " + what +
                       " that is not finite (NaN or infinity); the run stops before committing "
                       "this epoch (the epochs committed before are kept)");
}

StatusOr<EpochState> PrepareEpoch(Rank& r, uint32_t epoch) {
  train::Backend* b = r.backend.get();
  const size_t n = r.train_data->size();
  // The same permutation on every rank, from the seed.
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  Rng rng(DeriveSeed(r.config.seed(), 0xd9, epoch));
  rng.Shuffle(std::span<uint32_t>(order));
  EpochState e;
  COHORT_ASSIGN_OR_RETURN(e.order, train::DeviceArray<uint32_t>::Create(b, n));
  COHORT_ASSIGN_OR_RETURN(e.stats, train::DeviceArray<double>::Create(b, 2));
  b->Upload(e.order.data(), order.data(), e.order.bytes());
  b->Zero(e.stats.data(), e.stats.bytes());
  return e;
}

// This rank's part [lo, hi) of a global batch of `count` samples: rank r
// takes the r-th of `world` contiguous parts.
std::pair<size_t, size_t> Part(const Rank& r, size_t begin, size_t count) {
  return {begin + count * r.rank / r.world, begin + count * (r.rank + 1) / r.world};
}

// One synchronous SGD step (train::DataParallelStep): every rank's
// gradient, weighted by its share of the global batch before the sum,
// all-reduced; every rank applies the same step, so the replicas stay
// identical.
Status SyncStep(Rank& r, EpochState& e, train::Optimizer& optimizer, size_t begin, size_t count,
                uint64_t global_step, EpochResult& result) {
  const auto [lo, hi] = Part(r, begin, count);
  COHORT_ASSIGN_OR_RETURN(train::StepReport step,
                          r.step->Step(e.order.data(), lo, hi, count, optimizer, e.stats.data()));
  result.samples += hi - lo;
  result.comm_seconds += step.comm_seconds;
  if (!step.non_finite_ranks.empty()) return NonFiniteError(step.non_finite_ranks, "a gradient");
  if (step.saturated > 0) {
    spdlog::warn("exact all-reduce: {} gradient values were out of range at step {}",
                 step.saturated, global_step);
  }
  return OkStatus();
}

// Local SGD: every rank's model, and with `with_state` its optimizer state
// (momentum, or Adam's moments), replaced by the mean over the ranks.
Status AverageModel(Rank& r, train::Optimizer& optimizer, bool with_state) {
  const size_t np = r.model->num_params();
  // The model, then the count of ranks whose model is not finite.
  std::vector<float> params(np + 1);
  const std::span<float> model = std::span<float>(params).first(np);
  COHORT_RETURN_IF_ERROR(r.model->GetParams(model));
  const bool not_finite = !AllFinite(model);
  params[np] = not_finite ? 1.0f : 0.0f;
  COHORT_RETURN_IF_ERROR(r.comm->AllReduce(params, r.collective));
  if (params[np] != 0.0f) {
    COHORT_ASSIGN_OR_RETURN(std::string ranks,
                            train::FlaggedRanks(*r.comm, not_finite, r.collective));
    return NonFiniteError(ranks, "a model");
  }
  const float inv = 1.0f / float(r.world);
  for (float& p : model) p *= inv;
  COHORT_RETURN_IF_ERROR(r.model->SetParams(model));
  if (!with_state) return OkStatus();
  COHORT_ASSIGN_OR_RETURN(std::vector<float> buffer, optimizer.SaveState());
  if (buffer.empty()) return OkStatus();
  COHORT_RETURN_IF_ERROR(r.comm->AllReduce(buffer, r.collective));
  for (float& m : buffer) m *= inv;
  return optimizer.RestoreState(buffer, optimizer.steps());
}

// One epoch: synchronous SGD over global batches of batch_size x world x
// accumulation_steps, or local SGD averaging every local_sgd_steps steps
// (and at the epoch's end, so every rank ends the epoch with one model).
// Debug mode: every rank hashes its model and compares with rank 0's hash;
// kDataLoss names the ranks whose model differs.
Status CheckReplicas(Rank& r, uint64_t step) {
  std::vector<float> params(r.model->num_params());
  COHORT_RETURN_IF_ERROR(r.model->GetParams(params));
  const auto hash = crypto::Hash256(
      {std::span(reinterpret_cast<const uint8_t*>(params.data()), params.size() * 4)});
  // Rank 0's hash, as its bytes.
  auto reference = hash;
  COHORT_RETURN_IF_ERROR(
      r.comm->BroadcastBytesOf(std::span(reference.data(), reference.size()), 0, r.collective));
  COHORT_ASSIGN_OR_RETURN(std::string ranks,
                          train::FlaggedRanks(*r.comm, reference != hash, r.collective));
  if (ranks.empty()) return OkStatus();
  return DataLossError("replicas diverged by step " + std::to_string(step) + ": rank(s) " + ranks +
                       " hold a model other than rank 0's");
}

// Testing: the faults --fault-kill-at-step and --fault-perturb-at-step.
Status InjectFaults(Rank& r, uint64_t step, bool after) {
  if (!after && r.fault_kill_step >= 0 && step == uint64_t(r.fault_kill_step)) {
    std::fprintf(stderr, "fault injection: rank %d kills itself (SIGKILL) before step %lu\n",
                 r.rank, static_cast<unsigned long>(step));
    kill(getpid(), SIGKILL);
  }
  if (after && r.fault_perturb_step >= 0 && step == uint64_t(r.fault_perturb_step)) {
    std::vector<float> params(r.model->num_params());
    COHORT_RETURN_IF_ERROR(r.model->GetParams(params));
    params[0] += 1e-3f;
    return r.model->SetParams(params);
  }
  return OkStatus();
}

// "step 3 of 126": the step that starts at sample `begin` of the epoch's n.
std::string StepOfEpoch(size_t begin, size_t global_batch, size_t n) {
  return "step " + std::to_string(begin / global_batch + 1) + " of " +
         std::to_string((n + global_batch - 1) / global_batch);
}

StatusOr<EpochResult> TrainEpoch(Rank& r, uint32_t epoch, train::Optimizer& optimizer,
                                 uint64_t& global_step) {
  const double start = r.env->MonotonicSeconds();
  COHORT_ASSIGN_OR_RETURN(EpochState e, PrepareEpoch(r, epoch));
  const config::DataParallelConfig& dp = r.config.data_parallel();
  const size_t n = r.train_data->size();
  const size_t global_batch = r.config.train().batch_size() * r.world * dp.accumulation_steps();
  EpochResult result;
  // Rank 0 shows the epoch's progress over the whole data set.
  Progress progress("epoch " + std::to_string(epoch), n, stderr,
                    {.unit = "samples",
                     .mode = r.rank == 0 ? ProgressMode::kAuto : ProgressMode::kOff,
                     .line_percent_step = 100,
                     .clock = {}});
  for (size_t begin = 0; begin < n; begin += global_batch, ++global_step, ++result.steps) {
    progress.Update(begin);
    COHORT_RETURN_IF_ERROR(InjectFaults(r, global_step, /*after=*/false));
    const size_t count = std::min(global_batch, n - begin);
    const uint32_t check = dp.check_replicas_every();
    if (dp.local_sgd_steps() == 0) {
      if (Status s = SyncStep(r, e, optimizer, begin, count, global_step, result); !s.ok()) {
        return s.WithContext(StepOfEpoch(begin, global_batch, n));
      }
      COHORT_RETURN_IF_ERROR(InjectFaults(r, global_step, /*after=*/true));
      if (check > 0 && (global_step + 1) % check == 0) {
        COHORT_RETURN_IF_ERROR(CheckReplicas(r, global_step));
      }
      continue;
    }
    const auto [lo, hi] = Part(r, begin, count);
    COHORT_RETURN_IF_ERROR(r.step->LocalStep(e.order.data(), lo, hi, optimizer, e.stats.data()));
    result.samples += hi - lo;
    const bool last = begin + count >= n;
    COHORT_RETURN_IF_ERROR(InjectFaults(r, global_step, /*after=*/true));
    if (last || (result.steps + 1) % dp.local_sgd_steps() == 0) {
      const double averaging = r.env->MonotonicSeconds();
      if (Status s = AverageModel(r, optimizer, last); !s.ok()) {
        return s.WithContext(StepOfEpoch(begin, global_batch, n));
      }
      result.comm_seconds += r.env->MonotonicSeconds() - averaging;
      if (check > 0) COHORT_RETURN_IF_ERROR(CheckReplicas(r, global_step));
    }
  }
  progress.Finish();
  double local[2];
  r.backend->Download(local, e.stats.data(), sizeof(local));
  COHORT_RETURN_IF_ERROR(r.backend->Sync());
  std::vector<float> totals = {float(local[0]), float(local[1])};
  COHORT_RETURN_IF_ERROR(r.comm->AllReduce(totals, r.collective));
  result.loss = n > 0 ? totals[0] / n : 0;
  result.accuracy = n > 0 ? totals[1] / n : 0;
  // The paths that check nothing per step (one rank, device collectives):
  // the same sums on every rank, so every rank stops here, before a commit.
  if (!std::isfinite(result.loss)) {
    return DataLossError("epoch " + std::to_string(epoch) +
                         ": the training loss is not finite (NaN or infinity); the run stops "
                         "before committing it (the epochs committed before are kept)");
  }
  result.seconds = r.env->MonotonicSeconds() - start;
  return result;
}

// Rank 0: evaluates, prints the epoch and commits it with the model and the
// optimizer's state (the checkpoint's velocity) and step count. `next_step`
// is the next epoch's first step (a kill before it comes before the store).
Status CommitEpoch(Rank& r, uint32_t epoch, const EpochResult& e, std::span<const float> params,
                   const train::Optimizer& optimizer, uint64_t next_step) {
  store::RoundRecord rec;
  rec.round = epoch;
  rec.participants = rec.selected = static_cast<uint32_t>(r.world);
  rec.train_loss = e.loss;
  rec.seconds = e.seconds;
  rec.ranks = e.ranks;
  const config::DataParallelConfig& dp = r.config.data_parallel();
  rec.aggregation = dp.local_sgd_steps() > 0 ? "local SGD, model average every " +
                                                   std::to_string(dp.local_sgd_steps()) + " step(s)"
                                             : "all-reduce";
  if (r.collective.exact) rec.aggregation += " (exact)";
  if (r.device_collectives) rec.aggregation += " on the device";
  if (r.gradients.wire == collective::WireType::kBf16) rec.aggregation += " (bfloat16)";
  if (r.gradients.wire == collective::WireType::kFp16) rec.aggregation += " (float16)";
  if (dp.accumulation_steps() > 1) {
    rec.aggregation += ", " + std::to_string(dp.accumulation_steps()) + " micro-batches a step";
  }
  if (r.test_data) {
    COHORT_ASSIGN_OR_RETURN(train::EvalResult t, train::Evaluate(*r.model, params, *r.test_data));
    rec.test_accuracy = t.accuracy;
    rec.test_loss = t.loss;
  }
  std::printf(
      "epoch %3u/%u  workers %d  steps %lu  train_loss %.4f  train_acc %.4f  test_acc %.4f  "
      "%.2fs\n",
      epoch, r.config.data_parallel().epochs(), r.world, static_cast<unsigned long>(e.steps),
      e.loss, e.accuracy, rec.test_accuracy, e.seconds);
  std::fflush(stdout);
  COHORT_ASSIGN_OR_RETURN(std::vector<float> state, optimizer.SaveState());
  store::Checkpoint cp{epoch, {params.begin(), params.end()}, std::move(state), optimizer.steps()};
  COHORT_RETURN_IF_ERROR(InjectFaults(r, next_step, /*after=*/false));
  return r.store->CommitRound(rec, {}, cp, 3);
}

// Each rank's words in `mine` (`width` of them), every rank's in rank
// order: an integer all-reduce of slots that only their owner fills.
StatusOr<std::vector<int64_t>> AllGather(Rank& r, std::span<const int64_t> mine) {
  const size_t width = mine.size();
  std::vector<int64_t> all(width * r.world, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + width * r.rank);
  COHORT_RETURN_IF_ERROR(r.comm->AllReduce(std::span<int64_t>(all), r.collective));
  return all;
}

// Lineage: every rank's backend name (its first 64 bytes).
StatusOr<std::vector<std::string>> RankDevices(Rank& r) {
  constexpr size_t kWords = 8;
  std::array<int64_t, kWords> mine{};
  const std::string name = r.backend->Name().substr(0, kWords * sizeof(int64_t));
  std::memcpy(mine.data(), name.data(), name.size());
  COHORT_ASSIGN_OR_RETURN(std::vector<int64_t> all, AllGather(r, mine));
  std::vector<std::string> out(r.world);
  for (int i = 0; i < r.world; ++i) {
    const char* bytes = reinterpret_cast<const char*>(all.data() + i * kWords);
    out[i].assign(bytes, strnlen(bytes, kWords * sizeof(int64_t)));
  }
  return out;
}

// Every rank's share of the epoch (timings in microseconds on the wire):
// its steps, samples, compute and communication seconds.
StatusOr<std::vector<store::RankRecord>> GatherRanks(Rank& r, const EpochResult& e) {
  auto micros = [](double s) { return static_cast<int64_t>(std::llround(s * 1e6)); };
  const int64_t mine[] = {static_cast<int64_t>(e.steps), static_cast<int64_t>(e.samples),
                          micros(e.seconds - e.comm_seconds), micros(e.comm_seconds),
                          micros(e.seconds)};
  COHORT_ASSIGN_OR_RETURN(std::vector<int64_t> all, AllGather(r, mine));
  std::vector<store::RankRecord> out(r.world);
  for (int i = 0; i < r.world; ++i) {
    const int64_t* v = all.data() + i * std::size(mine);
    out[i] = {static_cast<uint32_t>(i),
              static_cast<uint64_t>(v[0]),
              static_cast<uint64_t>(v[1]),
              v[2] / 1e6,
              v[3] / 1e6,
              v[4] / 1e6,
              r.devices[i]};
  }
  return out;
}

// The longest config text rank 0 may send.
constexpr size_t kMaxConfigBytes = size_t{1} << 24;

// Every rank trains rank 0's configuration. Rank 0's is checked against the
// run's stored one (StartModel); here rank 0 sends its config's text and
// every other rank compares its own with it as a resumed coordinator does
// (config::CheckResumable, which names the fields that differ), and with its
// epoch count. Every rank returns the same verdict: kFailedPrecondition
// naming the ranks whose config differs (and, on those, the fields).
Status AgreeOnConfig(Rank& r) {
  if (r.world == 1) return OkStatus();
  // Rank 0's config text and epoch count, as their bytes.
  std::vector<uint8_t> text;
  uint64_t epochs = r.config.data_parallel().epochs();
  if (r.rank == 0) {
    const std::string ours = config::ToText(r.config);
    text.assign(ours.begin(), ours.end());
  }
  COHORT_RETURN_IF_ERROR(r.comm->BroadcastSized(text, 0, kMaxConfigBytes, r.collective)
                             .WithContext("rank 0's config"));
  COHORT_RETURN_IF_ERROR(r.comm->BroadcastBytesOf(std::span(&epochs, 1), 0, r.collective));
  Status mine;
  if (r.rank != 0) {
    mine = config::CheckResumable(std::string(text.begin(), text.end()), r.config);
    if (mine.ok() && epochs != r.config.data_parallel().epochs()) {
      mine = FailedPreconditionError(
          "data_parallel.epochs: " + std::to_string(r.config.data_parallel().epochs()) + " here, " +
          std::to_string(epochs) + " on rank 0");
    }
  }
  COHORT_ASSIGN_OR_RETURN(std::string ranks,
                          train::FlaggedRanks(*r.comm, !mine.ok(), r.collective));
  if (!mine.ok()) {
    return mine.WithContext("rank " + std::to_string(r.rank) +
                            ": this rank's config is not rank 0's (the run's)");
  }
  if (ranks.empty()) return OkStatus();
  return FailedPreconditionError("rank(s) " + ranks +
                                 " run with a config other than rank 0's (the run's); their logs "
                                 "name the fields that differ");
}

// What the others hear from rank 0 while it commits an epoch (summed with
// their kCommitting).
constexpr int64_t kCommitting = 0, kCommitted = 1, kCommitFailed = 2;

// The epoch's end: rank 0 runs `commit` (evaluation and the store, which may
// take longer than a collective's deadline) while the others wait. So that
// no rank waits longer than data_parallel.timeout_s for a peer that is gone,
// a thread of rank 0 all-reduces a beat with the others every quarter of
// that deadline while it commits (kCommitting), then says how the commit
// ended. A rank that does not arrive for a beat is an error naming it on
// every other rank, within the deadline; a commit that finishes is kept.
Status EpochBarrier(Rank& r, uint32_t epoch, const std::function<Status()>& commit) {
  const std::string where = "epoch " + std::to_string(epoch);
  if (r.world == 1) return commit();
  if (r.rank != 0) {
    for (;;) {
      int64_t beat = kCommitting;
      COHORT_RETURN_IF_ERROR(r.comm->AllReduce(std::span(&beat, 1), r.collective)
                                 .WithContext(where + ": waiting for rank 0 to commit it"));
      if (beat == kCommitted) return OkStatus();
      if (beat != kCommitting) {
        return UnavailableError(where + ": rank 0 could not commit it (its log says why)");
      }
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status committed, beats;
  // The communicator is this thread's alone until it is joined.
  std::thread beater([&] {
    const auto period = std::chrono::milliseconds(std::max<TimeMs>(r.collective.timeout_ms / 4, 1));
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait_for(lock, period, [&] { return done; });
      const bool last = done;
      int64_t beat = !last ? kCommitting : committed.ok() ? kCommitted : kCommitFailed;
      lock.unlock();
      beats = r.comm->AllReduce(std::span(&beat, 1), r.collective);
      lock.lock();
      if (last || !beats.ok()) return;
    }
  });
  Status s = commit();
  {
    std::lock_guard<std::mutex> lock(mu);
    committed = s;
    done = true;
  }
  cv.notify_one();
  beater.join();
  COHORT_RETURN_IF_ERROR(s);
  return beats.WithContext(where + ": committed, but a rank did not wait for it");
}

Status Load(Rank& r, const WorkerOptions& o) {
  COHORT_ASSIGN_OR_RETURN(r.config, config::LoadRunConfig(o.config));
  if (r.config.mode() != config::DATA_PARALLEL) {
    return InvalidArgumentError(o.config +
                                ": mode is not DATA_PARALLEL (cohort worker trains "
                                "data-parallel runs; federated runs use cohort coordinator)");
  }
  std::string note;
  COHORT_ASSIGN_OR_RETURN(
      r.backend, train::NewBackend({.device = o.device, .local_rank = o.local_rank}, &note));
  if (!note.empty()) spdlog::info("{}", note);
  COHORT_ASSIGN_OR_RETURN(r.model, train::BuildModel(r.config.model(), r.backend.get()));
  const std::string& train_path = r.config.data().train_shard();
  COHORT_ASSIGN_OR_RETURN(datasets::Dataset train, datasets::ReadShard(train_path));
  COHORT_RETURN_IF_ERROR(train::CheckCompatible(*r.model, train).WithContext(train_path));
  COHORT_ASSIGN_OR_RETURN(r.train_data, train::DeviceDataset::Upload(r.backend.get(), train));
  const std::string& test_path = r.config.data().test_shard();
  if (r.rank == 0 && !test_path.empty()) {
    COHORT_ASSIGN_OR_RETURN(datasets::Dataset test, datasets::ReadShard(test_path));
    COHORT_RETURN_IF_ERROR(train::CheckCompatible(*r.model, test).WithContext(test_path));
    COHORT_ASSIGN_OR_RETURN(r.test_data, train::DeviceDataset::Upload(r.backend.get(), test));
  }
  r.collective.exact = r.config.data_parallel().exact();
  r.collective.timeout_ms = static_cast<TimeMs>(r.config.data_parallel().timeout_s() * 1000);
  r.gradients = r.collective;
  switch (r.config.data_parallel().gradient_dtype()) {
    case config::BFLOAT16:
      r.gradients.wire = collective::WireType::kBf16;
      break;
    case config::FLOAT16:
      r.gradients.wire = collective::WireType::kFp16;
      break;
    default:
      break;
  }
  r.fault_kill_step = o.fault_kill_step;
  r.fault_perturb_step = o.fault_perturb_step;
  if (o.metrics != nullptr) r.metrics.emplace(o.metrics->registry());
  return OkStatus();
}

}  // namespace

// [0]: the ranks that can; then each rank's device key, its bits in an
// int64 (every other rank adds zero there, so the sum is the key).
size_t DeviceVoteLength(int world) { return 1 + size_t(world); }

void CastDeviceVote(std::span<int64_t> vote, int rank, bool can, uint64_t device_key) {
  vote[0] = can ? 1 : 0;
  vote[1 + rank] = static_cast<int64_t>(device_key);
}

std::string DeviceVoteVerdict(std::span<const int64_t> vote, int world) {
  std::vector<uint64_t> keys(world, 0);
  for (int q = 0; q < world; ++q) keys[q] = static_cast<uint64_t>(vote[1 + q]);
  for (int a = 0; a < world; ++a) {
    for (int b = a + 1; b < world; ++b) {
      if (keys[a] == keys[b]) {
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) +
               " share one device (NCCL needs a device per rank: --device cuda:N)";
      }
    }
  }
  if (vote[0] != world) {
    return "not every rank's backend has device collectives for this group";
  }
  return "";
}

namespace {

// A device group id's most bytes (NCCL's is 128).
constexpr size_t kMaxGroupIdBytes = 128;

// Whether the backend sums the gradients (--collectives): every rank says
// whether its backend can, over the host group; only when all can does rank
// 0 make a group id and send it round (as its bytes), and every rank
// joins. Exact mode, local SGD and 16-bit gradients stay on the host.
Status SetUpDeviceCollectives(Rank& r, const std::string& want) {
  const config::DataParallelConfig& dp = r.config.data_parallel();
  // Every rank votes (world is the same on all), whatever its --collectives.
  if (r.world == 1 && want != "device") return OkStatus();
  std::string why;
  if (want == "host") {
    why = "--collectives host";
  } else if (dp.exact()) {
    why = "exact mode sums fixed point on the host";
  } else if (dp.local_sgd_steps() > 0) {
    why = "local SGD averages models on the host";
  } else if (dp.gradient_dtype() != config::FLOAT32) {
    why = "16-bit gradients are rounded on the host";
  }
  std::vector<int64_t> vote(DeviceVoteLength(r.world), 0);
  CastDeviceVote(vote, r.rank, why.empty() && r.backend->HasDeviceCollectives(r.world),
                 r.backend->DeviceKey());
  COHORT_RETURN_IF_ERROR(r.comm->AllReduce(std::span<int64_t>(vote), r.collective));
  const std::string verdict = DeviceVoteVerdict(vote, r.world);
  if (!verdict.empty()) {
    if (want == "device") {
      spdlog::warn("rank {}: --collectives device: {} ({}); the gradients are summed on the host",
                   r.rank, why.empty() ? verdict : why, r.backend->Name());
    }
    return OkStatus();
  }
  std::vector<uint8_t> id;
  if (r.rank == 0) {
    COHORT_ASSIGN_OR_RETURN(id, r.backend->NewGroupId());
  }
  COHORT_RETURN_IF_ERROR(r.comm->BroadcastSized(id, 0, kMaxGroupIdBytes, r.collective)
                             .WithContext("the device group id"));
  COHORT_RETURN_IF_ERROR(r.backend->JoinGroup(id, r.rank, r.world, r.collective.timeout_ms));
  r.device_collectives = true;
  spdlog::info("rank {}: the gradients are summed on the device by {}", r.rank, r.backend->Name());
  return OkStatus();
}

}  // namespace

namespace {

// Synchronous SGD's step: micro-batches of batch_size, each weighted by its
// share of the global batch before the sum (GradientWeighting's
// kShareBeforeSum); the gradient in buckets of data_parallel.bucket_mb
// during the backward pass, or summed on the device.
StatusOr<std::unique_ptr<train::DataParallelStep>> NewStep(Rank& r,
                                                           collective::Communicator& comm) {
  const config::DataParallelConfig& dp = r.config.data_parallel();
  train::DataParallelStepOptions options;
  options.weighting = train::GradientWeighting::kShareBeforeSum;
  options.sum = r.device_collectives ? train::GradientSum::kDevice : train::GradientSum::kHost;
  options.micro_batch = r.config.train().batch_size();
  options.collective = r.gradients;
  if (dp.bucket_mb() > 0 && dp.local_sgd_steps() == 0) {
    options.bucket_bytes = std::max<size_t>(1, size_t(dp.bucket_mb() * (1 << 20)));
  }
  options.local_when_alone = r.world == 1 && dp.accumulation_steps() == 1;
  options.env = r.env;
  return train::DataParallelStep::Create(r.model.get(), r.train_data.get(), &comm, options);
}

}  // namespace

Status RunWorker(const WorkerOptions& o, const std::atomic<bool>& stop, Env* env) {
  Rank r;
  r.env = env;
  r.rank = o.rank;
  r.world = o.world_size;
  COHORT_RETURN_IF_ERROR(Load(r, o));
  zmq::context_t context(1);
  net::GroupOptions group{.rank = o.rank,
                          .size = o.world_size,
                          .master = o.master,
                          .transport = o.transport,
                          .host = o.host,
                          .encrypt = o.encrypt,
                          .insecure = o.insecure};
  crypto::Ed25519KeyPair identity;
  COHORT_RETURN_IF_ERROR(
      net::LoadGroupKeys(o.identity, o.allow, o.master_key, "worker", &identity, &group));
  COHORT_ASSIGN_OR_RETURN(auto transport, net::JoinGroup(context, group, r.collective));
  collective::Communicator comm(transport.get());
  r.comm = &comm;
  COHORT_RETURN_IF_ERROR(AgreeOnConfig(r));
  COHORT_RETURN_IF_ERROR(SetUpDeviceCollectives(r, o.collectives));
  // After comm: its bucket reducer's thread is joined before comm goes.
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<train::DataParallelStep> step, NewStep(r, comm));
  r.step = step.get();
  if (step->buckets() > 0) {
    spdlog::info("rank {}: gradients all-reduced in {} buckets during the backward pass", o.rank,
                 step->buckets());
  }
  spdlog::info("rank {} of {} ready ({}, {})", o.rank, o.world_size, r.backend->Name(),
               net::Describe(group));

  COHORT_ASSIGN_OR_RETURN(r.devices, RankDevices(r));
  std::vector<float> params(r.model->num_params());
  COHORT_ASSIGN_OR_RETURN(Start start, StartModel(r, o.run_dir, params));
  const uint32_t done = start.epoch;
  if (r.metrics) r.metrics->SetLastEpoch(done);
  COHORT_RETURN_IF_ERROR(r.model->SetParams(params));
  COHORT_ASSIGN_OR_RETURN(auto optimizer,
                          train::Optimizer::Create(train::OptimizerFromConfig(r.config.train()),
                                                   params.size(), r.backend.get()));
  if (!start.state.empty()) {
    // A checkpoint of another optimizer (a config that differs) was refused
    // before; a state of the wrong size here is a damaged store.
    COHORT_RETURN_IF_ERROR(optimizer->RestoreState(start.state, start.optimizer_steps)
                               .WithContext(o.run_dir + ": the checkpoint's optimizer state"));
  }
  const uint32_t epochs = r.config.data_parallel().epochs();
  uint64_t global_step = 0;
  for (uint32_t epoch = done + 1; epoch <= epochs && !stop; ++epoch) {
    StatusOr<EpochResult> e = TrainEpoch(r, epoch, *optimizer, global_step);
    if (!e.ok()) return e.status().WithContext("epoch " + std::to_string(epoch));
    // A peer lost here is named with the epoch, as one lost while training.
    StatusOr<std::vector<store::RankRecord>> ranks = GatherRanks(r, *e);
    if (!ranks.ok()) {
      return ranks.status().WithContext("epoch " + std::to_string(epoch) +
                                        ": gathering the ranks' timings");
    }
    e->ranks = std::move(*ranks);
    if (r.metrics) r.metrics->RecordEpoch(epoch, e->ranks[r.rank]);
    COHORT_RETURN_IF_ERROR(r.model->GetParams(params));
    // A kill "before the next epoch's first step" comes before this commit
    // (on rank 0 while it commits, the others waiting for it).
    if (r.rank != 0) COHORT_RETURN_IF_ERROR(InjectFaults(r, global_step, /*after=*/false));
    // The others wait here, not inside the next epoch's first all-reduce,
    // while rank 0 evaluates and commits.
    COHORT_RETURN_IF_ERROR(EpochBarrier(r, epoch, [&] {
      return r.rank == 0 ? CommitEpoch(r, epoch, *e, params, *optimizer, global_step) : OkStatus();
    }));
  }
  // Nobody leaves while a peer may still need a message from it.
  return comm.Barrier(r.collective);
}

}  // namespace cohort::worker
