#include "coordinator/open_run.h"

#include <cstdio>
#include <filesystem>

#include "coordinator/noise_key.h"
#include "datasets/shard.h"
#include "proto/config_io.h"
#include "train/model_config.h"
#include "train/npz.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::coordinator {
namespace {

// The server-side evaluator on `test_set` or data.test_shard, or none (no
// test set). Fills run.backend, run.model and run.test, which it uses.
StatusOr<Evaluator> CentralEvaluator(const config::RunConfig& config,
                                     const datasets::Dataset* test_set, OpenRun& run) {
  if (test_set == nullptr &&
      (!config.data().has_test_shard() || config.data().test_shard().empty())) {
    return Evaluator();
  }
  datasets::Dataset data;
  if (test_set == nullptr) {
    COHORT_ASSIGN_OR_RETURN(data, datasets::ReadShard(config.data().test_shard()));
  }
  const datasets::Dataset& tests = test_set != nullptr ? *test_set : data;
  const std::string what = test_set != nullptr ? "test set" : config.data().test_shard();
  COHORT_RETURN_IF_ERROR(train::CheckCompatible(*run.model, tests).WithContext(what));
  COHORT_ASSIGN_OR_RETURN(run.test, train::DeviceDataset::Upload(run.backend.get(), tests));
  // Batches within the training step's memory cap, whatever the model.
  const uint32_t eval_batch = config::EvalBatchSize(config.model());
  return Evaluator([model = run.model.get(), test = run.test,
                    eval_batch](std::span<const float> params) -> StatusOr<EvalMetrics> {
    COHORT_ASSIGN_OR_RETURN(train::EvalResult r,
                            train::Evaluate(*model, params, *test, eval_batch));
    return EvalMetrics{r.loss, r.accuracy};
  });
}

// A model.external run without --initial-model: none when the run has
// committed a round (the engine resumes from its checkpoint), else an error.
StatusOr<std::vector<float>> ResumedExternalModel(store::RunStore& store) {
  COHORT_ASSIGN_OR_RETURN(std::optional<store::RunInfo> existing, store.LoadRun());
  if (existing.has_value() && existing->last_round > 0) return std::vector<float>();
  return InvalidArgumentError(
      "--initial-model: a new run of a model the clients bring (model.external) starts from "
      "its initial values: an .npz, as cohort.torch.save_initial(model, path) writes");
}

}  // namespace

StatusOr<OpenRun> OpenFederatedRun(const config::RunConfig& config, const std::string& run_dir,
                                   const datasets::Dataset* test_set, const std::string& role,
                                   const std::string& initial_model) {
  if (config.mode() == config::DATA_PARALLEL) {
    return InvalidArgumentError(
        "mode: DATA_PARALLEL runs under `cohort launch` or `cohort worker`");
  }
  const bool external = config.model().has_external();
  if (!external && !initial_model.empty()) {
    return InvalidArgumentError(
        "--initial-model: only a model the clients bring (model.external) takes one; Cohort's "
        "own models start from the config's seed");
  }
  OpenRun run;
  COHORT_ASSIGN_OR_RETURN(run.lock, store::RunDirLock::Acquire(run_dir, role));
  std::vector<float> init;
  Evaluator evaluator;
  if (!external) {
    COHORT_ASSIGN_OR_RETURN(run.backend, train::NewCpuBackend(1));
    COHORT_ASSIGN_OR_RETURN(run.model, train::BuildModel(config.model(), run.backend.get()));
    init.resize(run.model->num_params());
    run.model->Init(init, config.seed());
    COHORT_ASSIGN_OR_RETURN(evaluator, CentralEvaluator(config, test_set, run));
  } else if (!initial_model.empty()) {
    COHORT_ASSIGN_OR_RETURN(init,
                            train::LoadInitialModel(initial_model, config.model().external()));
  }
  COHORT_ASSIGN_OR_RETURN(run.store, store::OpenSqliteRunStore(run_dir + "/run.db"));
  if (external && initial_model.empty()) {
    COHORT_ASSIGN_OR_RETURN(init, ResumedExternalModel(*run.store));
  }
  if (config.has_fedbuff()) {
    COHORT_ASSIGN_OR_RETURN(
        run.fedbuff,
        FedBuffEngine::Create(config, std::move(init), run.store.get(), evaluator, COHORT_VERSION));
    return run;
  }
  COHORT_ASSIGN_OR_RETURN(run.engine, RoundEngine::Create(config, std::move(init), run.store.get(),
                                                          evaluator, COHORT_VERSION));
  if (config.has_privacy()) {
    // Made before the first round, needed by every later start (noise_key.h).
    COHORT_ASSIGN_OR_RETURN(SecretBytes key,
                            LoadOrCreateNoiseKey(run_dir + "/" + kNoiseKeyFile,
                                                 run.engine->last_committed_round() == 0));
    run.engine->SetNoiseKey(std::move(key));
  }
  return run;
}

}  // namespace cohort::coordinator
