#!/usr/bin/python3
"""Writes skellam_golden.txt: the Skellam mechanism's accounting, from scipy.

An independent check of privacy/skellam.cc (distributed DP, docs/privacy.md).
Four kinds of line:

  rdp Q L1 L2 V ORDER VALUE   RDP of one step: the bound of Agarwal, Kairouz,
      Liu 2021 (Theorem 3.5, noise of variance V = 2 mu), amplified by Poisson
      sampling at rate Q with Zhu & Wang 2019's general upper bound (scipy's
      logsumexp and comb; the C++ sums in its own log space);
  eps Q L1 L2 V STEPS DELTA VALUE   epsilon after STEPS such steps at DELTA,
      minimised over Opacus's orders (the fractional ones only at Q = 1) with Balle et al. 2020's
      conversion (what privacy/rdp_accountant.cc's EpsilonFromRdp does);
  exact V SHIFT ORDER VALUE   the true Renyi divergence D_ORDER(Sk + SHIFT || Sk)
      of one coordinate, summed over scipy.stats.skellam's pmf: the bound on
      the line "bound V SHIFT ORDER" must not be below it (the C++ test checks);
  l2 C DIM VALUE   the L2 norm bound after conditional stochastic rounding
      (Kairouz, Liu, Steinke 2021, Theorem 1, beta = e^-0.5).

Run: /usr/bin/python3 tests/data/make_skellam_golden.py; deterministic. With
--check it writes nothing and fails when the file differs from a fresh
computation by more than 1e-9 relative (meson test skellam_golden_test).
"""
import math
import os
import sys

import numpy as np
from scipy import special, stats
from golden_compare import check_or_write  # noqa: E402

# Opacus's DEFAULT_ALPHAS, as privacy/rdp_accountant.cc: the sampled bound
# holds at integer orders only, so the fractional ones count only at q = 1.
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
BETA = math.exp(-0.5)


def skellam_rdp_integer(l1, l2, v, a):
    return a * l2 * l2 / (2 * v) + min(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * v * v),
                                       3 * l1 / (2 * v))


def skellam_rdp(l1, l2, v, a):
    # Theorem 3.5 holds at integer orders; between them, the chord of the
    # convex (a - 1) eps(a), which is 0 at a = 1.
    lo = math.floor(a)
    if lo == a:
        return skellam_rdp_integer(l1, l2, v, a)
    t = a - lo
    cgf = ((1 - t) * (lo - 1) * skellam_rdp_integer(l1, l2, v, lo) +
           t * lo * skellam_rdp_integer(l1, l2, v, lo + 1))
    return cgf / (a - 1)


def sampled_rdp(q, l1, l2, v, a):
    unsampled = skellam_rdp(l1, l2, v, a)
    if q >= 1:
        return unsampled
    if a != int(a):
        return math.inf
    a = int(a)
    terms = [0.0, skellam_rdp(l1, l2, v, 2)]
    weights = [(1 - q) ** (a - 1) * (a * q - q + 1), special.comb(a, 2) * q * q * (1 - q) ** (a - 2)]
    for l in range(3, a + 1):
        terms.append((l - 1) * skellam_rdp(l1, l2, v, l) + math.log(special.comb(a, l)) +
                     (a - l) * math.log1p(-q) + l * math.log(q))
        weights.append(3.0)
    return min(unsampled, special.logsumexp(terms, b=weights) / (a - 1))


def epsilon(q, l1, l2, v, steps, delta):
    best = math.inf
    for a in ORDERS:
        r = steps * sampled_rdp(q, l1, l2, v, a)
        e = r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, e)
    return max(0.0, best)


def exact_divergence(v, shift, a):
    """D_a(Sk(mu) + shift || Sk(mu)), mu = v / 2, over the pmf's support."""
    mu = v / 2
    half = int(30 * math.sqrt(v)) + 4 * shift + 30
    k = np.arange(-half, half + 1)
    with np.errstate(divide="ignore"):
        log_q = stats.skellam.logpmf(k, mu, mu)
        log_p = stats.skellam.logpmf(k - shift, mu, mu)
    keep = np.isfinite(log_q) & np.isfinite(log_p)  # Beyond: below 1e-300 on both.
    return special.logsumexp(a * log_p[keep] + (1 - a) * log_q[keep]) / (a - 1)


def l2_bound(c, d):
    return min(c + math.sqrt(d),
               math.sqrt(c * c + 0.25 * d + math.sqrt(2 * math.log(1 / BETA)) * (c + 0.5 * math.sqrt(d))))


def lines():
    out = []
    for q in [0.01, 0.1, 0.5, 1.0]:
        for (l1, l2, v) in [(4.0, 2.0, 10.0), (4e4, 200.0, 4e4), (1e9, 1.2e6, 1.44e12)]:
            for a in [2, 3, 8, 32, 63]:
                out.append(f"rdp {q!r} {l1!r} {l2!r} {v!r} {a} {sampled_rdp(q, l1, l2, v, a)!r}")
            for steps in [1, 100]:
                for delta in [1e-5]:
                    out.append(f"eps {q!r} {l1!r} {l2!r} {v!r} {steps} {delta!r} "
                               f"{epsilon(q, l1, l2, v, steps, delta)!r}")
    for (v, shift) in [(8.0, 1), (50.0, 3), (400.0, 10)]:
        for a in [2, 4, 16]:
            out.append(f"exact {v!r} {shift} {a} {exact_divergence(v, shift, a)!r}")
    for (c, d) in [(10.0, 100), (1e3, 61706), (2.0**20, 61706)]:
        out.append(f"l2 {c!r} {d} {l2_bound(c, d)!r}")
    return out



def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skellam_golden.txt")
    new = lines()
    return check_or_write(path, new, sys.argv)


if __name__ == "__main__":
    sys.exit(main())
