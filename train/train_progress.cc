#include "train/train_progress.h"

#include <memory>

namespace cohort::train {

ProgressFn EpochProgress(std::string label, uint32_t epochs, FILE* out, ProgressMode mode) {
  struct State {
    uint32_t epoch = UINT32_MAX;
    std::unique_ptr<Progress> bar;
  };
  auto state = std::make_shared<State>();
  return [state, label = std::move(label), epochs, out, mode](uint32_t epoch, uint64_t done,
                                                              uint64_t total) {
    if (state->epoch != epoch) {
      state->epoch = epoch;
      // Off a terminal only the epoch's end is written: one line per epoch.
      state->bar = std::make_unique<Progress>(
          label + (label.empty() ? "" : " ") + "epoch " + std::to_string(epoch + 1) + "/" +
              std::to_string(epochs),
          total, out,
          ProgressOptions{.unit = "samples", .mode = mode, .line_percent_step = 100, .clock = {}});
    }
    state->bar->Update(done);
    if (done >= total) state->bar->Finish();
  };
}

}  // namespace cohort::train
