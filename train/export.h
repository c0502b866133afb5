// A run's model written for PyTorch (`cohort export`, issue 33): the
// state_dict under PyTorch's names and layouts (train/torch_layout for
// Cohort's own models; the config's layout for a model the clients bring),
// as an .npz (numpy.load) or as the file torch.save writes (torch.load, then
// load_state_dict). Both are written here with libzip: PyTorch's format is a
// zip of a protocol-2 pickle and the raw float32 storages, and no Debian C++
// library writes it without linking libtorch into `cohort`.
#ifndef COHORT_TRAIN_EXPORT_H_
#define COHORT_TRAIN_EXPORT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::train {

struct NamedTensor {
  std::string name;             // "0.weight", or the layout's name.
  std::vector<uint64_t> shape;  // Empty: a 0-d tensor.
  std::vector<float> values;    // Row-major.
};

// The state_dict of `model` holding `flat` (Cohort's flat vector, as the
// run store keeps it). A model the clients bring takes its layout's names
// and shapes, or with no layout one tensor "flat". kInvalidArgument naming
// both sizes when `flat` is not the model's size.
StatusOr<std::vector<NamedTensor>> TorchStateDict(const config::ModelConfig& model,
                                                  std::span<const float> flat);

// numpy.savez of the tensors (float32, uncompressed), in order.
Status WriteNpz(const std::string& path, const std::vector<NamedTensor>& tensors);
// torch.save of an OrderedDict of float32 CPU tensors, in order: torch.load
// gives a state_dict that nn.Module.load_state_dict takes.
Status WriteTorchStateDict(const std::string& path, const std::vector<NamedTensor>& tensors);

// An ONNX model (opset 13, Debian's libonnx protos) of Cohort's own `model`
// holding `flat`, for inference: input "input" [N, C, H, W] (or [N,
// features] for linear layers only), output "logits" [N, num_classes]; one
// node per layer (Gemm, Conv, MaxPool, Relu, Flatten) with the weights as
// initializers named as in the state_dict. kInvalidArgument for a model the
// clients bring: Cohort holds no graph of it.
Status WriteOnnx(const std::string& path, const config::ModelConfig& model,
                 std::span<const float> flat);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_EXPORT_H_
