#include "sim/mpi_executors.h"

// The C API only (Open MPI's C++ bindings are deprecated and warn).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "common/clock.h"

namespace cohort::sim {
namespace {

// Rank 0 to a hosting rank, and back. MPI keeps the order of one tag
// between two ranks: a hosting rank sees every job before the stop, and
// rank 0 every result before the "stopped".
constexpr int kToHost = 0x5301, kToRoot = 0x5302;
enum class Kind : uint8_t { kHello = 1, kJob, kCancel, kStop, kFinished, kStopped };
constexpr int64_t kStopWaitMs = 30'000;

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

// A message, field after field in this machine's byte order: every rank
// runs this same binary.
class Writer {
 public:
  explicit Writer(Kind kind) { Put(kind); }
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put(uint64_t(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void PutFloats(const std::vector<float>& v) {
    Put(uint64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(float));
  }
  std::vector<uint8_t> Take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what Writer wrote; a short or overlong message sets !ok() and
// reads zeros from then on.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  template <typename T>
  T Get() {
    T v{};
    if (!Have(sizeof(T))) return v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string GetString() {
    const auto n = Get<uint64_t>();
    if (!Have(n)) return {};
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  std::vector<float> GetFloats() {
    const auto n = Get<uint64_t>();
    if (n > bytes_.size() / sizeof(float) || !Have(n * sizeof(float))) return {};
    std::vector<float> v(n);
    if (n > 0) std::memcpy(v.data(), bytes_.data() + at_, n * sizeof(float));  // Else null.
    at_ += n * sizeof(float);
    return v;
  }
  bool ok() const { return ok_ && at_ == bytes_.size(); }

 private:
  bool Have(uint64_t n) {
    if (!ok_ || n > bytes_.size() - at_) ok_ = false;
    return ok_;
  }
  const std::vector<uint8_t>& bytes_;
  size_t at_ = 0;
  bool ok_ = true;
};

// Sleeps a little longer each time nothing came (20 us up to 1 ms), so
// that a rank waiting for messages leaves the cores to those training.
class Backoff {
 public:
  void Idle() {
    std::this_thread::sleep_for(wait_);
    wait_ = std::min(wait_ * 2, std::chrono::microseconds(1000));
  }
  // Longer next time, without sleeping (the caller has waited otherwise).
  void Grow() { wait_ = std::min(wait_ * 2, std::chrono::microseconds(1000)); }
  void Reset() { wait_ = std::chrono::microseconds(20); }
  std::chrono::microseconds wait() const { return wait_; }

 private:
  std::chrono::microseconds wait_{20};
};

struct Received {
  int from = 0;
  std::vector<uint8_t> bytes;
};

// MPI_COMM_WORLD's duplicate, errors returned, and the sends in flight.
class Comm {
 public:
  ~Comm() {
    // A send MPI has not finished may still read its buffer.
    for (auto& p : sends_) {
      MPI_Cancel(&p.request);
      MPI_Wait(&p.request, MPI_STATUS_IGNORE);
    }
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Status Init() {
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS ||
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
      return UnavailableError("MPI: cannot set up a communicator");
    }
    return OkStatus();
  }
  MPI_Comm comm() const { return comm_; }
  Status Send(int peer, int tag, std::vector<uint8_t> bytes);
  // Releases the sends MPI has finished.
  Status Progress();
  // The next message with `tag` from `peer` (MPI_ANY_SOURCE: anyone), if
  // one has come.
  StatusOr<std::optional<Received>> Poll(int peer, int tag);
  // Waits until every send is done, until `deadline` (SteadyNowMs).
  Status Flush(TimeMs deadline);

 private:
  struct Pending {
    std::vector<uint8_t> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
    int peer = 0;
  };
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::deque<Pending> sends_;
};

Status Comm::Send(int peer, int tag, std::vector<uint8_t> bytes) {
  if (bytes.size() > size_t(INT_MAX)) {
    return ResourceExhaustedError("MPI: a message of " + std::to_string(bytes.size()) +
                                  " bytes to rank " + std::to_string(peer) +
                                  " (MPI's limit is 2 GiB; a smaller model)");
  }
  sends_.push_back({std::move(bytes), MPI_REQUEST_NULL, peer});
  Pending& p = sends_.back();
  const int rc =
      MPI_Isend(p.bytes.data(), int(p.bytes.size()), MPI_BYTE, peer, tag, comm_, &p.request);
  if (rc != MPI_SUCCESS) {
    sends_.pop_back();
    return UnavailableError("MPI send to rank " + std::to_string(peer) + ": " + MpiError(rc));
  }
  return Progress();
}

Status Comm::Progress() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    const int rc = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      return UnavailableError("MPI send to rank " + std::to_string(it->peer) + ": " + MpiError(rc));
    }
    it = done ? sends_.erase(it) : std::next(it);
  }
  return OkStatus();
}

StatusOr<std::optional<Received>> Comm::Poll(int peer, int tag) {
  COHORT_RETURN_IF_ERROR(Progress());
  int found = 0;
  MPI_Status status;
  int rc = MPI_Iprobe(peer, tag, comm_, &found, &status);
  if (rc != MPI_SUCCESS) return UnavailableError("MPI probe: " + MpiError(rc));
  if (!found) return std::optional<Received>();
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  Received r{status.MPI_SOURCE, std::vector<uint8_t>(size_t(std::max(count, 0)))};
  rc = MPI_Recv(r.bytes.data(), count, MPI_BYTE, r.from, tag, comm_, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    return UnavailableError("MPI receive from rank " + std::to_string(r.from) + ": " +
                            MpiError(rc));
  }
  return std::optional<Received>(std::move(r));
}

Status Comm::Flush(TimeMs deadline) {
  Backoff backoff;
  for (;;) {
    COHORT_RETURN_IF_ERROR(Progress());
    if (sends_.empty()) return OkStatus();
    if (SteadyNowMs() >= deadline) return DeadlineExceededError("MPI sends not finished in time");
    backoff.Idle();
  }
}

Status Malformed(int from) {
  return DataLossError("MPI: a malformed message from rank " + std::to_string(from));
}

void PutOptions(Writer& w, const train::TrainOptions& o) {
  w.Put(o.epochs);
  w.Put(o.batch_size);
  w.Put(o.seed);
  w.Put(o.optimizer);                  // Plain numbers and an enum.
  w.PutFloats(o.scaffold_correction);  // SCAFFOLD's c - c_i (empty without it).
}

train::TrainOptions GetOptions(Reader& r) {
  train::TrainOptions o;
  o.epochs = r.Get<uint32_t>();
  o.batch_size = r.Get<uint32_t>();
  o.seed = r.Get<uint64_t>();
  o.optimizer = r.Get<train::OptimizerOptions>();
  o.scaffold_correction = r.GetFloats();
  return o;
}

// Rank 0's side: the hosting ranks as one Executors.
class RemoteExecutors final : public Executors {
 public:
  // `executors[k]`: rank k's (0 for rank 0).
  RemoteExecutors(Comm* comm, std::vector<size_t> executors)
      : comm_(comm), executors_(std::move(executors)), load_(executors_.size(), 0) {
    for (size_t n : executors_) total_ += n;
  }
  size_t size() const override { return total_; }

