#include "aggregation/secagg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "aggregation/fixed_point.h"
#include "common/rng.h"

namespace cohort::aggregation {
namespace {

// Where clients stop answering.
struct Drops {
  std::set<uint32_t> before_share_keys;
  std::set<uint32_t> before_masked_input;
  std::set<uint32_t> before_consistency;  // Sent input; silent afterwards.
  std::set<uint32_t> before_unmask;       // Signed; no unmask response.
};

struct Outcome {
  Status status;
  std::vector<uint32_t> sum;
  std::vector<uint32_t> expected;  // Plain sum over U3.
  std::vector<uint32_t> u3;
};

class Harness {
 public:
  Harness(const SecAggParams& params) : params_(params) {
    for (uint32_t i = 0; i < params.n; ++i) {
      keys_.push_back(std::move(crypto::GenerateEd25519()).value());
      identities_.push_back(keys_.back().public_key);
    }
    Rng rng(params.n);
    for (uint32_t i = 0; i < params.n; ++i) {
      inputs_.emplace_back(params.length);
      for (auto& v : inputs_.back()) v = static_cast<uint32_t>(rng.Next());
    }
  }

  Outcome Run(const Drops& d) {
    Outcome o;
    SecAggServer server(params_, identities_);
    std::vector<std::unique_ptr<SecAggClient>> clients;
    for (uint32_t i = 0; i < params_.n; ++i) {
      clients.push_back(std::make_unique<SecAggClient>(params_, i, &keys_[i], identities_));
      auto advert = clients[i]->AdvertiseKeys();
      EXPECT_TRUE(advert.ok());
      EXPECT_TRUE(server.OnAdvertise(*advert).ok());
    }
    auto list = server.CloseAdvertise();
    if (!list.ok()) return {list.status()};
    std::set<uint32_t> alive;
    for (uint32_t i = 0; i < params_.n; ++i) {
      if (d.before_share_keys.count(i)) continue;
      auto shares = clients[i]->ShareKeys(*list);
      if (!shares.ok()) continue;
      EXPECT_TRUE(server.OnShares(*shares).ok());
      alive.insert(i);
    }
    auto inbound = server.CloseShares();
    if (!inbound.ok()) return {inbound.status()};
    std::set<uint32_t> sent_input;
    for (uint32_t i : alive) {
      if (d.before_masked_input.count(i)) continue;
      auto masked = clients[i]->MaskInput((*inbound)[i], inputs_[i]);
      if (!masked.ok()) continue;
      EXPECT_TRUE(server.OnMaskedInput(*masked).ok());
      sent_input.insert(i);
    }
    auto survivors = server.CloseMaskedInput();
    if (!survivors.ok()) return {survivors.status()};
    o.u3 = survivors->survivors;
    std::set<uint32_t> signed_up;
    for (uint32_t i : sent_input) {
      if (d.before_consistency.count(i)) continue;
      auto sig = clients[i]->SignSurvivors(*survivors);
      if (!sig.ok()) continue;
      EXPECT_TRUE(server.OnSignature(*sig).ok());
      signed_up.insert(i);
    }
    auto request = server.CloseConsistency();
    if (!request.ok()) return {request.status()};
    last_request_ = *request;
    for (uint32_t i : signed_up) {
      if (d.before_unmask.count(i)) continue;
      auto response = clients[i]->Unmask(*request);
      if (!response.ok()) continue;
      EXPECT_TRUE(server.OnUnmask(std::move(*response)).ok());
    }
    auto sum = server.Finalize();
    if (!sum.ok()) return {sum.status()};
    o.sum = *sum;
    o.expected.assign(params_.length, 0);
    for (uint32_t u : o.u3) {
      for (size_t j = 0; j < params_.length; ++j) o.expected[j] += inputs_[u][j];
    }
    return o;
  }

  const SecAggParams& params() const { return params_; }
  std::vector<crypto::Ed25519KeyPair>& keys() { return keys_; }
  const std::vector<crypto::Ed25519Public>& identities() const { return identities_; }
  std::vector<std::vector<uint32_t>>& inputs() { return inputs_; }

