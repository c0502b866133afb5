#include "train/layout.h"

namespace cohort::train {

size_t ParamLayout::Add(std::string name, size_t rows, size_t cols) {
  tensors_.push_back(TensorView{std::move(name), rows, cols, total_});
  total_ += rows * cols;
  return tensors_.size() - 1;
}

}  // namespace cohort::train
