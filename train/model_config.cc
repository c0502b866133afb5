#include "train/model_config.h"

namespace cohort::train {

ModelSpec SpecFromConfig(const config::ModelConfig& config) {
  ModelSpec spec;
  spec.arch = config.arch();
  spec.input_dim = config.input_dim();
  spec.num_classes = config.num_classes();
  spec.hidden.assign(config.hidden().begin(), config.hidden().end());
  return spec;
}

StatusOr<std::unique_ptr<Model>> BuildModel(const config::ModelConfig& config, Backend* backend) {
  return Model::Create(SpecFromConfig(config), backend);
}

}  // namespace cohort::train
