#!/usr/bin/python3
"""Writes skellam_wor_golden.txt: distributed DP's released-model view, in decimals.

An independent check of privacy/rdp_wor.cc's SampledWithoutReplacementRdp
and privacy/skellam.cc's ChargeSkellamRoundsForReleasedModel. Both evaluate
the GENERAL bound of Wang, Balle and Kasiviswanathan 2019 ("Subsampled Renyi
Differential Privacy and Analytical Moments Accountant", arXiv:1808.00087,
Theorem 9) for a uniformly random subset of m = q n of n records, adjacent
datasets differing by replacing one record, a base mechanism known only by
its RDP curve eps(j) at integer orders (eps(inf) = inf, so the factor
min{2, (e^{eps(inf)} - 1)^j} is 2). For an integer order alpha >= 2,

  A = 1 + q^2 C(alpha, 2) min(4 (e^{eps(2)} - 1), 2 e^{eps(2)})
        + sum_{j=3..alpha} q^j C(alpha, j) 2 e^{(j - 1) eps(j)}

and the RDP is log(A) / (alpha - 1); a fractional order interpolates log(A)
linearly between the neighbouring integers (log A = 0 at alpha = 1), as
privacy/rdp_wor.cc does for Theorem 27.

The base mechanism is the Skellam mechanism's bound (Agarwal, Kairouz, Liu
2021, Theorem 3.5, noise of variance V):

  eps(a) = a L2^2 / (2 V) + min(((2 a - 1) L2^2 + 6 L1) / (4 V^2), 3 L1 / (2 V)).

Everything up to log(A) is summed here in 60-digit decimals (Python's
decimal module; every term is positive, so nothing cancels); the C++ sums in
doubles in log space. Two kinds of line:

  thm9 Q L1 L2 V ORDER VALUE   Theorem 9's RDP for the curve eps above with
      these L1, L2 (no cap: at Q = 1 it lies above eps(ORDER));
  released Q L1 L2 V STEPS DELTA EPS ORDER   what the coordinator records as
      the released-model view for STEPS rounds of SkellamParams (l1_bound L1,
      l2_bound L2, variance V): replace-one sensitivities 2 L1 and 2 L2, at
      each order the smaller of Theorem 9 and the unsampled eps, composed
      and converted to epsilon at DELTA over Opacus's DEFAULT_ALPHAS with
      Balle et al. 2020's conversion (privacy/rdp_accountant.cc), clamped
      at 0; ORDER is the order that gave it.

Run: /usr/bin/python3 tests/data/make_skellam_wor_golden.py; deterministic.
privacy/skellam_test.cc reads every line. With --check it writes nothing and
fails when the file differs from a fresh computation by more than 1e-9
relative (meson test skellam_wor_golden_test).
"""
import decimal
import math
import os
import sys
from decimal import Decimal

from golden_compare import check_or_write  # noqa: E402
# The Skellam bound, and its chord between integer orders, in whatever
# arithmetic its arguments are: decimals here.
from make_skellam_golden import skellam_rdp  # noqa: E402

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
QS = [0.001, 0.01, 0.05, 0.1, 0.5, 1.0]
# (L1, L2, V) on the integer grid: a toy, and two with the Gaussian-
# equivalent noise multiplier sqrt(V) / L2 of 1 and 5 at a bench-like scale.
PARAMS = [(4.0, 2.0, 10.0), (8e4, 400.0, 1.6e5), (2e9, 1.2e6, 3.6e13)]
THM9_ORDERS = [1.5, 2.0, 2.5, 3.0, 4.7, 8.0, 10.9, 12, 32, 63]
STEPS = [1, 100, 1000]
DELTAS = [1e-5]

decimal.getcontext().prec = 60


def d(x):
    return Decimal(repr(x))


def log_a(q, l1, l2, v, alpha):
    """log A of Theorem 9 at integer alpha (0 at alpha <= 1)."""
    if alpha <= 1:
        return Decimal(0)
    e2 = skellam_rdp(l1, l2, v, Decimal(2)).exp()
    a = 1 + q ** 2 * math.comb(alpha, 2) * min(4 * (e2 - 1), 2 * e2)
    for j in range(3, alpha + 1):
        a += q ** j * math.comb(alpha, j) * 2 * ((j - 1) * skellam_rdp(l1, l2, v, Decimal(j))).exp()
    return a.ln()


def thm9(q, l1, l2, v, alpha, memo):
    """Theorem 9's RDP at `alpha` (interpolated between integers)."""
    def at(k):
        if k not in memo:
            memo[k] = log_a(q, l1, l2, v, k)
        return memo[k]
    lo = math.floor(alpha)
    t = d(alpha) - lo
    cgf = at(lo) if t == 0 else (1 - t) * at(lo) + t * at(lo + 1)
    return cgf / (d(alpha) - 1)


def released_rdps(q, l1, l2, v):
    """One round of the released-model view at every order of ORDERS."""
    q, l1, l2, v = d(q), 2 * d(l1), 2 * d(l2), d(v)
    memo = {}
    return [min(thm9(q, l1, l2, v, a, memo), skellam_rdp(l1, l2, v, d(a))) for a in ORDERS]


def epsilon(rdps, steps, delta):
    best = (math.inf, 0)
    for a, r in zip(ORDERS, rdps):
        e = steps * float(r) + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, (e, a))
    return (max(0.0, best[0]), best[1])


def lines():
    out = ["# Written by make_skellam_wor_golden.py (Wang, Balle, Kasiviswanathan 2019,",
           "# Theorem 9, over the Skellam bound, in 60-digit decimals). Do not edit: run it again.",
           "# thm9 Q L1 L2 V ORDER RDP / released Q L1 L2 V STEPS DELTA EPS ORDER"]
    for q in QS:
        for (l1, l2, v) in PARAMS:
            memo = {}
            for a in THM9_ORDERS:
                r = thm9(d(q), d(l1), d(l2), d(v), a, memo)
                out.append(f"thm9 {q!r} {l1!r} {l2!r} {v!r} {a!r} {float(r)!r}")
            rdps = released_rdps(q, l1, l2, v)
            for steps in STEPS:
                for delta in DELTAS:
                    e, a = epsilon(rdps, steps, delta)
                    out.append(f"released {q!r} {l1!r} {l2!r} {v!r} {steps} {delta!r} {e!r} {a!r}")
    return out


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skellam_wor_golden.txt")
    new = lines()
    return check_or_write(path, new, sys.argv)


if __name__ == "__main__":
    sys.exit(main())