 private:
  SecAggParams params_;
  std::vector<crypto::Ed25519KeyPair> keys_;
  std::vector<crypto::Ed25519Public> identities_;
  std::vector<std::vector<uint32_t>> inputs_;
  UnmaskRequest last_request_;
};

SecAggParams Params(uint32_t n, size_t length, bool complete = true) {
  auto p = ChooseSecAggParams(n, 0.1, 0.1, complete, length);
  EXPECT_TRUE(p.ok()) << p.status();
  p->graph_seed = 7;
  p->context[0] = static_cast<uint8_t>(n);
  return *p;
}

TEST(SecAggTest, SumIsExactForThreeTenAndHundredClients) {
  for (uint32_t n : {3u, 10u, 100u}) {
    Harness h(Params(n, 1000, /*complete=*/n <= 10));
    Outcome o = h.Run({});
    ASSERT_TRUE(o.status.ok()) << "n=" << n << ": " << o.status;
    EXPECT_EQ(o.u3.size(), n);
    EXPECT_EQ(o.sum, o.expected) << "n=" << n;
  }
}

TEST(SecAggTest, SumIsExactWithChaCha20Masks) {
  SecAggParams p = Params(10, 1000);
  p.prg = crypto::MaskPrg::kChaCha20;
  Harness h(p);
  Drops d;
  d.before_masked_input = {3};  // The server removes a dropped client's pair masks too.
  Outcome o = h.Run(d);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.sum, o.expected);
}

TEST(SecAggTest, DropoutsAtEveryStageKeepTheSumExact) {
  Harness h(Params(10, 500));  // Complete graph, k = 9, t = 5.
  ASSERT_EQ(h.params().t, 5u);
  Drops d;
  d.before_share_keys = {1};
  d.before_masked_input = {4};
  d.before_consistency = {6};
  d.before_unmask = {8};
  Outcome o = h.Run(d);
  ASSERT_TRUE(o.status.ok()) << o.status;
  // U3 excludes the clients that never sent input (1 and 4), includes 6 and 8.
  EXPECT_EQ(o.u3, (std::vector<uint32_t>{0, 2, 3, 5, 6, 7, 8, 9}));
  EXPECT_EQ(o.sum, o.expected);
}

TEST(SecAggTest, SecAggPlusGraphSurvivesDropouts) {
  Harness h(Params(100, 200, /*complete=*/false));
  ASSERT_LT(h.params().k, 99u);
  Drops d;
  for (uint32_t i = 0; i < 100; i += 10) d.before_masked_input.insert(i);
  d.before_unmask = {3, 55};
  Outcome o = h.Run(d);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.u3.size(), 90u);
  EXPECT_EQ(o.sum, o.expected);
}

