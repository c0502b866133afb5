// JoinMpi where Cohort was built without MPI (net/join.h): it says how to
// get it.
#include "net/join.h"

namespace cohort::net {

StatusOr<std::unique_ptr<collective::Transport>> JoinMpi(const JoinRequest&) {
  return UnimplementedError(
      "this cohort was built without MPI (install Debian's libopenmpi-dev and build with "
      "-Dmpi=enabled)");
}

}  // namespace cohort::net
