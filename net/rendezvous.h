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
#include "crypto/key_files.h"

namespace cohort::net {

// Authentication at the rendezvous: rank 0's ROUTER is a CURVE server (its
// context's ZAP handler admits the allowlist), the others pin its key. Each
// rank is then known by its allowlist name, which rank 0 hands out with the
// endpoints: a rank's transport can check that rank r's messages come from
// rank r's key.
struct RendezvousSecurity {
  const crypto::CurveKeys* mine = nullptr;
  crypto::X25519Public master{};              // Rank 0's CURVE key (ranks > 0).
  std::string my_name;                        // This rank's allowlist name (rank 0).
  std::vector<std::string>* names = nullptr;  // Out: each rank's name.
};

// endpoints[r] is rank r's inbox. kDeadlineExceeded naming the ranks that
// had not reported by `deadline` (rank 0) or that rank 0 did not answer
// (the others); kInvalidArgument for an address ZeroMQ refuses. Reports
// with another world size, a rank out of range or a rank already heard are
// ignored.
StatusOr<std::vector<std::string>> Rendezvous(zmq::context_t& context, int rank, int size,
                                              const std::string& master,
                                              const std::string& my_endpoint, TimeMs deadline,
                                              const RendezvousSecurity* security = nullptr);

}  // namespace cohort::net

#endif  // COHORT_NET_RENDEZVOUS_H_
