// Distributed differential privacy under secure aggregation with the
// Skellam mechanism (Agarwal, Kairouz, Liu 2021, "The Skellam Mechanism for
// Differentially Private Federated Learning", arXiv:2110.04995): each client
// clips its update to L2 norm C, scales it onto an integer grid (scale s per
// unit), rounds it stochastically to integers whose L2 norm stays within a
// bound (conditional rounding, Kairouz, Liu, Steinke 2021, "The Distributed
// Discrete Gaussian Mechanism", arXiv:2102.06387, Theorem 1 and Section 4.1),
// and adds its share of integer Skellam noise, Poisson(λ) - Poisson(λ), to
// each coordinate before masking. Skellam laws are closed under summation,
// so the survivors' noise in the unmasked sum is exactly Skellam with the
// sum of their variances.
//
// Here: the RDP bound of the Skellam mechanism, its amplification by Poisson
// subsampling, the rounding's sensitivity bounds, the choice of the scale
// against the 32-bit sum's wrap-around, and the client's sampler and
// encoder. Pure functions and value types over common/; the sampler's seed
// is a SecretBytes and its random words live in one, wiped on destruction.
#ifndef COHORT_PRIVACY_SKELLAM_H_
#define COHORT_PRIVACY_SKELLAM_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/rng.h"
#include "common/secret_bytes.h"
#include "common/status.h"
#include "privacy/rdp_accountant.h"