 protected:
  Status Start(Job job) override;
  StatusOr<Finished> Wait() override;

 private:
  struct Running {
    int rank = 0;
    int client = 0;
    TimeMs due = 0;
    uint64_t task_id = 0;
    std::shared_ptr<std::atomic<bool>> cancel;
    bool cancel_sent = false;
  };
  Status RelayCancels();
  StatusOr<Finished> Read(const Received& m);

  Comm* comm_;
  std::vector<size_t> executors_, load_;
  size_t total_ = 0;
  uint64_t next_serial_ = 1;
  std::map<uint64_t, Running> running_;  // By serial.
};

Status RemoteExecutors::Start(Job job) {
  // The rank with the most executors free (the lowest on a tie).
  int rank = 1;
  for (int k = 2; k < int(executors_.size()); ++k) {
    if (load_[k] * executors_[rank] < load_[rank] * executors_[k]) rank = k;
  }
  const uint64_t serial = next_serial_++;
  Writer w(Kind::kJob);
  w.Put(serial);
  w.Put(int32_t(job.client));
  w.Put(job.task.task_id);
  w.Put(job.train_seconds);
  PutOptions(w, job.task.options);
  w.PutFloats(job.task.global);
  COHORT_RETURN_IF_ERROR(comm_->Send(rank, kToHost, w.Take()));
  ++load_[rank];
  running_[serial] = {rank, job.client, job.due, job.task.task_id, std::move(job.cancel)};
  return OkStatus();
}

Status RemoteExecutors::RelayCancels() {
  for (auto& [serial, r] : running_) {
    if (r.cancel_sent || !r.cancel || !r.cancel->load()) continue;
    Writer w(Kind::kCancel);
    w.Put(serial);
    COHORT_RETURN_IF_ERROR(comm_->Send(r.rank, kToHost, w.Take()));
    r.cancel_sent = true;
    spdlog::debug("task {} of client index {} cancelled: rank {} told", r.task_id, r.client,
                  r.rank);
  }
  return OkStatus();
}

StatusOr<Finished> RemoteExecutors::Wait() {
  Backoff backoff;
  for (;;) {
    COHORT_RETURN_IF_ERROR(RelayCancels());
    COHORT_ASSIGN_OR_RETURN(std::optional<Received> m, comm_->Poll(MPI_ANY_SOURCE, kToRoot));
    if (m) return Read(*m);
    backoff.Idle();
  }
}

StatusOr<Finished> RemoteExecutors::Read(const Received& m) {
  Reader r(m.bytes);
  if (r.Get<Kind>() != Kind::kFinished) return Malformed(m.from);
  const auto serial = r.Get<uint64_t>();
  const auto code = r.Get<int32_t>();
  const std::string message = r.GetString();
  train::TrainResult result = r.Get<train::TrainResult>();
  std::vector<float> local = r.GetFloats();
  auto it = running_.find(serial);
  if (!r.ok() || it == running_.end() || it->second.rank != m.from ||
      code < int32_t(StatusCode::kOk) || code > int32_t(StatusCode::kCancelled)) {
    return Malformed(m.from);
  }
  Finished f{it->second.client,         it->second.due,   it->second.task_id,
             CancelledError("not run"), std::move(local), serial};
  if (code == int32_t(StatusCode::kOk)) {
    f.result = result;
  } else {
    f.result = Status(StatusCode(code), message);
  }
  --load_[m.from];
  running_.erase(it);
  return f;
}

class MpiRanksImpl final : public MpiRanks {
 public:
  ~MpiRanksImpl() override;
  Status Init(int expected, const std::string& source);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  StatusOr<std::unique_ptr<Executors>> Hosts(uint64_t digest, size_t clients) override;
  Status Serve(const Status& setup, uint64_t digest, size_t clients, ExecutorPool* pool) override;

