// `mpirun -np N cohort simulate` (or srun): the simulation over the ranks
// of an MPI job. Rank 0 runs what a single process runs (the round engine,
// the clients' sessions, the virtual clock, the run store) except the
// training: each job goes to a hosting rank (1..N-1), which loads the same
// clients' data, trains it on its own ExecutorPool and sends the result
// back. What rank 0 computes does not depend on which rank trained a job,
// so the final model is the single process's, bit for bit. Open MPI moves
// the bytes (shared memory on one host, its own network between hosts);
// built with the Meson feature `mpi`, else Join says so.
#ifndef COHORT_SIM_MPI_EXECUTORS_H_
#define COHORT_SIM_MPI_EXECUTORS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "sim/executors.h"

namespace cohort::sim {

// The world size this process's launcher announces in its environment:
// OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), PMI_SIZE (srun --mpi=pmi2,
// MPICH), or SLURM_STEP_NUM_TASKS beside PMIX_RANK (srun --mpi=pmix); 1
// when none is set. `source` gets the variable's name. kInvalidArgument
// naming a variable that is not a positive number.
StatusOr<int> LauncherWorldSize(std::string* source);

// The ranks of one simulation. Every call from one thread (MPI is
// initialised MPI_THREAD_FUNNELED). Destroying it on rank 0 stops every
// hosting rank and waits (30 s at most) for each to say it has stopped,
// then finalises MPI; a rank that does not answer makes it MPI_Abort the
// job instead of hanging.
class MpiRanks {
 public:
  // Initialises MPI. kFailedPrecondition when MPI's world is not
  // `expected` ranks (what `source` said); kUnimplemented in a build
  // without MPI, saying how to get it.
  static StatusOr<std::unique_ptr<MpiRanks>> Join(int expected, const std::string& source);
  MpiRanks() = default;
  MpiRanks(const MpiRanks&) = delete;
  MpiRanks& operator=(const MpiRanks&) = delete;
  virtual ~MpiRanks() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Rank 0: waits for every hosting rank's hello, then returns their
  // executors (which must go before this object). A rank whose set-up
  // failed is that error, prefixed "rank N: "; one whose clients' digest
  // (ClientsDigest) is not `digest` is kFailedPrecondition naming it and
  // both counts. Errors of MPI itself are kUnavailable.
  virtual StatusOr<std::unique_ptr<Executors>> Hosts(uint64_t digest, size_t clients) = 0;

  // A hosting rank: says hello (`setup`'s error, or `digest`, `clients`
  // and `pool`'s size), then trains rank 0's jobs on `pool` (null when
  // `setup` failed) until rank 0 says stop. A job rank 0 cancels is
  // cancelled here too.
  virtual Status Serve(const Status& setup, uint64_t digest, size_t clients,
                       ExecutorPool* pool) = 0;
};

}  // namespace cohort::sim

#endif  // COHORT_SIM_MPI_EXECUTORS_H_
