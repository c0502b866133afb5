// Builds a train::Model from the run configuration's ModelConfig.
#ifndef COHORT_TRAIN_MODEL_CONFIG_H_
#define COHORT_TRAIN_MODEL_CONFIG_H_

#include <memory>

#include "proto/config.pb.h"
#include "train/model.h"

namespace cohort::train {

ModelSpec SpecFromConfig(const config::ModelConfig& config);
StatusOr<std::unique_ptr<Model>> BuildModel(const config::ModelConfig& config, Backend* backend);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_MODEL_CONFIG_H_