 private:
  Status StopHosts();
  StatusOr<size_t> ReadHello(const Received& m, uint64_t digest, size_t clients);
  // A hosting rank: one message from rank 0 (false: stop).
  StatusOr<bool> Handle(const Received& m, ExecutorPool* pool);
  Status SendFinished(const Finished& f);

  int rank_ = 0, size_ = 1;
  bool finalize_ = false;
  bool joined_ = false;  // Every rank saw the same world: rank 0 stops the others.
  std::unique_ptr<Comm> comm_;
  // A hosting rank's jobs in training, by serial.
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> cancels_;
  size_t clients_ = 0;
};

Status MpiRanksImpl::Init(int expected, const std::string& source) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      return UnavailableError("simulate: MPI_Init_thread failed (" + source + " says " +
                              std::to_string(expected) + " ranks)");
    }
    finalize_ = true;
  }
  comm_ = std::make_unique<Comm>();
  COHORT_RETURN_IF_ERROR(comm_->Init());
  MPI_Comm_rank(comm_->comm(), &rank_);
  MPI_Comm_size(comm_->comm(), &size_);
  if (size_ != expected) {
    return FailedPreconditionError("simulate: MPI says " + std::to_string(size_) + " ranks, " +
                                   source + " says " + std::to_string(expected));
  }
  joined_ = true;
  return OkStatus();
}

