#include "net/connection_guard.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstring>
#include <string>

#include "net/link_monitor.h"

namespace cohort::net {

PendingConnections::PendingConnections(size_t cap, TimeMs expire_ms, TimeMs report_interval_ms)
    : cap_(cap), expire_ms_(expire_ms), report_interval_ms_(report_interval_ms) {}

void PendingConnections::Expire(TimeMs now) {
  std::erase_if(pending_, [&](const auto& entry) { return now - entry.second >= expire_ms_; });
}

bool PendingConnections::OnAccepted(int fd, TimeMs now) {
  if (!last_report_) last_report_ = now;
  // A descriptor that is pending already belonged to a connection that has
  // closed unseen: the new one takes its place.
  pending_.erase(fd);
  Expire(now);
  if (pending_.size() >= cap_) {
    ++dropped_total_;
    ++unreported_;
    return false;
  }
  pending_[fd] = now;
  return true;
}

void PendingConnections::OnAuthenticated(int fd) { pending_.erase(fd); }

void PendingConnections::OnClosed(int fd) { pending_.erase(fd); }

PendingConnections::DropReport PendingConnections::TakeReport(TimeMs now, bool flush) {
  if (unreported_ == 0) return {};
  const TimeMs since = now - last_report_.value_or(now);
  if (!flush && since < report_interval_ms_ && dropped_total_ != unreported_) return {};
  // The first drop is reported at once; later ones once per interval.
  DropReport report{unreported_, since};
  unreported_ = 0;
  last_report_ = now;
  return report;
}

namespace {

std::string MonitorEndpoint() {
  static std::atomic<uint64_t> counter{0};
  return "inproc://cohort.connection-guard." + std::to_string(counter.fetch_add(1));
}

}  // namespace

ConnectionGuard::ConnectionGuard(zmq::context_t& context, zmq::socket_t& socket,
                                 const GuardOptions& options)
    : watched_(&socket),
      monitor_(context, zmq::socket_type::pair),
      options_(options),
      connections_(options.max_unauthenticated, TimeMs{options.handshake_timeout_ms} + 1000,
                   options.report_interval_ms) {}

StatusOr<std::unique_ptr<ConnectionGuard>> ConnectionGuard::Watch(zmq::context_t& context,
                                                                  zmq::socket_t& socket,
                                                                  const GuardOptions& options) {
  std::unique_ptr<ConnectionGuard> guard(new ConnectionGuard(context, socket, options));
  const std::string endpoint = MonitorEndpoint();
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return UnavailableError(std::string("cannot monitor the listening socket: ") +
                            zmq_strerror(zmq_errno()));
  }
  try {
    guard->monitor_.set(zmq::sockopt::linger, 0);
    // Connected here, before any event: libzmq's end of the monitor would
    // block its I/O thread on an event sent while no one is connected.
    guard->monitor_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(socket.handle(), nullptr, 0);
    return UnavailableError(std::string("cannot connect the connection monitor: ") + e.what());
  }
  // The monitor socket moves to the thread; thread creation orders the memory.
  guard->thread_ = std::thread([g = guard.get()] { g->Run(); });
  return guard;
}

ConnectionGuard::~ConnectionGuard() {
  // Stop the events first: libzmq blocks its I/O thread on a full monitor
  // queue, which only this guard's thread drains.
  zmq_socket_monitor(watched_->handle(), nullptr, 0);
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  Report(/*flush=*/true);
}

void ConnectionGuard::Authenticated(int fd) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  connections_.OnAuthenticated(fd);
}

size_t ConnectionGuard::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_.pending();
}

uint64_t ConnectionGuard::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_.dropped_total();
}

void ConnectionGuard::HandleEvent(uint16_t event, uint32_t value) {
  const int fd = static_cast<int>(value);
  if (event == ZMQ_EVENT_ACCEPTED) {
    bool keep;
    {
      std::lock_guard<std::mutex> lock(mu_);
      keep = connections_.OnAccepted(fd, SteadyNowMs());
    }
    // Not close(): the descriptor is ZeroMQ's. Its engine reads EOF, closes
    // the connection and frees what it had buffered.
    if (!keep) ::shutdown(fd, SHUT_RDWR);
  } else if (event == ZMQ_EVENT_DISCONNECTED) {
    std::lock_guard<std::mutex> lock(mu_);
    connections_.OnClosed(fd);
  }
}

void ConnectionGuard::Report(bool flush) {
  PendingConnections::DropReport report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    report = connections_.TakeReport(SteadyNowMs(), flush);
  }
  if (report.dropped == 0) return;
  spdlog::warn(
      "dropped {} new connection(s) in {:.1f} s: {} connections that had not authenticated "
      "were open already (the cap; each gets {} ms to authenticate)",
      report.dropped, report.span_ms / 1000.0, options_.max_unauthenticated,
      options_.handshake_timeout_ms);
}

void ConnectionGuard::Run() {
  while (!stop_.load()) {
    zmq::pollitem_t item = {monitor_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      // Bounded, so that `stop_` is seen and due reports go out.
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t&) {
      // EINTR, or the context is terminating: look at `stop_` again.
    }
    for (int budget = 0; budget < 10000 && (item.revents & ZMQ_POLLIN); ++budget) {
      std::optional<MonitorEvent> e = ReceiveMonitorEvent(monitor_);
      if (!e) break;
      HandleEvent(e->event, e->value);
    }
    Report(/*flush=*/false);
  }
}

}  // namespace cohort::net
