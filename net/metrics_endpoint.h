// The Prometheus metrics endpoint of the daemons (--metrics-addr HOST:PORT):
// an HTTP server (prometheus-cpp's Exposer) that serves one Registry's
// families at /metrics in the text exposition format. What goes into the
// registry is each daemon's own (coordinator/metrics.h, client/metrics.h,
// worker/metrics.h); this file only listens, serves and counts scrapes.
#ifndef COHORT_NET_METRICS_ENDPOINT_H_
#define COHORT_NET_METRICS_ENDPOINT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Registry;
}  // namespace prometheus

namespace cohort::net {

// A --metrics-addr value, checked: an IPv4 address (or "localhost", taken
// as 127.0.0.1) and a port, 0 for any free one.
struct MetricsAddress {
  std::string host;
  uint16_t port = 0;
};

// "HOST:PORT" into a MetricsAddress; kInvalidArgument naming `flag` and
// `value` and saying what is wrong (no port, a port out of range, a host
// that is no IPv4 address).
StatusOr<MetricsAddress> ParseMetricsAddress(const std::string& flag, const std::string& value);

// A family of one unlabelled series in `registry`, and the series: how the
// daemons' metrics (client/metrics, worker/metrics) register their plain
// counters and gauges.
prometheus::Counter* NewCounter(prometheus::Registry& registry, const char* name, const char* help);
prometheus::Gauge* NewGauge(prometheus::Registry& registry, const char* name, const char* help);

class ScrapeCounter;

// Owns the registry and the HTTP server. The server's threads read the
// registry while the daemon updates it (prometheus-cpp's metrics are
// thread-safe); every member here may be called from any thread.
class MetricsEndpoint {
 public:
  // Parses `value` (ParseMetricsAddress) and listens there. Errors name
  // `flag` and `value`: kInvalidArgument for a malformed address,
  // kUnavailable when it cannot listen (the port in use, an address that is
  // not this host's), with the system's reason.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> Create(const std::string& flag,
                                                           const std::string& value);
  ~MetricsEndpoint();  // Stops serving (answers in flight are finished).
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Where the metrics are served: "http://127.0.0.1:41234/metrics", with
  // the port the system chose for port 0.
  const std::string& url() const { return url_; }
  uint16_t port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

  // Scrapes answered so far.
  uint64_t scrapes() const;
  // Scrapes begun so far: a scrape begun after this call reads every value
  // set before it.
  uint64_t scrapes_begun() const;
  // Serves until a scrape begun after the `begun`-th (scrapes_begun()) has
  // been answered (true), `seconds` passed or `stop` became true (false).
  // Blocks; reads the real clock. So a process that has finished still
  // hands its final values to a scraper.
  bool WaitForScrape(uint64_t begun, double seconds, const std::atomic<bool>& stop) const;

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeCounter> counter_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string url_;
  uint16_t port_ = 0;
};

}  // namespace cohort::net

#endif  // COHORT_NET_METRICS_ENDPOINT_H_
