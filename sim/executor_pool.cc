#include <spdlog/spdlog.h>

#include <new>
#include <system_error>

#include "datasets/split.h"
#include "sim/executors.h"
#include "train/model_config.h"

namespace cohort::sim {
namespace {

// The Env a simulated client trains under: its clock reads 0 at the start
// of training and the job's virtual duration at every later read, so the
// training seconds a client reports (a masked metric) are virtual time, not
// how long the executor took. All else goes to `base`.
class VirtualTrainingEnv final : public Env {
 public:
  VirtualTrainingEnv(Env* base, double seconds) : base_(base), seconds_(seconds) {}
  double MonotonicSeconds() override { return reads_++ == 0 ? 0 : seconds_; }
  int64_t UnixMillis() override { return base_->UnixMillis(); }
  uint64_t Random64() override { return base_->Random64(); }
  void RandomBytes(std::span<uint8_t> out) override { base_->RandomBytes(out); }
  spdlog::logger& Log() override { return base_->Log(); }
  Status ParallelFor(size_t n, const std::function<Status(size_t)>& fn) override {
    return base_->ParallelFor(n, fn);
  }

 private:
  Env* base_;
  double seconds_;
  int reads_ = 0;
};

}  // namespace

Status Executors::Submit(Job job) {
  dues_.insert(job.due);
  ++in_flight_;
  return Start(std::move(job));
}

StatusOr<Finished> Executors::Take() {
  COHORT_ASSIGN_OR_RETURN(Finished f, Wait());
  Taken(f);
  return f;
}

void Executors::Taken(const Finished& f) {
  --in_flight_;
  dues_.erase(dues_.find(f.due));
}

StatusOr<std::unique_ptr<ExecutorPool>> ExecutorPool::Create(
    int n, const std::vector<std::string>& list, const config::ModelConfig& model,
    const std::vector<VirtualClient>* clients) {
  std::unique_ptr<ExecutorPool> pool(new ExecutorPool(clients));
  // --executors is bounded, yet what a process may start depends on its
  // limits (address space, threads): an executor that cannot be had is
  // an error naming the flag, and the pool's destructor stops those
  // already started.
  const auto too_many = [n](int k, const char* what) {
    return ResourceExhaustedError("simulate: --executors " + std::to_string(n) +
                                  ": could not start executor " + std::to_string(k) + " (" + what +
                                  "); use fewer executors");
  };
  for (int k = 0; k < n; ++k) {
    // One BLAS thread on the CPU, as a client daemon uses by default.
    std::string note;
    const std::string& device = list[size_t(k) % list.size()];
    try {
      auto backend = train::NewBackend({.device = device, .threads = 1}, &note);
      if (!backend.ok()) return backend.status().WithContext("--devices " + device);
      if (!note.empty()) spdlog::info("executor {}: {}", k, note);
      COHORT_ASSIGN_OR_RETURN(auto m, train::BuildModel(model, backend->get()));
      pool->backends_.push_back(std::move(*backend));
      pool->models_.push_back(std::move(m));
    } catch (const std::bad_alloc&) {
      return too_many(k, "out of memory for its model");
    } catch (const std::system_error& e) {
      return too_many(k, e.what());
    }
  }
  pool->last_rows_.assign(n, 0);
  for (int k = 0; k < n; ++k) {
    try {
      pool->threads_.emplace_back([p = pool.get(), k] { p->Loop(k); });
    } catch (const std::system_error& e) {
      return too_many(k, (std::string("no thread: ") + e.what()).c_str());
    }
  }
  return pool;
}

ExecutorPool::~ExecutorPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (auto& t : threads_) t.join();
}

Status ExecutorPool::Start(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  work_.notify_one();
  return OkStatus();
}

StatusOr<Finished> ExecutorPool::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return !done_.empty(); });
  Finished f = std::move(done_.front());
  done_.pop_front();
  return f;
}

std::optional<Finished> ExecutorPool::TakeFor(std::chrono::microseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_cv_.wait_for(lock, wait, [&] { return !done_.empty(); })) return std::nullopt;
  Finished f = std::move(done_.front());
  done_.pop_front();
  lock.unlock();
  Taken(f);
  return f;
}

void ExecutorPool::Loop(int k) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Train(k, std::move(job));
  }
}

void ExecutorPool::Train(int k, Job job) {
  Finished f{
      job.client, job.due, job.task.task_id, CancelledError("not run"), std::move(job.task.global),
      job.serial};
  // Shards of another size than the last would each stay cached in
  // the backend's pool: let the old ones go.
  const VirtualClient& c = (*clients_)[job.client];
  if (c.size() != last_rows_[k]) backends_[k]->ReleaseCached();
  last_rows_[k] = c.size();
  auto data = c.whole ? train::DeviceDataset::Upload(backends_[k].get(), *c.source)
                      : train::DeviceDataset::Upload(backends_[k].get(),
                                                     datasets::Subset(*c.source, c.rows));
  if (!data.ok()) {
    f.result = data.status();
  } else {
    VirtualTrainingEnv env(Env::Default(), job.train_seconds);
    f.result =
        train::TrainLocal(*models_[k], f.local, **data, job.task.options, job.cancel.get(), &env);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(f));
  }
  done_cv_.notify_one();
}

}  // namespace cohort::sim
