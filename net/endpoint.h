// ZeroMQ endpoints as a person writes them on the command line.
#ifndef COHORT_NET_ENDPOINT_H_
#define COHORT_NET_ENDPOINT_H_

#include <string>

#include "common/status.h"

namespace cohort::net {

// OK for tcp://HOST:PORT, ipc://PATH and inproc://NAME; otherwise an error
// naming `flag` and, for a bare HOST:PORT, the endpoint that was meant
// ("--bind 127.0.0.1:7000: ... did you mean tcp://127.0.0.1:7000?").
Status CheckEndpoint(const std::string& flag, const std::string& endpoint);

}  // namespace cohort::net

#endif  // COHORT_NET_ENDPOINT_H_
