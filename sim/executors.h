// The simulator's virtual clients and the executors that train them: a
// pool of threads in this process (ExecutorPool), or the hosting ranks of
// `mpirun -np N cohort simulate` (sim/mpi_executors.h). The simulation
// hands them jobs and takes the results back in whatever order they end;
// what it computes does not depend on who trained a job, or when.
#ifndef COHORT_SIM_EXECUTORS_H_
#define COHORT_SIM_EXECUTORS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "aggregation/secagg_stage.h"
#include "client/actions.h"
#include "client/session.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/status.h"
#include "crypto/keys.h"
#include "datasets/dataset.h"
#include "proto/config.pb.h"
#include "train/device.h"
#include "train/trainer.h"

namespace cohort::sim {

struct VirtualClient {
  std::string name;
  // Simulated dropout: the round it is planned for and the first stage it
  // never sends (kNone: none).
  uint32_t drop_round = 0;
  aggregation::SecAggStage drop_stage = aggregation::SecAggStage::kNone;
  double slowness = 1;    // Its training's virtual time is scaled by this.
  double latency_ms = 0;  // Its link's, each way.
  // Availability: online until `toggle_at` (virtual ms), then the other
  // way; spells drawn from `spells` (never, with availability 1).
  bool online = true;
  TimeMs toggle_at = std::numeric_limits<TimeMs>::max();
  Rng spells{0};
  // Its data: all of `source` (a shard file), or the rows `rows` of it (the
  // one training set, split in memory).
  std::shared_ptr<const datasets::Dataset> source;
  bool whole = true;
  std::vector<uint32_t> rows;
  size_t size() const { return whole ? source->size() : rows.size(); }
  std::string data_sha256;  // Its shard file's (lineage); empty when split in memory.
  crypto::Ed25519KeyPair identity;
  std::unique_ptr<client::Session> session;
  std::shared_ptr<std::atomic<bool>> cancel;  // Of its training job, while one runs.
};

struct Job {
  int client = 0;
  client::TrainTask task;
  std::shared_ptr<std::atomic<bool>> cancel;
  TimeMs due = 0;            // When, in virtual time, its update reaches the engine's side.
  double train_seconds = 0;  // Its training's virtual duration.
  uint64_t serial = 0;       // The MPI executors' own name for it (echoed in Finished).
};
struct Finished {
  int client = 0;
  TimeMs due = 0;
  uint64_t task_id = 0;
  StatusOr<train::TrainResult> result = CancelledError("not run");
  std::vector<float> local;
  uint64_t serial = 0;
};

// Whoever trains the jobs. Submit and Take are called by one thread; a
// job's `cancel` becoming true stops it (its result, kCancelled or not,
// still comes back through Take).
class Executors {
 public:
  Executors() = default;
  Executors(const Executors&) = delete;
  Executors& operator=(const Executors&) = delete;
  virtual ~Executors() = default;

  // An error (kUnavailable: a hosting rank cannot be reached) ends the run.
  Status Submit(Job job);
  // Waits for the next job to finish; an error ends the run.
  StatusOr<Finished> Take();
  size_t in_flight() const { return in_flight_; }
  // The earliest virtual due time of the jobs not yet taken.
  std::optional<TimeMs> earliest_due() const {
    if (dues_.empty()) return std::nullopt;
    return *dues_.begin();
  }
  // How many jobs train at once.
  virtual size_t size() const = 0;

 protected:
  virtual Status Start(Job job) = 0;
  virtual StatusOr<Finished> Wait() = 0;
  // `f` leaves the jobs in flight (Take, or a subclass's own way out).
  void Taken(const Finished& f);

 private:
  size_t in_flight_ = 0;
  std::multiset<TimeMs> dues_;
};

// Trains jobs on its threads, one backend and one model each: each job
// uploads its client's data, trains from the task's global model, and
// hands back the result.
class ExecutorPool final : public Executors {
 public:
  // `n` executors on `devices` (ExpandDevices'), round-robin, for the
  // clients of `clients` (which must outlive the pool).
  static StatusOr<std::unique_ptr<ExecutorPool>> Create(int n,
                                                        const std::vector<std::string>& devices,
                                                        const config::ModelConfig& model,
                                                        const std::vector<VirtualClient>* clients);
  ~ExecutorPool() override;
  size_t size() const override { return threads_.size(); }
  // The next finished job if one finishes within `wait` (a hosting rank
  // polls its messages between).
  std::optional<Finished> TakeFor(std::chrono::microseconds wait);

 protected:
  Status Start(Job job) override;
  StatusOr<Finished> Wait() override;

 private:
  explicit ExecutorPool(const std::vector<VirtualClient>* clients) : clients_(clients) {}
  void Loop(int k);
  void Train(int k, Job job);

  const std::vector<VirtualClient>* clients_;
  std::vector<std::unique_ptr<train::Backend>> backends_;
  std::vector<std::unique_ptr<train::Model>> models_;
  std::vector<size_t> last_rows_;  // Each executor's last client's samples (its own only).
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_, done_cv_;
  std::deque<Job> jobs_;
  std::deque<Finished> done_;
  bool stop_ = false;
};

}  // namespace cohort::sim

#endif  // COHORT_SIM_EXECUTORS_H_