// Every hosting rank is told to stop, and rank 0 reads until each says it
// has (dropping the results still coming): then no send is left half done
// on either side and MPI_Finalize, which waits for every rank, returns.
Status MpiRanksImpl::StopHosts() {
  for (int k = 1; k < size_; ++k) {
    COHORT_RETURN_IF_ERROR(comm_->Send(k, kToHost, Writer(Kind::kStop).Take()));
  }
  const TimeMs deadline = SteadyNowMs() + kStopWaitMs;
  std::vector<bool> stopped(size_t(size_), false);
  Backoff backoff;
  for (int left = size_ - 1; left > 0;) {
    COHORT_ASSIGN_OR_RETURN(std::optional<Received> m, comm_->Poll(MPI_ANY_SOURCE, kToRoot));
    if (m) {
      Reader r(m->bytes);
      if (r.Get<Kind>() == Kind::kStopped && !stopped[m->from]) {
        stopped[m->from] = true;
        --left;
      }
      continue;
    }
    if (SteadyNowMs() >= deadline) {
      int late = 1;
      while (stopped[late]) ++late;
      return DeadlineExceededError("rank " + std::to_string(late) + " did not stop within " +
                                   std::to_string(kStopWaitMs / 1000) + " s");
    }
    backoff.Idle();
  }
  return comm_->Flush(deadline);
}

MpiRanksImpl::~MpiRanksImpl() {
  if (comm_ == nullptr) return;
  if (joined_ && rank_ == 0 && size_ > 1) {
    const Status stopped = StopHosts();
    if (!stopped.ok()) {
      spdlog::error("simulate: stopping the hosting ranks: {}; aborting the MPI job",
                    stopped.message());
      MPI_Abort(comm_->comm(), 1);
    }
  }
  comm_.reset();
  if (finalize_) MPI_Finalize();
}

StatusOr<size_t> MpiRanksImpl::ReadHello(const Received& m, uint64_t digest, size_t clients) {
  Reader r(m.bytes);
  const Kind kind = r.Get<Kind>();
  const auto code = r.Get<int32_t>();
  const std::string message = r.GetString();
  const auto their_digest = r.Get<uint64_t>();
  const auto their_clients = r.Get<uint64_t>();
  const auto executors = r.Get<uint64_t>();
  if (!r.ok() || kind != Kind::kHello || code < 0 || code > int32_t(StatusCode::kCancelled)) {
    return Malformed(m.from);
  }
  const std::string who = "simulate: rank " + std::to_string(m.from);
  if (code != 0) return Status(StatusCode(code), who + ": " + message);
  if (their_digest != digest) {
    return FailedPreconditionError(
        who + " has other clients than rank 0 (" + std::to_string(their_clients) + " against " +
        std::to_string(clients) +
        ", or other data or model): every rank must load the same clients (the same --shards "
        "files, or the same config's data.partition and --clients)");
  }
  if (executors == 0) return Malformed(m.from);
  return size_t(executors);
}

StatusOr<std::unique_ptr<Executors>> MpiRanksImpl::Hosts(uint64_t digest, size_t clients) {
  std::vector<size_t> executors(size_t(size_), 0);
  Backoff backoff;
  for (int left = size_ - 1; left > 0;) {
    COHORT_ASSIGN_OR_RETURN(std::optional<Received> m, comm_->Poll(MPI_ANY_SOURCE, kToRoot));
    if (!m) {
      backoff.Idle();
      continue;
    }
    if (executors[m->from] != 0) return Malformed(m->from);
    COHORT_ASSIGN_OR_RETURN(executors[m->from], ReadHello(*m, digest, clients));
    --left;
  }
  return std::unique_ptr<Executors>(new RemoteExecutors(comm_.get(), std::move(executors)));
}

