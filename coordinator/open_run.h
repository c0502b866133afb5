// Opening a federated run, as the coordinator daemon and the simulator both
// do: the initial model (from the seed, or for a model the clients bring
// from --initial-model's .npz), the evaluator on the config's test shard, the SQLite store in the
// run directory, and the round engine on top (created, or resumed after the last committed round).
#ifndef COHORT_COORDINATOR_OPEN_RUN_H_
#define COHORT_COORDINATOR_OPEN_RUN_H_

#include <memory>
#include <string>

#include "coordinator/fedbuff_engine.h"
#include "coordinator/protocol_engine.h"
#include "coordinator/round_engine.h"
#include "datasets/dataset.h"
#include "store/run_dir_lock.h"
#include "store/run_store.h"
#include "train/backend.h"
#include "train/trainer.h"

namespace cohort::coordinator {

struct OpenRun {
  // The run directory's lock (store/run_dir_lock.h): first, so it is
  // released last.
  std::unique_ptr<store::RunDirLock> lock;
  // The evaluator's backend, model and test set: the engine holds an
  // evaluator that uses them, so they live as long as it. None for a model
  // the clients bring (model.external): only they can run it.
  std::unique_ptr<train::Backend> backend;
  std::unique_ptr<train::Model> model;
  std::shared_ptr<train::DeviceDataset> test;
  std::unique_ptr<store::RunStore> store;
  // Synchronous rounds: `engine`; a fedbuff run: `fedbuff` (engine null).
  std::unique_ptr<RoundEngine> engine;
  std::unique_ptr<FedBuffEngine> fedbuff;

  // Whichever of the two the run has, as a driver sees it.
  ProtocolEngine* protocol() const {
    return fedbuff ? static_cast<ProtocolEngine*>(fedbuff.get()) : engine.get();
  }
};

// kInvalidArgument for a data-parallel config; kFailedPrecondition, naming
// the holder's pid, when another process holds the run directory; the
// store's and the test shard's errors name the file. `test_set`, when given, is evaluated on
// instead of data.test_shard. `initial_model`: an .npz (train/npz.h) of a
// model.external run's initial values, needed until its first round is
// committed (kInvalidArgument without it); refused for Cohort's own models,
// whose initial values come from the seed.
StatusOr<OpenRun> OpenFederatedRun(const config::RunConfig& config, const std::string& run_dir,
                                   const datasets::Dataset* test_set = nullptr,
                                   const std::string& role = "cohort coordinator",
                                   const std::string& initial_model = "");

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_OPEN_RUN_H_
