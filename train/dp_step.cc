#include "train/dp_step.h"

#include <algorithm>
#include <cmath>

namespace cohort::train {
namespace {

bool AllFinite(std::span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace

std::vector<size_t> BucketCuts(const Model& model, size_t bucket_bytes) {
  std::vector<size_t> cuts;
  size_t last = model.num_params();
  for (size_t offset : model.GradientReadyOffsets()) {
    if (offset == 0 || (last - offset) * sizeof(float) >= bucket_bytes) {
      cuts.push_back(offset);
      last = offset;
    }
  }
  if (cuts.empty() || cuts.back() != 0) cuts.push_back(0);
  return cuts;
}

StatusOr<std::string> FlaggedRanks(collective::Communicator& comm, bool mine,
                                   const collective::CollectiveOptions& options) {
  std::vector<int64_t> flags(comm.size(), 0);
  flags[comm.rank()] = mine ? 1 : 0;
  COHORT_RETURN_IF_ERROR(comm.AllReduce(std::span<int64_t>(flags), options));
  std::string ranks;
  for (int k = 0; k < comm.size(); ++k) {
    if (flags[k] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(k);
  }
  return ranks;
}

DataParallelStep::DataParallelStep(Model* model, const DeviceDataset* data,
                                   collective::Communicator* comm,
                                   const DataParallelStepOptions& options)
    : model_(model),
      backend_(model->backend()),
      data_(data),
      comm_(comm),
      options_(options),
      np_(model->num_params()) {}

DataParallelStep::~DataParallelStep() = default;

StatusOr<std::unique_ptr<DataParallelStep>> DataParallelStep::Create(
    Model* model, const DeviceDataset* data, collective::Communicator* comm,
    const DataParallelStepOptions& options) {
  if (options.micro_batch == 0) return InvalidArgumentError("data-parallel step: micro-batch 0");
  if (options.sum == GradientSum::kDevice &&
      options.weighting != GradientWeighting::kShareBeforeSum) {
    return InvalidArgumentError(
        "data-parallel step: the device sum weights the gradient before the sum only");
  }
  std::unique_ptr<DataParallelStep> s(new DataParallelStep(model, data, comm, options));
  Backend* b = s->backend_;
  // The slots after the gradient, in this order.
  size_t next = s->np_;
  if (options.weighting == GradientWeighting::kSumThenDivide) s->samples_slot_ = next++;
  if (options.cancellable) s->cancel_slot_ = next++;
  s->non_finite_slot_ = next++;
  s->length_ = next;
  const size_t micro = options.micro_batch;
  COHORT_ASSIGN_OR_RETURN(s->x_, DeviceArray<float>::Create(b, micro * model->input_features()));
  COHORT_ASSIGN_OR_RETURN(s->y_, DeviceArray<int32_t>::Create(b, micro));
  COHORT_RETURN_IF_ERROR(model->Reserve(static_cast<int>(micro)));
  const bool in_place = b->HostMemory() && options.sum == GradientSum::kHost;
  COHORT_ASSIGN_OR_RETURN(s->reduced_,
                          DeviceArray<float>::Create(b, in_place ? s->length_ : s->np_));
  if (in_place) {
    s->sum_ = s->reduced_.data();
  } else if (options.sum == GradientSum::kHost) {
    s->host_.resize(s->length_);
    s->sum_ = s->host_.data();
  }
  if (options.sum == GradientSum::kHost && comm->size() > 1 && options.bucket_bytes > 0) {
    std::vector<size_t> cuts = BucketCuts(*model, options.bucket_bytes);
    // One bucket would only add a thread's hand-over to the same all-reduce.
    if (cuts.size() > 1) {
      s->cuts_ = std::move(cuts);
      s->reducer_.emplace(comm, options.collective);
    }
  }
  return s;
}

void DataParallelStep::Gather(const uint32_t* order, size_t begin, size_t k) {
  const Shape& s = model_->spec().input;
  backend_->Gather(data_->features(), data_->labels(), order + begin, int(k), int(s.c), int(s.h),
                   int(s.w), x_.data(), y_.data());
}

Status DataParallelStep::LocalStep(const uint32_t* order, size_t lo, size_t hi,
                                   Optimizer& optimizer, double* stats) {
  if (hi - lo > options_.micro_batch) {
    return InvalidArgumentError("data-parallel step: a local batch of " + std::to_string(hi - lo) +
                                " samples, above the micro-batch");
  }
  if (hi == lo) return OkStatus();
  Gather(order, lo, hi - lo);
  model_->TrainStep(x_.data(), y_.data(), int(hi - lo), optimizer, stats);
  return OkStatus();
}

double DataParallelStep::Now() const {
  return options_.env != nullptr ? options_.env->MonotonicSeconds() : 0;
}

float DataParallelStep::Weight(size_t k, size_t count) const {
  return options_.weighting == GradientWeighting::kShareBeforeSum ? float(k) / float(count)
                                                                  : float(k);
}

void DataParallelStep::AddWeighted(size_t from, size_t to, float weight, bool first) {
  const float* g = model_->grads().data() + from;
  float* out = sum_ + from;
  const size_t n = to - from;
  if (!backend_->HostMemory()) {
    // Backend memory is not the host's to read: a copy first.
    float* copy = first ? out : micro_.data() + from;
    backend_->Download(copy, g, n * sizeof(float));
    g = copy;
  }
  if (first) {
    for (size_t i = 0; i < n; ++i) out[i] = g[i] * weight;
    return;
  }
  for (size_t i = 0; i < n; ++i) out[i] += g[i] * weight;
}

bool DataParallelStep::LocalGradient(const uint32_t* order, size_t lo, size_t hi, size_t count) {
  std::fill(sum_, sum_ + length_, 0.0f);
  if (!backend_->HostMemory()) micro_.resize(np_);
  bool finite = true;
  size_t sent = np_;  // sum_[sent, np_) is with the reducer.
  size_t next = 0;    // The next of cuts_.
  auto hand_over = [&](size_t from) {
    const std::span<float> bucket(sum_ + from, sent - from);
    if (!AllFinite(bucket)) finite = false;
    reducer_->Submit(bucket);
    sent = from;
  };
  for (size_t m = lo; m < hi; m += options_.micro_batch) {
    const size_t k = std::min(options_.micro_batch, hi - m);
    Gather(order, m, k);
    const float weight = Weight(k, count);
    const bool first = m == lo;
    if (!reducer_ || m + k < hi) {
      model_->Backward(x_.data(), y_.data(), int(k), stats_);
      AddWeighted(0, np_, weight, first);
      continue;
    }
    model_->Backward(x_.data(), y_.data(), int(k), stats_, [&](size_t offset) {
      if (next < cuts_.size() && offset == cuts_[next]) {
        ++next;
        AddWeighted(offset, sent, weight, first);
        hand_over(offset);
      }
    });
  }
  if (!reducer_) return AllFinite(std::span<const float>(sum_, np_));
  for (; next < cuts_.size(); ++next) hand_over(cuts_[next]);  // An empty part.
  return finite;
}

StatusOr<StepReport> DataParallelStep::HostStep(const uint32_t* order, size_t lo, size_t hi,
                                                size_t count, Optimizer& optimizer,
                                                const std::atomic<bool>* cancel) {
  const bool finite = LocalGradient(order, lo, hi, count);
  if (options_.weighting == GradientWeighting::kSumThenDivide) sum_[samples_slot_] = float(hi - lo);
  if (options_.cancellable) {
    const bool cancelled = cancel != nullptr && cancel->load(std::memory_order_relaxed);
    sum_[cancel_slot_] = cancelled ? 1.0f : 0.0f;
  }
  sum_[non_finite_slot_] = finite ? 0.0f : 1.0f;
  StepReport report;
  const double waited_from = Now();
  if (reducer_) {
    // The slots travel last, on their own.
    reducer_->Submit(std::span<float>(sum_ + np_, length_ - np_));
    COHORT_RETURN_IF_ERROR(reducer_->Wait(&report.saturated));
  } else {
    COHORT_RETURN_IF_ERROR(comm_->AllReduce(std::span<float>(sum_, length_), options_.collective));
    report.saturated = comm_->saturated();
  }
  report.comm_seconds = Now() - waited_from;
  // Checked before the update: a NaN from one rank would be in every replica
  // after it (in exact mode it would saturate, and be trained on, silently).
  if (sum_[non_finite_slot_] != 0.0f) {
    COHORT_ASSIGN_OR_RETURN(report.non_finite_ranks,
                            FlaggedRanks(*comm_, !finite, options_.collective));
    return report;
  }
  if (options_.cancellable && sum_[cancel_slot_] != 0.0f) {
    report.cancelled = true;
    return report;
  }
  if (options_.weighting == GradientWeighting::kSumThenDivide) {
    if (sum_[samples_slot_] == 0.0f) return report;
    const float inverse = 1.0f / sum_[samples_slot_];
    for (size_t i = 0; i < np_; ++i) sum_[i] *= inverse;
  }
  if (sum_ != reduced_.data()) backend_->Upload(reduced_.data(), sum_, np_ * sizeof(float));
  COHORT_RETURN_IF_ERROR(optimizer.Step(model_->params(), {reduced_.data(), np_}));
  report.stepped = true;
  return report;
}

StatusOr<StepReport> DataParallelStep::DeviceStep(const uint32_t* order, size_t lo, size_t hi,
                                                  size_t count, Optimizer& optimizer) {
  // Each micro-batch's gradient weighted into reduced_ on the device, summed
  // across the ranks by the backend: nothing crosses to the host.
  backend_->Zero(reduced_.data(), reduced_.bytes());
  for (size_t m = lo; m < hi; m += options_.micro_batch) {
    const size_t k = std::min(options_.micro_batch, hi - m);
    Gather(order, m, k);
    model_->Backward(x_.data(), y_.data(), int(k), stats_);
    backend_->Axpy(Weight(k, count), model_->grads().data(), reduced_.data(), np_);
  }
  const double waited_from = Now();
  COHORT_RETURN_IF_ERROR(
      backend_->AllReduceSum(reduced_.data(), np_, options_.collective.timeout_ms));
  StepReport report;
  report.comm_seconds = Now() - waited_from;
  COHORT_RETURN_IF_ERROR(optimizer.Step(model_->params(), {reduced_.data(), np_}));
  report.stepped = true;
  return report;
}

StatusOr<StepReport> DataParallelStep::Step(const uint32_t* order, size_t lo, size_t hi,
                                            size_t count, Optimizer& optimizer, double* stats,
                                            const std::atomic<bool>* cancel) {
  stats_ = stats;
  if (options_.sum == GradientSum::kDevice) return DeviceStep(order, lo, hi, count, optimizer);
  if (options_.local_when_alone && comm_->size() == 1) {
    // Nothing to sum or add up: the local step (fused where it can be).
    COHORT_RETURN_IF_ERROR(LocalStep(order, lo, hi, optimizer, stats));
    StepReport report;
    report.stepped = hi > lo;
    return report;
  }
  return HostStep(order, lo, hi, count, optimizer, cancel);
}

}  // namespace cohort::train
