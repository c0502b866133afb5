#include "net/rendezvous.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "net/curve.h"

namespace cohort::net {
namespace {

// A report or the answer: "rank size endpoint..." as text, one field per
// frame. The whole message is read, always; one of more than `max_frames`
// frames comes back empty (never parsed from its middle).
std::vector<std::string> Frames(zmq::socket_t& s, size_t max_frames,
                                std::string* user_id = nullptr) {
  std::vector<std::string> out;
  zmq::message_t m;
  bool too_many = false;
  do {
    if (!s.recv(m, zmq::recv_flags::none)) break;
    if (out.size() == max_frames) too_many = true;
    if (too_many) continue;
    out.push_back(m.to_string());
    // The ZAP User-Id (an allowlist name) rides on the peer's frames.
    if (user_id != nullptr && out.size() == 2) {
      const char* user = zmq_msg_gets(m.handle(), "User-Id");
      *user_id = user != nullptr ? user : "";
    }
  } while (m.more());
  if (too_many) out.clear();
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
                                        TimeMs deadline, const RendezvousSecurity* security) {
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 1000);
  // A report is three short fields: no frame needs more.
  router.set(zmq::sockopt::maxmsgsize, int64_t{4096});
  if (security != nullptr) COHORT_RETURN_IF_ERROR(SetUpCurveServer(router, *security->mine));
  try {
    router.bind(master);
  } catch (const zmq::error_t& e) {
    return UnavailableError("rendezvous: cannot bind " + master + ": " + e.what());
  }
  std::vector<std::string> endpoints(size), identities(size), names(size);
  endpoints[0] = mine;
  if (security != nullptr) names[0] = security->my_name;
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
    std::string name;
    std::vector<std::string> f = Frames(router, 4, &name);
    int r = -1, world = -1;
    // identity, "rank", "size", endpoint
    if (f.size() != 4 || !ParseInt(f[1], r) || !ParseInt(f[2], world)) continue;  // Not ours.
    // A stray or repeated report (a stranger, a restarted pod) is ignored:
    // the first word of each rank stands.
    if (world != size || r < 1 || r >= size || !endpoints[r].empty() || f[3].empty() ||
        f[3].size() > 1024) {
      continue;
    }
    // With CURVE, one key is one rank: a second rank with a key already
    // heard is ignored like any repeated report.
    if (security != nullptr &&
        (name.empty() || std::find(names.begin(), names.end(), name) != names.end())) {
      spdlog::warn(
          "rendezvous: ignored rank {}'s report: its key ({}) already joined as another "
          "rank",
          r, name.empty() ? "no name" : name);
      continue;
    }
    names[r] = name;
    endpoints[r] = f[3];
    identities[r] = f[0];
    ++arrived;
  }
  for (int r = 1; r < size; ++r) {
    std::vector<std::string> answer = {identities[r]};
    answer.insert(answer.end(), endpoints.begin(), endpoints.end());
    if (security != nullptr) answer.insert(answer.end(), names.begin(), names.end());
    SendFrames(router, answer);
  }
  if (security != nullptr && security->names != nullptr) *security->names = names;
  return endpoints;
}

}  // namespace

static StatusOr<std::vector<std::string>> Join(zmq::context_t& context, int rank, int size,
                                               const std::string& master,
                                               const std::string& my_endpoint, TimeMs deadline,
                                               const RendezvousSecurity* security) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of a world of " +
                                std::to_string(size));
  }
  if (size == 1) {
    if (security != nullptr && security->names != nullptr) *security->names = {security->my_name};
    return std::vector<std::string>{my_endpoint};
  }
  if (rank == 0) return Host(context, size, master, my_endpoint, deadline, security);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, int64_t{1} << 24);
  if (security != nullptr) {
    COHORT_RETURN_IF_ERROR(SetUpCurveClient(dealer, *security->mine, security->master));
  }
  dealer.connect(master);
  SendFrames(dealer, {std::to_string(rank), std::to_string(size), my_endpoint});
  const TimeMs now = SteadyNowMs();
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  if (now >= deadline || zmq::poll(&item, 1, std::chrono::milliseconds(deadline - now)) == 0) {
    return DeadlineExceededError("rendezvous at " + master + ": rank 0 did not answer rank " +
                                 std::to_string(rank) + " in time");
  }
  const size_t expected = static_cast<size_t>(size) * (security != nullptr ? 2 : 1);
  std::vector<std::string> endpoints = Frames(dealer, expected);
  if (endpoints.size() != expected) {
    return InvalidArgumentError("rendezvous: rank 0 answered with " +
                                std::to_string(endpoints.size()) + " fields for " +
                                std::to_string(size) + " ranks");
  }
  if (security != nullptr) {
    if (security->names != nullptr) {
      security->names->assign(endpoints.begin() + size, endpoints.end());
    }
    endpoints.resize(size);
  }
  return endpoints;
}

StatusOr<std::vector<std::string>> Rendezvous(zmq::context_t& context, int rank, int size,
                                              const std::string& master,
                                              const std::string& my_endpoint, TimeMs deadline,
                                              const RendezvousSecurity* security) {
  try {
    return Join(context, rank, size, master, my_endpoint, deadline, security);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("rendezvous at " + master + ": " + e.what());
  }
}

}  // namespace cohort::net