TEST(SecAggTest, BelowThresholdAbortsAndRevealsNothing) {
  Harness h(Params(6, 100));  // k = 5, t = 3.
  Drops d;
  d.before_masked_input = {0, 1, 2, 3};  // Only 2 inputs: below t.
  Outcome o = h.Run(d);
  EXPECT_EQ(o.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(o.status.message().find("aborted"), std::string::npos) << o.status;
  EXPECT_TRUE(o.sum.empty());
  // Enough inputs but too few unmask responses: also an abort.
  Drops late;
  late.before_unmask = {0, 1, 2, 3};
  o = h.Run(late);
  EXPECT_EQ(o.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(o.sum.empty());
}

// Runs a round up to the unmask request and returns the clients and request.
struct Staged {
  std::vector<std::unique_ptr<SecAggClient>> clients;
  UnmaskRequest request;
};

Staged StageToUnmask(Harness& h) {
  Staged s;
  SecAggServer server(h.params(), h.identities());
  for (uint32_t i = 0; i < h.params().n; ++i) {
    s.clients.push_back(
        std::make_unique<SecAggClient>(h.params(), i, &h.keys()[i], h.identities()));
    EXPECT_TRUE(server.OnAdvertise(*s.clients[i]->AdvertiseKeys()).ok());
  }
  auto list = server.CloseAdvertise();
  for (auto& c : s.clients) EXPECT_TRUE(server.OnShares(*c->ShareKeys(*list)).ok());
  auto inbound = server.CloseShares();
  // Client 4 drops before sending its input.
  for (uint32_t i = 0; i < h.params().n; ++i) {
    if (i == 4) continue;
    EXPECT_TRUE(server.OnMaskedInput(*s.clients[i]->MaskInput((*inbound)[i], h.inputs()[i])).ok());
  }
  auto survivors = server.CloseMaskedInput();
  for (uint32_t i = 0; i < h.params().n; ++i) {
    if (i == 4) continue;
    EXPECT_TRUE(server.OnSignature(*s.clients[i]->SignSurvivors(*survivors)).ok());
  }
  s.request = *server.CloseConsistency();
  return s;
}

TEST(SecAggTest, ClientRefusesToRevealBothSharesOfANeighbour) {
  Harness h(Params(6, 50));
  Staged s = StageToUnmask(h);
  ASSERT_EQ(s.request.dropped, (std::vector<uint32_t>{4}));
  UnmaskRequest greedy = s.request;
  // Ask for client 2's self-mask share (as a survivor) and its mask key (as dropped).
  greedy.dropped = {2, 4};
  auto r = s.clients[0]->Unmask(greedy);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("both as survivor and as dropped"), std::string::npos);
  // The honest request still works for another client.
  EXPECT_TRUE(s.clients[1]->Unmask(s.request).ok());
}

TEST(SecAggTest, ClientRefusesAnInconsistentSurvivorList) {
  Harness h(Params(6, 50));
  Staged s = StageToUnmask(h);
  // Pretend client 3 dropped: a different list from the one everyone signed.
  UnmaskRequest forked = s.request;
  forked.survivors = {0, 1, 2, 5};
  forked.dropped = {3, 4};
  auto r = s.clients[0]->Unmask(forked);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("differs from the one signed"), std::string::npos);
  // Without the signatures, the right list is refused too.
  UnmaskRequest unsigned_request = s.request;
  unsigned_request.signatures.clear();
  r = s.clients[1]->Unmask(unsigned_request);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("valid survivor signatures"), std::string::npos);
  // A survivor left out of both lists is an inconsistency as well.
  UnmaskRequest hiding = s.request;
  hiding.dropped.clear();
  r = s.clients[2]->Unmask(hiding);
  EXPECT_FALSE(r.ok());
}

TEST(SecAggTest, MaskedVectorLooksUniformAndUncorrelatedWithTheInput) {
  const size_t m = 1 << 16;
  Harness h(Params(3, m));
  for (size_t j = 0; j < m; ++j) h.inputs()[0][j] = static_cast<uint32_t>(j % 97);  // Structured.
  SecAggServer server(h.params(), h.identities());
  std::vector<std::unique_ptr<SecAggClient>> clients;
  for (uint32_t i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<SecAggClient>(h.params(), i, &h.keys()[i], h.identities()));
    ASSERT_TRUE(server.OnAdvertise(*clients[i]->AdvertiseKeys()).ok());
  }
  auto list = server.CloseAdvertise();
  for (auto& c : clients) ASSERT_TRUE(server.OnShares(*c->ShareKeys(*list)).ok());
  auto inbound = server.CloseShares();
  auto masked = clients[0]->MaskInput((*inbound)[0], h.inputs()[0]);
  ASSERT_TRUE(masked.ok());
  // Chi-square of the top byte over 256 bins (df 255: mean 255, sd 22.6).
  std::vector<double> bins(256, 0);
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (size_t j = 0; j < m; ++j) {
    bins[masked->values[j] >> 24] += 1;
    const double x = h.inputs()[0][j], y = masked->values[j];
    sx += x;
    sy += y;
    sxx += x * x;
    syy += y * y;
    sxy += x * y;
  }
  double chi2 = 0;
  const double expect = m / 256.0;
  for (double b : bins) chi2 += (b - expect) * (b - expect) / expect;
  EXPECT_LT(chi2, 255 + 5 * 22.6) << "top byte is not uniform";
  const double r = (m * sxy - sx * sy) / std::sqrt((m * sxx - sx * sx) * (m * syy - sy * sy));
  EXPECT_LT(std::fabs(r), 5.0 / std::sqrt(static_cast<double>(m))) << "correlated with the input";
}