namespace cohort::privacy {

// RDP at `order` (> 1) of the Skellam mechanism on integer vectors whose
// neighbours differ by at most `l1` in L1 and `l2` in L2 norm, with noise of
// total variance `variance` per coordinate (Sk(λ, λ) has variance 2λ):
//   ε(α) = α Δ2² / (2V) + min(((2α - 1) Δ2² + 6 Δ1) / (4V²), 3 Δ1 / (2V))
// (Agarwal et al. 2021, Theorem 3.5 with μ = V / 2, in the integer domain;
// google-research/federated distributed_dp/accounting_utils.py states the
// same bound in real units). The theorem is stated for integer orders: at
// a fractional order α this is the chord of (α - 1) ε(α) between the
// integers around it, an upper bound because (α - 1) times a Rényi
// divergence is convex in α (and 0 at α = 1). +inf for a variance that is
// not > 0.
double SkellamRdp(double l1, double l2, double variance, double order);

// RDP at integer `order` >= 2 of a mechanism with RDP `rdp(α)` (α = 2..order)
// run on a Poisson sample of rate `q` in (0, 1]: the general upper bound of
// Zhu and Wang 2019 ("Poisson Subsampled Rényi Differential Privacy", ICML,
// Theorem 6), which holds for any mechanism under add/remove adjacency,
//   1/(α-1) log((1-q)^(α-1) (αq - q + 1) + C(α,2) q² (1-q)^(α-2) e^ε(2)
//               + 3 Σ_{l=3..α} C(α,l) q^l (1-q)^(α-l) e^((l-1) ε(l))),
// and never above the unsampled rdp(order). Fractional orders: +inf when
// q < 1 (the order is then never chosen).
double SampledSkellamRdp(double q, double l1, double l2, double variance, double order);

// The L2 norm after stochastic rounding of a vector of norm at most
// `scaled_l2` in `dim` coordinates, conditioned (by retrying) on staying
// within it: min(c + √d, √(c² + d/4 + √(2 log(1/β)) (c + √d / 2))) (Kairouz
// et al. 2021, Theorem 1 / Proposition 22). `beta` in (0, 1).
double RoundedL2Bound(double scaled_l2, double dim, double beta);
// L1 <= √d L2, and on integers L1 <= L2².
double RoundedL1Bound(double l2_bound, double dim);

// β of the conditional rounding: a rounding exceeds the bound with
// probability at most β and is then redrawn (google's default).
inline constexpr double kRoundingBeta = 0.6065306597126334;  // e^-0.5
// The wrap-around bound ChooseSkellamParams meets, per round.
inline constexpr double kMaxWrapProbability = 1e-9;

// log P(X >= t) <= V (√(1 + (t/V)²) - 1) - t asinh(t / V) for X Skellam of
// variance V (Chernoff: E e^(θX) = e^(V (cosh θ - 1))). t >= 0.
double SkellamLogTail(double variance, double t);

// What a run of distributed DP encodes with, fixed at start-up.
struct SkellamParams {
  double scale = 0;            // Integer grid steps per unit of the update.
  double l2_bound = 0;         // Δ2 on the grid, after conditional rounding.
  double l1_bound = 0;         // Δ1 on the grid.
  double variance = 0;         // The survivors' noise, at least: (s σ C)².
  uint32_t max_clients = 0;    // Inputs in one sum, at most.
  uint32_t min_survivors = 0;  // Each share is variance / this.
  // |sum of one coordinate| stays below 2^31 but with this probability per
  // round (a union bound over the coordinates and both signs).
  double wrap_probability = 0;
  double share_variance() const { return variance / min_survivors; }
  // One line for the start-up log and the docs.
  std::string Describe() const;
};

// The largest power-of-two scale s, with the integer noise's standard
// deviation s σ C at most 2^21 (so every Poisson mean stays far inside a
// double's exact integers), such that max_clients · Δ2(s) plus the tail of
// the largest noise a sum can carry (max_clients shares) stays below 2^31
// but with probability <= kMaxWrapProbability. `dim`: the encoded
// coordinates. kInvalidArgument, naming the fields, when no scale keeps the
// rounding's inflation of the sensitivity below 2x (Δ2(s) <= 2 s C): the
// cohort or the noise is too large for 32 bits.
StatusOr<SkellamParams> ChooseSkellamParams(double clip_norm, double noise_multiplier,
                                            uint32_t max_clients, uint32_t min_survivors,
                                            size_t dim);

// Adaptive clipping under distributed DP (coordinator/adaptive_clip.h): each
// client's bit b = [||update|| <= C] rides as one more word of the masked
// vector, b times an integer grid S, plus the client's Skellam share of the
// count's noise. The count is a one-coordinate Skellam mechanism of
// sensitivity 1 (a replaced client changes its bit by at most 1) and noise
// multiplier `count_stddev` (σ_b, in count units), so its grid is
// ChooseSkellamParams's for clip 1, σ_b and one coordinate: the largest
// power of two S >= 1 with S σ_b <= 2^21 such that max_clients · S plus the
// tail of max_clients shares stays below 2^31 but with probability <=
// kMaxWrapProbability. The bit needs no rounding (S is an integer), so
// l2_bound = l1_bound = S; variance = (S σ_b)², from min_survivors shares.
// kInvalidArgument, naming privacy.adaptive_clip.clipped_count_stddev,
// when no S >= 1 fits.
StatusOr<SkellamParams> ChooseClipCountParams(double count_stddev, uint32_t max_clients,
                                              uint32_t min_survivors);

// Composes `steps` rounds of the Skellam mechanism of `params` on Poisson
// samples of rate `q` into `accountant` (at its orders). kInvalidArgument
// for q outside [0, 1].
Status ComposeSkellam(RdpAccountant& accountant, double q, const SkellamParams& params,
                      uint64_t steps = 1);

// What the coordinator charges for `rounds` rounds of distributed DP: its
// cohort is a fixed-size sample drawn without replacement, so neighbouring
// runs differ by one client replaced (replace-one), which moves the sum by
// up to 2 Δ2 (L2) and 2 Δ1 (L1); and no amplification by that sampling is
// claimed (no without-replacement bound for the Skellam mechanism is built),
// so every round is charged unsampled (q = 1). An upper bound, and the
// only one that holds against the coordinator, who picks the cohort.
Status ChargeSkellamRounds(RdpAccountant& accountant, const SkellamParams& params,
                           uint64_t rounds = 1);

// The same rounds as seen by whoever observes the released models but does
// not learn the cohorts (the coordinator does: ChargeSkellamRounds is the
// view against it): each round's cohort is a fixed-size sample, drawn
// without replacement at fraction `q` (cohort / available clients), so the
// replace-one Skellam curve above is amplified by Wang, Balle,
// Kasiviswanathan 2019's general Theorem 9 (privacy/rdp_wor.h), at each
// order the smaller of that and the unsampled value (sampling never hurts;
// at q = 1 the two views agree). kInvalidArgument for q outside [0, 1].
Status ChargeSkellamRoundsForReleasedModel(RdpAccountant& accountant, const SkellamParams& params,
                                           double q, uint64_t rounds = 1);

// Both views of a round of adaptive clipping under distributed DP: the
// update (`params`, replace-one as above) and the count of unclipped
// updates (`count`, ChooseClipCountParams; a replaced client moves it by
// count.l2_bound = S, not 2S: a bit changes by at most 1) are released
// together, and RDP composes: each order's ε is the sum of the two
// curves', before amplification (the released model's view amplifies the
// summed curve). With the update's noise at z_Δ = (z^-2 - (2σ_b)^-2)^-1/2
// the Gaussian terms sum to what the update alone has at z (Andrew et al.
// 2021): α (2Δ2)² / (2 (s z_Δ C)²) + α / (2 σ_b²) = α 2 / z² when Δ2 = s C.
Status ChargeAdaptiveSkellamRounds(RdpAccountant& accountant, const SkellamParams& params,
                                   const SkellamParams& count, uint64_t rounds = 1);
Status ChargeAdaptiveSkellamRoundsForReleasedModel(RdpAccountant& accountant,
                                                   const SkellamParams& params,
                                                   const SkellamParams& count, double q,
                                                   uint64_t rounds = 1);

// The largest per-client share variance a client accepts (the coordinator
// sends at most (2^21)^2 / min_survivors, 2^42): above it Poisson(λ) leaves
// double's exact integers and, past 2^63, converts to no noise at all.
inline constexpr double kMaxShareVariance = 4398046511104.0;  // 2^42

// A ChaCha20 stream keyed by a 32-byte secret, and the Poisson and Skellam
// samplers on it. Move-only; not thread-safe.
class SkellamSampler {
 public:
  static constexpr size_t kSeedBytes = 32;
  // kInvalidArgument for a seed that is not kSeedBytes.
  static StatusOr<SkellamSampler> Create(SecretBytes seed);
  SkellamSampler(SkellamSampler&&) = default;
  SkellamSampler& operator=(SkellamSampler&&) = default;

