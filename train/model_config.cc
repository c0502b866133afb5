#include "train/model_config.h"

#include "proto/config_io.h"

namespace cohort::train {

StatusOr<std::unique_ptr<Model>> BuildModel(const config::ModelConfig& config, Backend* backend) {
  COHORT_ASSIGN_OR_RETURN(NetSpec net, config::NetFromConfig(config));
  StatusOr<std::unique_ptr<Model>> model = Model::Create(net, backend);
  if (!model.ok()) return model.status().WithContext("model");
  return model;
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
  o.proximal_mu = config.proximal_mu();
  return o;
}

}  // namespace cohort::train
