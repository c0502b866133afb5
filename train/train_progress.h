// Training progress for a person watching (common/progress.h): a bar per
// epoch on a terminal, one line at each epoch's end elsewhere, with
// samples/s and the ETA.
#ifndef COHORT_TRAIN_TRAIN_PROGRESS_H_
#define COHORT_TRAIN_TRAIN_PROGRESS_H_

#include <cstdio>
#include <string>

#include "common/progress.h"
#include "train/trainer.h"

namespace cohort::train {

// A TrainOptions::progress that draws "LABEL epoch E/EPOCHS" on `out`.
// kAuto mode: a bar where `out` is a terminal, else a line per epoch.
ProgressFn EpochProgress(std::string label, uint32_t epochs, FILE* out,
                         ProgressMode mode = ProgressMode::kAuto);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_TRAIN_PROGRESS_H_
