#include "net/rendezvous.h"

#include <cstring>

namespace cohort::net {
namespace {

// A report or the answer: "rank size endpoint..." as text, one field per
// frame.
std::vector<std::string> Frames(zmq::socket_t& s) {
  std::vector<std::string> out;
  zmq::message_t m;
  do {
    if (!s.recv(m, zmq::recv_flags::none)) break;
    out.push_back(m.to_string());
  } while (m.more() && out.size() < 100000);
  return out;
}

void SendFrames(zmq::socket_t& s, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    s.send(zmq::buffer(frames[i]),
           i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

bool ParseInt(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return true;
}

StatusOr<std::vector<std::string>> Host(zmq::context_t& context, int size,
                                        const std::string& master, const std::string& mine,
                                        TimeMs deadline) {
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 1000);
  router.set(zmq::sockopt::maxmsgsize, int64_t{1} << 16);
  try {
    router.bind(master);
  } catch (const zmq::error_t& e) {
    return UnavailableError("rendezvous: cannot bind " + master + ": " + e.what());
  }
  std::vector<std::string> endpoints(size), identities(size);
  endpoints[0] = mine;
  int arrived = 1;
  while (arrived < size) {
    const TimeMs now = SteadyNowMs();
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (now >= deadline || zmq::poll(&item, 1, std::chrono::milliseconds(deadline - now)) == 0) {
      if (SteadyNowMs() < deadline) continue;
      std::string missing;
      for (int r = 1; r < size; ++r) {
        if (endpoints[r].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return DeadlineExceededError("rendezvous at " + master + ": rank(s) " + missing +
                                   " did not report");
    }
    std::vector<std::string> f = Frames(router);
    int r = -1, world = -1;
    // identity, "rank", "size", endpoint
    if (f.size() != 4 || !ParseInt(f[1], r) || !ParseInt(f[2], world)) continue;  // Not ours.
    // A stray or repeated report (a stranger, a restarted pod) is ignored:
    // the first word of each rank stands.
    if (world != size || r < 1 || r >= size || !endpoints[r].empty() || f[3].empty() ||
        f[3].size() > 1024) {
      continue;
    }
    endpoints[r] = f[3];
    identities[r] = f[0];
    ++arrived;
  }
  for (int r = 1; r < size; ++r) {
    std::vector<std::string> answer = {identities[r]};
    answer.insert(answer.end(), endpoints.begin(), endpoints.end());
    SendFrames(router, answer);
  }
  return endpoints;
}

}  // namespace

static StatusOr<std::vector<std::string>> Join(zmq::context_t& context, int rank, int size,
                                               const std::string& master,
                                               const std::string& my_endpoint, TimeMs deadline) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of a world of " +
                                std::to_string(size));
  }
  if (size == 1) return std::vector<std::string>{my_endpoint};
  if (rank == 0) return Host(context, size, master, my_endpoint, deadline);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, int64_t{1} << 24);
  dealer.connect(master);
  SendFrames(dealer, {std::to_string(rank), std::to_string(size), my_endpoint});
  const TimeMs now = SteadyNowMs();
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  if (now >= deadline || zmq::poll(&item, 1, std::chrono::milliseconds(deadline - now)) == 0) {
    return DeadlineExceededError("rendezvous at " + master + ": rank 0 did not answer rank " +
                                 std::to_string(rank) + " in time");
  }
  std::vector<std::string> endpoints = Frames(dealer);
  if (endpoints.size() != static_cast<size_t>(size)) {
    return InvalidArgumentError("rendezvous: rank 0 answered with " +
                                std::to_string(endpoints.size()) + " endpoints for " +
                                std::to_string(size) + " ranks");
  }
  return endpoints;
}

StatusOr<std::vector<std::string>> Rendezvous(zmq::context_t& context, int rank, int size,
                                              const std::string& master,
                                              const std::string& my_endpoint, TimeMs deadline) {
  try {
    return Join(context, rank, size, master, my_endpoint, deadline);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("rendezvous at " + master + ": " + e.what());
  }
}

}  // namespace cohort::net
