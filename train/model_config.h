// Builds a train::Model from the run configuration's ModelConfig, and the
// optimizer settings from its TrainConfig.
#ifndef COHORT_TRAIN_MODEL_CONFIG_H_
#define COHORT_TRAIN_MODEL_CONFIG_H_

#include <memory>

#include "proto/config.pb.h"
#include "train/model.h"
#include "train/optimizer.h"

namespace cohort::train {

StatusOr<std::unique_ptr<Model>> BuildModel(const config::ModelConfig& config, Backend* backend);
// The optimizer settings of the train section (the one translation).
OptimizerOptions OptimizerFromConfig(const config::TrainConfig& config);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_MODEL_CONFIG_H_
