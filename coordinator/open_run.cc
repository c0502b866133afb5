#include "coordinator/open_run.h"

#include <cstdio>
#include <filesystem>

#include "datasets/shard.h"
#include "proto/config_io.h"
#include "train/model_config.h"

#ifndef COHORT_VERSION
#define COHORT_VERSION "unknown"
#endif

namespace cohort::coordinator {

StatusOr<OpenRun> OpenFederatedRun(const config::RunConfig& config, const std::string& run_dir,
                                   const datasets::Dataset* test_set, const std::string& role) {
  if (config.mode() == config::DATA_PARALLEL) {
    return InvalidArgumentError(
        "mode: DATA_PARALLEL runs under `cohort launch` or `cohort worker`");
  }
  OpenRun run;
  COHORT_ASSIGN_OR_RETURN(run.lock, store::RunDirLock::Acquire(run_dir, role));
  COHORT_ASSIGN_OR_RETURN(run.backend, train::NewCpuBackend(1));
  COHORT_ASSIGN_OR_RETURN(run.model, train::BuildModel(config.model(), run.backend.get()));
  std::vector<float> init(run.model->num_params());
  run.model->Init(init, config.seed());

  Evaluator evaluator;
  if (test_set != nullptr ||
      (config.data().has_test_shard() && !config.data().test_shard().empty())) {
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
    evaluator = [model = run.model.get(), test = run.test,
                 eval_batch](std::span<const float> params) -> StatusOr<EvalMetrics> {
      COHORT_ASSIGN_OR_RETURN(train::EvalResult r,
                              train::Evaluate(*model, params, *test, eval_batch));
      return EvalMetrics{r.loss, r.accuracy};
    };
  }
  COHORT_ASSIGN_OR_RETURN(run.store, store::OpenSqliteRunStore(run_dir + "/run.db"));
  COHORT_ASSIGN_OR_RETURN(run.engine, RoundEngine::Create(config, std::move(init), run.store.get(),
                                                          evaluator, COHORT_VERSION));
  return run;
}

}  // namespace cohort::coordinator
