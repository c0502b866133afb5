// How the ranks of a data-parallel group find each other: rank 0 binds a
// ROUTER at the master address; every rank (rank 0 too) reports its rank, the
// world size and the endpoint of its transport inbox; once all have, rank 0
// answers each with the whole table. Like torchrun's static rendezvous.
#ifndef COHORT_NET_RENDEZVOUS_H_
#define COHORT_NET_RENDEZVOUS_H_

#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/status.h"

namespace cohort::net {

// endpoints[r] is rank r's inbox. kDeadlineExceeded naming the ranks that
// had not reported by `deadline` (rank 0) or that rank 0 did not answer
// (the others); kInvalidArgument for an address ZeroMQ refuses. Reports
// with another world size, a rank out of range or a rank already heard are
// ignored.
StatusOr<std::vector<std::string>> Rendezvous(zmq::context_t& context, int rank, int size,
                                              const std::string& master,
                                              const std::string& my_endpoint, TimeMs deadline);

}  // namespace cohort::net

#endif  // COHORT_NET_RENDEZVOUS_H_
