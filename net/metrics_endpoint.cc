#include "net/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

namespace cohort::net {

// What the Exposer serves: the registry, with each scrape counted so a
// finished daemon can wait for one (WaitForScrape).
class ScrapeCounter : public prometheus::Collectable {
 public:
  explicit ScrapeCounter(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    uint64_t seq;
    {
      std::lock_guard lock(mutex_);
      seq = ++started_;
    }
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    {
      std::lock_guard lock(mutex_);
      // A scrape that began earlier may end later: keep the newest begun.
      newest_answered_ = std::max(newest_answered_, seq);
      ++answered_;
    }
    answered_cv_.notify_all();
    return families;
  }

  uint64_t answered() const {
    std::lock_guard lock(mutex_);
    return answered_;
  }

  uint64_t begun() const {
    std::lock_guard lock(mutex_);
    return started_;
  }

  bool WaitForScrape(uint64_t mark, double seconds, const std::atomic<bool>& stop) const {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::max(seconds, 0.0)));
    std::unique_lock lock(mutex_);
    while (newest_answered_ <= mark) {
      if (stop.load() || Clock::now() >= deadline) return false;
      // Wakes at least every 200 ms to see `stop` (set by a signal handler,
      // which cannot notify a condition variable).
      answered_cv_.wait_until(lock,
                              std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
    }
    return true;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex mutex_;
  mutable std::condition_variable answered_cv_;
  mutable uint64_t started_ = 0;          // Scrapes begun, numbered from 1.
  mutable uint64_t newest_answered_ = 0;  // The newest begun that was answered.
  mutable uint64_t answered_ = 0;
};

namespace {

constexpr const char* kAddressForm =
    "expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any free port)";

// Why the HTTP server could not listen at `address`: the system's reason for
// a bind there (civetweb's own says only "Possible problem binding to port").
std::string WhyCannotListen(const MetricsAddress& address) {
  std::string why = "the HTTP server could not start";
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return why;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(address.port);
  ::inet_pton(AF_INET, address.host.c_str(), &sa.sin_addr);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    why = std::strerror(errno);
  }
  ::close(fd);
  return why;
}

}  // namespace

StatusOr<MetricsAddress> ParseMetricsAddress(const std::string& flag, const std::string& value) {
  auto error = [&](const std::string& what) {
    return InvalidArgumentError(flag + " " + (value.empty() ? "\"\"" : value) + ": " + what);
  };
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos) return error(std::string("no port; ") + kAddressForm);
  MetricsAddress address;
  address.host = value.substr(0, colon);
  const std::string port = value.substr(colon + 1);
  if (address.host.empty()) return error(std::string("no host; ") + kAddressForm);
  if (address.host == "localhost") address.host = "127.0.0.1";
  in_addr ignored{};
  if (::inet_pton(AF_INET, address.host.c_str(), &ignored) != 1) {
    return error("the host \"" + value.substr(0, colon) +
                 "\" is not an IPv4 address (or localhost)");
  }
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoul(port) > 65535) {
    return error("the port \"" + port + "\" is not a number in [0, 65535]");
  }
  address.port = static_cast<uint16_t>(std::stoul(port));
  return address;
}

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Create(const std::string& flag,
                                                                   const std::string& value) {
  COHORT_ASSIGN_OR_RETURN(MetricsAddress address, ParseMetricsAddress(flag, value));
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->registry_ = std::make_shared<prometheus::Registry>();
  endpoint->counter_ = std::make_shared<ScrapeCounter>(endpoint->registry_);
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(
        address.host + ":" + std::to_string(address.port), /*num_threads=*/2);
  } catch (const std::exception&) {
    return UnavailableError(flag + " " + value +
                            ": cannot listen there: " + WhyCannotListen(address));
  }
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty()) return UnavailableError(flag + " " + value + ": the HTTP server has no port");
  endpoint->port_ = static_cast<uint16_t>(ports.front());
  endpoint->url_ = "http://" + address.host + ":" + std::to_string(endpoint->port_) + "/metrics";
  endpoint->exposer_->RegisterCollectable(endpoint->counter_);
  return endpoint;
}

// The server goes first: its threads may be inside the counter.
MetricsEndpoint::~MetricsEndpoint() { exposer_.reset(); }

uint64_t MetricsEndpoint::scrapes() const { return counter_->answered(); }

uint64_t MetricsEndpoint::scrapes_begun() const { return counter_->begun(); }

bool MetricsEndpoint::WaitForScrape(uint64_t begun, double seconds,
                                    const std::atomic<bool>& stop) const {
  return counter_->WaitForScrape(begun, seconds, stop);
}

prometheus::Counter* NewCounter(prometheus::Registry& registry, const char* name,
                                const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Gauge* NewGauge(prometheus::Registry& registry, const char* name, const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace cohort::net
