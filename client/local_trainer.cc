#include "client/local_trainer.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <zmq.hpp>

#include "client/daemon.h"
#include "client/site.h"
#include "crypto/key_files.h"
#include "datasets/shard.h"
#include "net/group.h"
#include "proto/config_io.h"
#include "train/backend.h"
#include "train/device.h"
#include "train/model_config.h"

namespace cohort::client {
namespace {

// Cohort's engine on this client's shard, held in host memory and (for the
// whole run) in backend memory; with a site, rank 0 of its group.
class NativeTrainer final : public LocalTrainer {
 public:
  explicit NativeTrainer(const ClientOptions& options) : options_(options) {}
  Status Open() {
    COHORT_RETURN_IF_ERROR(LoadLocalData());
    if (options_.site_size > 1) COHORT_RETURN_IF_ERROR(JoinSite());
    return OkStatus();
  }

  uint64_t num_samples() const override {
    return site_ != nullptr ? site_->total_samples() : data_.size();
  }
  std::vector<uint64_t> label_counts() const override {
    return site_ != nullptr ? std::vector<uint64_t>{} : datasets::LabelCounts(data_);
  }

  StatusOr<size_t> BuildModel(const config::ModelConfig& config) override {
    // The coordinator's model is untrusted: the same caps as a config
    // file's, before anything is allocated for it.
    config::RunConfig check;
    *check.mutable_model() = config;
    COHORT_RETURN_IF_ERROR(config::ValidateRunConfig(check).WithContext("coordinator's model"));
    COHORT_ASSIGN_OR_RETURN(model_, train::BuildModel(config, backend_.get()));
    COHORT_RETURN_IF_ERROR(train::CheckCompatible(*model_, data_).WithContext(options_.data));
    if (!options_.test_data.empty()) {
      COHORT_ASSIGN_OR_RETURN(datasets::Dataset test, datasets::ReadShard(options_.test_data));
      COHORT_RETURN_IF_ERROR(train::CheckCompatible(*model_, test).WithContext(options_.test_data));
      COHORT_ASSIGN_OR_RETURN(test_data_, train::DeviceDataset::Upload(backend_.get(), test));
      spdlog::info("federated evaluation on {} test samples from {}", test.size(),
                   options_.test_data);
    }
    model_config_ = config;
    return model_->num_params();
  }

  StatusOr<train::TrainResult> Train(const TrainTask& task, std::span<float> params,
                                     const std::atomic<bool>* cancel) override {
    if (site_ != nullptr) {
      if (task.scaffold) {
        return FailedPreconditionError(
            "train.scaffold: a site's workers (--site-master) do not apply SCAFFOLD's correction; "
            "run this client without a site, or leave train.scaffold out");
      }
      return site_->Train(model_config_, *model_, params, task.options, cancel);
    }
    return train::TrainLocal(*model_, params, *device_data_, task.options, cancel);
  }

  StatusOr<train::EvalResult> Evaluate(const TrainTask& task,
                                       std::span<const float> params) override {
    (void)task;
    if (test_data_ == nullptr) {
      return UnimplementedError("no --test-data: this client has no test split to evaluate on");
    }
    return train::Evaluate(*model_, params, *test_data_);
  }

  void Finish() override {
    if (site_ != nullptr && !finished_) site_->Finish();
    finished_ = true;
  }

 private:
  Status LoadLocalData() {
    COHORT_ASSIGN_OR_RETURN(data_, datasets::ReadShard(options_.data));
    spdlog::info("loaded {} samples from {}", data_.size(), options_.data);
    std::string device_note;
    COHORT_ASSIGN_OR_RETURN(
        backend_,
        train::NewBackend({.device = options_.device, .threads = options_.threads}, &device_note));
    if (!device_note.empty()) spdlog::info("{}", device_note);
    spdlog::info("training on {}", backend_->Name());
    COHORT_ASSIGN_OR_RETURN(device_data_, train::DeviceDataset::Upload(backend_.get(), data_));
    return OkStatus();
  }

  // Rank 0 of the site's group, on a context of its own (its ZAP handler,
  // when the site runs over tcp).
  Status JoinSite() {
    net::GroupOptions group{.rank = 0,
                            .size = options_.site_size,
                            .master = options_.site_master,
                            .transport = options_.site_transport,
                            .host = options_.site_host,
                            .encrypt = options_.site_encrypt,
                            .insecure = options_.site_insecure};
    if (!options_.site_allow.empty()) {
      if (options_.identity.empty()) {
        return InvalidArgumentError(
            "client: --site-allow needs --identity (the key the site's workers pin)");
      }
      // This client is rank 0: its own key is the one the workers pin.
      COHORT_ASSIGN_OR_RETURN(identity_, crypto::LoadIdentity(options_.identity));
      COHORT_ASSIGN_OR_RETURN(group.allowlist, crypto::LoadAllowlist(options_.site_allow));
      group.identity = &*identity_;
      group.master_key = identity_->public_key;
    }
    COHORT_ASSIGN_OR_RETURN(site_,
                            Site::Join(site_context_, group, backend_.get(), device_data_.get()));
    spdlog::info("site of {} ranks ({}): {} samples, {} of them here", site_->size(),
                 net::Describe(group), site_->total_samples(), data_.size());
    return OkStatus();
  }

  const ClientOptions& options_;
  datasets::Dataset data_;
  std::unique_ptr<train::Backend> backend_;
  std::unique_ptr<train::DeviceDataset> device_data_;
  std::unique_ptr<train::DeviceDataset> test_data_;  // --test-data, once the model is built.
  std::optional<crypto::Ed25519KeyPair> identity_;   // With --site-allow: what the workers pin.
  zmq::context_t site_context_{1};
  std::unique_ptr<Site> site_;
  std::unique_ptr<train::Model> model_;
  config::ModelConfig model_config_;  // What `model_` was built from (the site's workers need it).
  bool finished_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<LocalTrainer>> NewNativeTrainer(const ClientOptions& options) {
  auto trainer = std::make_unique<NativeTrainer>(options);
  COHORT_RETURN_IF_ERROR(trainer->Open());
  return std::unique_ptr<LocalTrainer>(std::move(trainer));
}

}  // namespace cohort::client
