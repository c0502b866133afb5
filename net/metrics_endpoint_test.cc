#include "net/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace cohort::net {
namespace {

// GET `path` from 127.0.0.1:`port` (HTTP/1.0: the server closes when done);
// the whole response, or "" when nothing answered.
std::string HttpGet(uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  std::string response;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
    }
  }
  ::close(fd);
  return response;
}

std::string ErrorOf(const std::string& value) {
  auto parsed = ParseMetricsAddress("--metrics-addr", value);
  EXPECT_FALSE(parsed.ok()) << value;
  return parsed.ok() ? "" : parsed.status().message();
}

TEST(MetricsEndpointTest, AddressErrorsNameTheFlagTheValueAndWhatIsWrong) {
  EXPECT_EQ(ErrorOf("127.0.0.1"),
            "--metrics-addr 127.0.0.1: no port; expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: "
            "any free port)");
  EXPECT_EQ(ErrorOf(":9464"),
            "--metrics-addr :9464: no host; expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any "
            "free port)");
  EXPECT_EQ(ErrorOf("metrics.example:9464"),
            "--metrics-addr metrics.example:9464: the host \"metrics.example\" is not an IPv4 "
            "address (or localhost)");
  EXPECT_EQ(ErrorOf("999.1.1.1:9464"),
            "--metrics-addr 999.1.1.1:9464: the host \"999.1.1.1\" is not an IPv4 address (or "
            "localhost)");
  EXPECT_EQ(ErrorOf("127.0.0.1:70000"),
            "--metrics-addr 127.0.0.1:70000: the port \"70000\" is not a number in [0, 65535]");
  EXPECT_EQ(ErrorOf("127.0.0.1:http"),
            "--metrics-addr 127.0.0.1:http: the port \"http\" is not a number in [0, 65535]");
  EXPECT_EQ(ErrorOf("tcp://127.0.0.1:9464"),
            "--metrics-addr tcp://127.0.0.1:9464: the host \"tcp://127.0.0.1\" is not an IPv4 "
            "address (or localhost)");
  auto ok = ParseMetricsAddress("--metrics-addr", "localhost:0");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->host, "127.0.0.1");
  EXPECT_EQ(ok->port, 0);
}

TEST(MetricsEndpointTest, PortZeroServesTheRegistryAtTheUrlItNames) {
  auto endpoint = MetricsEndpoint::Create("--metrics-addr", "127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  MetricsEndpoint& e = **endpoint;
  ASSERT_NE(e.port(), 0);
  EXPECT_EQ(e.url(), "http://127.0.0.1:" + std::to_string(e.port()) + "/metrics");
  prometheus::BuildCounter()
      .Name("cohort_test_things_total")
      .Help("Things")
      .Register(e.registry())
      .Add({})
      .Increment(3);
  EXPECT_EQ(e.scrapes(), 0u);
  const std::string body = HttpGet(e.port(), "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE cohort_test_things_total counter"), std::string::npos) << body;
  EXPECT_NE(body.find("cohort_test_things_total 3"), std::string::npos) << body;
  EXPECT_EQ(e.scrapes(), 1u);
}

TEST(MetricsEndpointTest, APortInUseIsAnErrorWithTheSystemsReason) {
  auto first = MetricsEndpoint::Create("--metrics-addr", "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsEndpoint::Create("--metrics-addr", taken);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            "--metrics-addr " + taken + ": cannot listen there: Address already in use");
}

TEST(MetricsEndpointTest, WaitForScrapeReturnsOnceAScrapeBegunAfterTheMarkIsAnswered) {
  auto endpoint = MetricsEndpoint::Create("--metrics-addr", "127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  MetricsEndpoint& e = **endpoint;
  const std::atomic<bool> no_stop{false};
  const uint64_t begun = e.scrapes_begun();
  EXPECT_EQ(begun, 0u);
  HttpGet(e.port(), "/metrics");
  EXPECT_EQ(e.scrapes_begun(), 1u);
  // A scrape begun after the mark ends the wait at once, also when it was
  // answered before the wait began.
  EXPECT_TRUE(e.WaitForScrape(begun, 60, no_stop));
  const uint64_t mark = e.scrapes_begun();
  // No scraper since the mark: the bound ends it.
  EXPECT_FALSE(e.WaitForScrape(mark, 0.05, no_stop));
  std::atomic<bool> waiting_done{false};
  std::thread scraper([&] {
    // Scrapes until the waiter has seen one (bounded: at most 1000).
    for (int i = 0; i < 1000 && !waiting_done.load(); ++i) HttpGet(e.port(), "/metrics");
  });
  EXPECT_TRUE(e.WaitForScrape(mark, 60, no_stop));
  waiting_done = true;
  scraper.join();
  EXPECT_GE(e.scrapes(), 2u);
}

TEST(MetricsEndpointTest, WaitForScrapeEndsAtOnceWhenStopped) {
  auto endpoint = MetricsEndpoint::Create("--metrics-addr", "127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  const std::atomic<bool> stop{true};
  EXPECT_FALSE((*endpoint)->WaitForScrape((*endpoint)->scrapes_begun(), 600, stop));
}

}  // namespace
}  // namespace cohort::net
