#include "privacy/rdp_wor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace cohort::privacy {
namespace {

double RdpAt(double q, double z, double order) {
  const std::vector<double> orders = {order};
  return SampledWithoutReplacementGaussianRdp(q, z, orders)[0];
}

// Every line of tests/data/rdp_wor_golden.txt: Theorem 27's bound summed in
// 400-digit decimals by make_rdp_wor_golden.py (which also checks that a
// float transcription of dp_accounting's algorithm agrees with it).
TEST(RdpWorTest, MatchesDecimalComputation) {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/rdp_wor_golden.txt");
  ASSERT_TRUE(in) << "tests/data/rdp_wor_golden.txt";
  std::string line;
  int rdp_lines = 0, eps_lines = 0;
  double worst_rdp = 0, worst_eps = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "rdp") {
      double q, z, order, want;
      ASSERT_TRUE(s >> q >> z >> order >> want) << line;
      const double got = RdpAt(q, z, order);
      const double rel = std::abs(got - want) / std::max(want, 1e-300);
      worst_rdp = std::max(worst_rdp, rel);
      EXPECT_LT(rel, 1e-6) << line << " -> " << got;
      ++rdp_lines;
    } else if (kind == "eps") {
      double q, z, delta, want, order;
      uint64_t steps;
      ASSERT_TRUE(s >> q >> z >> steps >> delta >> want >> order) << line;
      RdpAccountant accountant;
      ASSERT_TRUE(ComposeSampledWithoutReplacement(accountant, q, z, steps).ok());
      auto spent = accountant.Spent(delta);
      ASSERT_TRUE(spent.ok());
      const double rel = std::abs(spent->epsilon - want) / want;
      worst_eps = std::max(worst_eps, rel);
      EXPECT_LT(rel, 1e-6) << line << " -> " << spent->epsilon;
      EXPECT_EQ(spent->order, order) << line;
      ++eps_lines;
    } else {
      FAIL() << "unknown line: " << line;
    }
  }
  EXPECT_EQ(rdp_lines, 385);
  EXPECT_EQ(eps_lines, 210);
  std::printf("decimal Theorem 27 vs C++: worst relative difference rdp %.3g, epsilon %.3g\n",
              worst_rdp, worst_eps);
}

TEST(RdpWorTest, ClosedFormsAndLimits) {
  // q = 1: the Gaussian mechanism itself, alpha / (2 z^2).
  EXPECT_DOUBLE_EQ(RdpAt(1.0, 2.0, 3.0), 3.0 / 8.0);
  EXPECT_EQ(RdpAt(0.0, 1.0, 3.0), 0.0);
  EXPECT_TRUE(std::isinf(RdpAt(0.1, 0.0, 3.0)));
  EXPECT_TRUE(std::isinf(RdpAt(0.1, 1.0, INFINITY)));
  // Order 2 in closed form: log(1 + q^2 min(4 (e^{1/z^2} - 1), 2 e^{1/z^2})).
  const double z = 1.5, q = 0.02, e2 = std::exp(1 / (z * z));
  EXPECT_NEAR(RdpAt(q, z, 2.0), std::log1p(q * q * std::min(4 * (e2 - 1), 2 * e2)), 1e-15);
  // Below order 2 the interpolation from log A_1 = 0 makes the RDP flat.
  EXPECT_DOUBLE_EQ(RdpAt(q, z, 1.5), RdpAt(q, z, 2.0));
  // Sampling amplifies, and more noise or a smaller fraction spends less.
  EXPECT_LT(RdpAt(0.01, 1.0, 8.0), 0.01 * RdpAt(1.0, 1.0, 8.0));
  EXPECT_LT(RdpAt(0.01, 2.0, 8.0), RdpAt(0.01, 1.0, 8.0));
  EXPECT_LT(RdpAt(0.01, 1.0, 8.0), RdpAt(0.05, 1.0, 8.0));
}

// Above order 256 only the cap of each term is used (dp_accounting's
// branch): still finite, and never below the differenced bound at 256.
TEST(RdpWorTest, LargeOrdersUseTheCap) {
  const double at256 = RdpAt(0.001, 8.0, 256), at257 = RdpAt(0.001, 8.0, 257);
  EXPECT_TRUE(std::isfinite(at257));
  EXPECT_GE(at257, at256);
}

// DP-FedAvg's noise sigma C spends more under the replace-one analysis of a
// fixed-size cohort (z = sigma / 2) than the add/remove Poisson figure at
// the same q (z = sigma) that the coordinator printed before.
TEST(RdpWorTest, FixedSizeCohortSpendsMoreThanThePoissonFigure) {
  for (auto [q, sigma, rounds] :
       {std::tuple{0.01, 1.0, 1000}, std::tuple{0.1, 2.0, 100}, std::tuple{0.5, 1.0, 2}}) {
    RdpAccountant wor, poisson;
    ASSERT_TRUE(ComposeSampledWithoutReplacement(wor, q, sigma / 2, rounds).ok());
    ASSERT_TRUE(poisson.Compose(q, sigma, rounds).ok());
    const double e_wor = wor.Spent(1e-5)->epsilon, e_poisson = poisson.Spent(1e-5)->epsilon;
    std::printf(
        "q %g, sigma %g, %d rounds, delta 1e-5: epsilon %.4f fixed-size replace-one, "
        "%.4f Poisson add/remove\n",
        q, sigma, rounds, e_wor, e_poisson);
    EXPECT_GT(e_wor, e_poisson);
  }
}

TEST(RdpWorTest, ComposingStepByStepEqualsComposingAtOnce) {
  RdpAccountant once, stepwise;
  ASSERT_TRUE(ComposeSampledWithoutReplacement(once, 0.05, 1.2, 40).ok());
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(ComposeSampledWithoutReplacement(stepwise, 0.05, 1.2).ok());
  }
  EXPECT_NEAR(once.Spent(1e-5)->epsilon, stepwise.Spent(1e-5)->epsilon, 1e-9);
}

TEST(RdpWorTest, RefusesValuesOutOfRange) {
  RdpAccountant accountant;
  Status s = ComposeSampledWithoutReplacement(accountant, 1.5, 1.0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "privacy accounting: sampling fraction 1.5 is not in [0, 1]");
  s = ComposeSampledWithoutReplacement(accountant, 0.1, -1.0);
  EXPECT_EQ(s.message(), "privacy accounting: noise multiplier -1 is not finite and > 0");
  EXPECT_EQ(ComposeSampledWithoutReplacement(accountant, 0.1, std::nan("")).code(),
            StatusCode::kInvalidArgument);
  // AddRdp refuses a curve of the wrong length or with a negative value.
  std::vector<double> short_curve = {0.1};
  s = accountant.AddRdp(short_curve);
  EXPECT_EQ(s.message(), "privacy accounting: 1 RDP values for 151 orders");
  std::vector<double> negative(accountant.orders().size(), 0.0);
  negative[3] = -0.5;
  EXPECT_EQ(accountant.AddRdp(negative).code(), StatusCode::kInvalidArgument);
  // Nothing composed: the state is unchanged by the refusals.
  for (double r : accountant.rdp()) EXPECT_EQ(r, 0.0);
}

}  // namespace
}  // namespace cohort::privacy
