// A model's parameters are one flat float32 buffer; layers are named views
// into it. Everything that moves parameters (wire, aggregation, checkpoints)
// works on the flat buffer.
#ifndef COHORT_TRAIN_LAYOUT_H_
#define COHORT_TRAIN_LAYOUT_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace cohort::train {

struct TensorView {
  std::string name;  // e.g. "fc1.weight"
  size_t rows = 0;
  size_t cols = 1;
  size_t offset = 0;  // In floats, into the flat buffer.
  size_t size() const { return rows * cols; }
};

class ParamLayout {
 public:
  // Appends a tensor after the existing ones; returns its index.
  size_t Add(std::string name, size_t rows, size_t cols);
  const std::vector<TensorView>& tensors() const { return tensors_; }
  size_t total() const { return total_; }

  std::span<float> View(std::span<float> flat, size_t i) const {
    return flat.subspan(tensors_[i].offset, tensors_[i].size());
  }
  std::span<const float> View(std::span<const float> flat, size_t i) const {
    return flat.subspan(tensors_[i].offset, tensors_[i].size());
  }

 private:
  std::vector<TensorView> tensors_;
  size_t total_ = 0;
};

}  // namespace cohort::train

#endif  // COHORT_TRAIN_LAYOUT_H_