  // Uniform in (0, 1), 53 bits.
  double Uniform();
  // Poisson(lambda), lambda >= 0 and at most ~2^50: multiplication of
  // uniforms below 10, Hörmann's PTRS above ("The transformed rejection
  // method for generating Poisson random variables", 1993), as NumPy.
  int64_t Poisson(double lambda);
  // Poisson(variance / 2) - Poisson(variance / 2): variance `variance`.
  int64_t Skellam(double variance);

 private:
  explicit SkellamSampler(SecretBytes seed);
  void Refill();

  SecretBytes key_;
  SecretBytes block_;
  uint64_t counter_ = 0;
  size_t next_ = 0;
};

// The client's encoding of its update for a DISTRIBUTED_SKELLAM round, into
// out[0, delta.size()): x = the delta scaled by min(1, clip_norm / ||delta||)
// (computed in double), times params.scale, rounded stochastically with
// `rounding` until ||x||₂ <= params.l2_bound (at most 1000 draws), plus
// Skellam(share_variance) noise from `noise` on each coordinate, mod 2^32.
// kInvalidArgument for a delta with NaN or Inf; kInternal when no rounding
// met the bound (probability below β^1000).
Status EncodeSkellam(std::span<const float> delta, double clip_norm, double scale, double l2_bound,
                     double share_variance, Rng& rounding, SkellamSampler& noise,
                     std::span<uint32_t> out);

// The bit: whether `delta`'s L2 norm, summed in double as EncodeSkellam
// sums it, is at most `clip_norm` (EncodeSkellam then leaves it unscaled).
bool WithinL2Norm(std::span<const float> delta, double clip_norm);
// The client's word for its bit: b · count.scale + Skellam(share) from
// `noise`, mod 2^32.
uint32_t EncodeClipBit(bool unclipped, double scale, double share_variance, SkellamSampler& noise);
// The unmasked sum's word over the grid: the survivors' count of unclipped
// updates plus their noise, in count units.
double DecodeClipCount(uint32_t sum, double scale);

// The unmasked sum's words as signed integers over the scale: the sum of
// the clipped updates plus the survivors' noise, in the update's units.
void DecodeSkellam(std::span<const uint32_t> sum, double scale, std::span<float> out);

}  // namespace cohort::privacy

#endif  // COHORT_PRIVACY_SKELLAM_H_