TEST(SecAggTest, ParameterRuleUsesSparseGraphsForLargeCohorts) {
  auto small = ChooseSecAggParams(10, 0.1, 0.1, false, 1);
  EXPECT_EQ(small->k, 9u);  // Complete graph for small n.
  auto p = ChooseSecAggParams(500, 0.1, 0.1, false, 1);
  ASSERT_TRUE(p.ok());
  EXPECT_LT(p->k, 100u);
  EXPECT_GT(p->t, p->k / 2);
  auto harsh = ChooseSecAggParams(500, 0.3, 0.1, false, 1);
  EXPECT_GE(harsh->k, p->k);
  auto graph = HararyNeighbours(500, p->k, 3);
  for (const auto& nb : graph) EXPECT_EQ(nb.size(), p->k);
}

TEST(FixedPointTest, WeightedSumsDecodeToTheWeightedMean) {
  auto fp = ChooseFixedPoint(1.0f, 300, 3);
  ASSERT_TRUE(fp.ok());
  Rng rng(1);
  std::vector<float> a = {0.5f, -0.25f, 2.0f}, b = {-0.5f, 0.75f, -3.0f};
  std::vector<uint32_t> ea(3), eb(3), sum(3);
  EncodeFixedPoint(a, 100, *fp, rng, ea);
  EncodeFixedPoint(b, 200, *fp, rng, eb);
  for (int i = 0; i < 3; ++i) sum[i] = ea[i] + eb[i];
  std::vector<float> mean(3);
  DecodeFixedPoint(sum, 300, *fp, mean);
  EXPECT_NEAR(mean[0], (0.5 * 100 - 0.5 * 200) / 300, 1e-6);
  EXPECT_NEAR(mean[1], (-0.25 * 100 + 0.75 * 200) / 300, 1e-6);
  EXPECT_NEAR(mean[2], (1.0 * 100 - 1.0 * 200) / 300, 1e-6);  // Clipped to +-1.
  EXPECT_FALSE(ChooseFixedPoint(1e12f, 1e12, 10).ok());
}

TEST(FixedPointTest, StochasticRoundingIsUnbiasedAndBothKernelsAgree) {
  auto fp = ChooseFixedPoint(4.0f, 1.0, 3);
  ASSERT_TRUE(fp.ok());
  // Values on and off the grid, negative ones, clipped ones (|v| > 4) and
  // an odd length (the kernels' tail); a weight that is not a power of two.
  Rng values(3);
  std::vector<float> v(100001);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = i % 5 == 0 ? static_cast<float>(i % 11) - 5.0f
                      : static_cast<float>(values.UniformDouble() * 10.0 - 5.0);
  }
  const double weight = 0.37;
  std::vector<uint32_t> scalar(v.size()), simd(v.size());
  Rng r1(7), r2(7);
  internal::EncodeFixedPoint(v, weight, *fp, r1, scalar, /*avx2=*/false);
  if (__builtin_cpu_supports("avx2")) {
    internal::EncodeFixedPoint(v, weight, *fp, r2, simd, /*avx2=*/true);
    EXPECT_EQ(scalar, simd);
  }
  // Each encoding is floor(x) or floor(x) + 1, and on average x.
  double error = 0;
  size_t counted = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double x = std::clamp(static_cast<double>(v[i]), -4.0, 4.0) * weight * fp->scale;
    const double q = static_cast<int32_t>(scalar[i]);
    ASSERT_TRUE(q == std::floor(x) || q == std::floor(x) + 1) << i << ": " << x << " -> " << q;
    error += q - x;
    ++counted;
  }
  // Rounding errors lie in (-1, 1) with mean 0 when unbiased: over 100K
  // values the mean stays far below 0.01 units (a floor would give ~-0.5).
  EXPECT_LT(std::abs(error / counted), 0.01);
}

}  // namespace
}  // namespace cohort::aggregation