Status MpiRanksImpl::SendFinished(const Finished& f) {
  cancels_.erase(f.serial);
  Writer w(Kind::kFinished);
  w.Put(f.serial);
  w.Put(int32_t(f.result.status().code()));
  w.PutString(f.result.ok() ? std::string() : f.result.status().message());
  w.Put(f.result.ok() ? *f.result : train::TrainResult{});
  w.PutFloats(f.local);
  return comm_->Send(0, kToRoot, w.Take());
}

StatusOr<bool> MpiRanksImpl::Handle(const Received& m, ExecutorPool* pool) {
  Reader r(m.bytes);
  const Kind kind = r.Get<Kind>();
  if (kind == Kind::kStop) return false;
  const auto serial = r.Get<uint64_t>();
  if (kind == Kind::kCancel) {
    if (auto it = cancels_.find(serial); it != cancels_.end()) *it->second = true;
    return true;
  }
  Job job;
  job.serial = serial;
  job.client = r.Get<int32_t>();
  job.task.task_id = r.Get<uint64_t>();
  job.train_seconds = r.Get<double>();
  job.task.options = GetOptions(r);
  job.task.global = r.GetFloats();
  if (kind != Kind::kJob || !r.ok() || job.client < 0 || size_t(job.client) >= clients_ ||
      pool == nullptr) {
    return Malformed(0);
  }
  job.cancel = cancels_[serial] = std::make_shared<std::atomic<bool>>(false);
  COHORT_RETURN_IF_ERROR(pool->Submit(std::move(job)));
  return true;
}

Status MpiRanksImpl::Serve(const Status& setup, uint64_t digest, size_t clients,
                           ExecutorPool* pool) {
  clients_ = clients;
  Writer hello(Kind::kHello);
  hello.Put(int32_t(setup.code()));
  hello.PutString(setup.message());
  hello.Put(digest);
  hello.Put(uint64_t(clients));
  hello.Put(uint64_t(pool != nullptr ? pool->size() : 0));
  COHORT_RETURN_IF_ERROR(comm_->Send(0, kToRoot, hello.Take()));
  Backoff backoff;
  for (bool serving = true; serving;) {
    COHORT_ASSIGN_OR_RETURN(std::optional<Received> m, comm_->Poll(0, kToHost));
    if (m) {
      COHORT_ASSIGN_OR_RETURN(serving, Handle(*m, pool));
      backoff.Reset();
    } else if (pool != nullptr && pool->in_flight() > 0) {
      // Waiting on the executors is this rank's sleep: a result goes out
      // as soon as it is ready.
      std::optional<Finished> f = pool->TakeFor(backoff.wait());
      if (f) {
        COHORT_RETURN_IF_ERROR(SendFinished(*f));
        backoff.Reset();
      } else {
        backoff.Grow();
      }
    } else {
      backoff.Idle();
    }
  }
  // Stopped: what still trains is not needed.
  for (auto& [serial, cancel] : cancels_) *cancel = true;
  spdlog::debug("rank {}: stopped by rank 0, {} jobs cancelled", rank_, cancels_.size());
  while (pool != nullptr && pool->in_flight() > 0) (void)pool->Take();
  COHORT_RETURN_IF_ERROR(comm_->Send(0, kToRoot, Writer(Kind::kStopped).Take()));
  return comm_->Flush(SteadyNowMs() + kStopWaitMs);
}

}  // namespace

StatusOr<std::unique_ptr<MpiRanks>> MpiRanks::Join(int expected, const std::string& source) {
  auto ranks = std::make_unique<MpiRanksImpl>();
  COHORT_RETURN_IF_ERROR(ranks->Init(expected, source));
  return std::unique_ptr<MpiRanks>(std::move(ranks));
}

}  // namespace cohort::sim
