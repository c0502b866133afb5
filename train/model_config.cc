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

OptimizerOptions OptimizerFromConfig(const config::TrainConfig& config) {
  OptimizerOptions o;
  switch (config.optimizer()) {
    case config::ADAM:
      o.kind = OptimizerKind::kAdam;
      break;
    case config::ADAMW:
      o.kind = OptimizerKind::kAdamW;
      break;
    default:
      o.kind = OptimizerKind::kSgd;
  }
  o.learning_rate = config.learning_rate();
  o.weight_decay = config.weight_decay();
  o.momentum = config.momentum();
  o.dampening = config.dampening();
  o.nesterov = config.nesterov();
  o.beta1 = config.beta1();
  o.beta2 = config.beta2();
  o.eps = config.eps();
  return o;
}

}  // namespace cohort::train
