// MpiRanks::Join where Cohort was built without MPI (sim/mpi_executors.h):
// it says how to get it, since N copies of one simulation would each run
// all of it into the same run directory.
#include "sim/mpi_executors.h"

namespace cohort::sim {

StatusOr<std::unique_ptr<MpiRanks>> MpiRanks::Join(int expected, const std::string& source) {
  return UnimplementedError("simulate: " + source + " says this is one of " +
                            std::to_string(expected) +
                            " ranks, and this cohort was built without MPI (install Debian's "
                            "libopenmpi-dev and build with -Dmpi=enabled), so each rank would run "
                            "the whole simulation into the same run directory");
}

}  // namespace cohort::sim
