#!/usr/bin/python3
"""Writes rdp_wor_golden.txt: RDP of the Gaussian mechanism under sampling without replacement.

An independent check of privacy/rdp_wor.cc. Both evaluate the bound of Wang,
Balle and Kasiviswanathan 2019 ("Subsampled Renyi Differential Privacy and
Analytical Moments Accountant", arXiv:1808.00087, Theorem 27, as
dp_accounting's rdp_privacy_accountant.py `_compute_rdp_sample_wor_gaussian`
states it): a uniformly random subset of m = q n of n records, adjacent
datasets differing by replacing one record, the base mechanism a Gaussian
with noise multiplier z (noise standard deviation over the L2 distance the
replaced record can move the sum). For an integer order alpha >= 2,

  A = 1 + q^2 C(alpha, 2) min(4 (e^{eps(2)} - 1), 2 e^{eps(2)})
        + sum_{j=3..alpha} q^j C(alpha, j) min(4 sqrt(B(2 floor(j/2)) B(2 ceil(j/2))),
                                                2 e^{(j - 1) eps(j)})
  eps(j) = j / (2 z^2),  B(l) = |sum_{k=0..l} (-1)^(l-k) C(l, k) e^{k (k - 1) / (2 z^2)}|

(B(l) is the l-th forward difference at 0 of e^{(k-1) eps(k)}), and the RDP
is log(A) / (alpha - 1). A fractional order interpolates log(A) linearly
between the neighbouring integers (Corollary 10: the CGF is convex).

The C++ (like dp_accounting) takes the forward differences by repeated
differencing in log space, in doubles. This script sums the alternating
binomial series directly in 400-digit decimal arithmetic (Python's decimal
module), so cancellation cannot hide there, and also runs a float
transcription of dp_accounting's log-space algorithm (numpy, scipy's
gammaln) to confirm that the formula above is the one dp_accounting
evaluates: the two must agree within 1e-9 relative everywhere on the grid
(checked every run, printed). The file holds the decimal values.

epsilon is the minimum over Opacus's DEFAULT_ALPHAS of

    steps * rdp + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1)

(Balle et al. 2020, Theorem 21; what privacy/rdp_accountant.cc uses),
clamped at 0.

Run: /usr/bin/python3 tests/data/make_rdp_wor_golden.py (Debian's
python3-numpy and python3-scipy, which scripts/setup.sh installs);
deterministic. privacy/rdp_wor_test.cc reads every line. With --check it
writes nothing and fails when the file differs from a fresh computation by
more than 1e-9 relative or the two Python evaluations disagree.
"""
import decimal
import functools
import math
import os
import sys
from decimal import Decimal

import numpy as np
from scipy import special
from golden_compare import check_or_write  # noqa: E402

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
QS = [0.001, 0.01, 0.04, 0.1, 0.5, 0.9, 1.0]
# Noise multipliers of the replace-one Gaussian: the coordinator's
# privacy.noise_multiplier / 2 (its noise is sigma C; a replaced client
# moves the sum by up to 2 C).
ZS = [0.35, 0.5, 1.0, 2.0, 5.0]
STEPS = [1, 100, 10000]
DELTAS = [1e-5, 1e-7]
# Orders whose RDP is written out line by line (fractional and integer).
RDP_ORDERS = [1.1, 1.5, 2.0, 2.5, 3.0, 4.7, 8.0, 10.9, 12, 32, 63]
AGREEMENT = 1e-9

decimal.getcontext().prec = 400


class DecimalBound:
    """Theorem 27's bound for one z, in 400-digit decimals."""

    def __init__(self, z):
        self.c = 1 / (2 * Decimal(repr(z)) ** 2)  # eps(j) = j c
        top = max(ORDERS) + 2
        self.g = [(self.c * k * (k - 1)).exp() for k in range(top + 1)]
        self.b = {}

    def forward_difference(self, l):
        if l not in self.b:
            s = sum((-1) ** (l - k) * math.comb(l, k) * self.g[k] for k in range(l + 1))
            self.b[l] = abs(s)
        return self.b[l]

    def term(self, j):
        """The j-th term's min(...) (j >= 3); e^{(j - 1) eps(j)} is g[j]."""
        lo = self.forward_difference(2 * (j // 2))
        hi = self.forward_difference(2 * ((j + 1) // 2))
        return min(4 * (lo * hi).sqrt(), 2 * self.g[j])

    def log_as(self, q):
        """log A for every integer order 0..max(ORDERS) (0 and 1: log 1)."""
        q = Decimal(repr(q))
        e2 = (2 * self.c).exp()
        second = min(4 * (e2 - 1), 2 * e2)
        top = int(max(ORDERS))
        terms = [self.term(j) * q ** j for j in range(3, top + 1)]
        out = [Decimal(0), Decimal(0)]
        for alpha in range(2, top + 1):
            a = 1 + q ** 2 * math.comb(alpha, 2) * second
            for j in range(3, alpha + 1):
                a += math.comb(alpha, j) * terms[j - 3]
            out.append(a.ln())
        return out

    def rdps(self, q):
        """The RDP at every order of ORDERS."""
        if q == 1.0:
            return [float(Decimal(repr(a)) * self.c) for a in ORDERS]
        log_a = self.log_as(q)
        out = []
        for alpha in ORDERS:
            f, c = math.floor(alpha), math.ceil(alpha)
            t = Decimal(repr(alpha)) - f
            out.append(float(((1 - t) * log_a[f] + t * log_a[c]) / (Decimal(repr(alpha)) - 1)))
        return out


def _log_add(x, y):
    a, b = min(x, y), max(x, y)
    return b if a == -np.inf else math.log1p(math.exp(a - b)) + b


def _log_sub_sign(x, y):
    if x > y:
        return True, x + math.log1p(-math.exp(y - x))
    if x < y:
        return False, y + math.log1p(-math.exp(x - y))
    return True, -np.inf


def _log_comb(n, k):
    return special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)


@functools.lru_cache(maxsize=None)
def float_forward_diffs(z):
    """dp_accounting's _get_forward_diffs(cgf, n) for the largest n ORDERS needs.

    deltas[i] is log |the (i+1)-th forward difference at 0 of exp(cgf(k - 1))|;
    it depends on z only (a smaller n gives a prefix of the same values)."""
    n = int(max(ORDERS))
    vec = np.zeros(n + 3)
    signs = np.ones(n + 3, dtype=bool)
    deltas = np.zeros(n + 2)
    for i in range(1, n + 3):
        vec[i] = cgf(z, i - 1.0)
    for i in range(n + 2):
        for j in range(n + 2 - i):
            if signs[j] == signs[j + 1]:
                signs[j], vec[j] = _log_sub_sign(vec[j + 1], vec[j])
                if not signs[j + 1]:
                    signs[j] = ~signs[j]
            else:
                vec[j] = _log_add(vec[j], vec[j + 1])
                signs[j] = signs[j + 1]
        deltas[i] = vec[0]
    return deltas


def cgf(z, x):
    """x eps(x + 1) of the Gaussian: its RDP is alpha / (2 z^2)."""
    return x * (x + 1) / (2.0 * z * z)


def float_log_a(q, z, alpha):
    """dp_accounting's _compute_rdp_sample_wor_gaussian_int, transcribed (alpha <= 256)."""
    if alpha == 1:
        return 0.0
    deltas = float_forward_diffs(z)
    f2 = 2.0 / (2.0 * z * z)
    log_f2m1 = f2 + math.log1p(-math.exp(-f2))
    log_a = 0.0
    for i in range(2, alpha + 1):
        if i == 2:
            s = 2 * math.log(q) + _log_comb(alpha, 2) + min(math.log(4) + log_f2m1,
                                                            f2 + math.log(2))
        else:
            lo = deltas[int(2 * math.floor(i / 2.0)) - 1]
            hi = deltas[int(2 * math.ceil(i / 2.0)) - 1]
            s = min(math.log(4) + 0.5 * (lo + hi), math.log(2) + cgf(z, i - 1))
            s += i * math.log(q) + _log_comb(alpha, i)
        log_a = _log_add(log_a, s)
    return log_a


def float_rdps(q, z):
    """dp_accounting's _compute_rdp_sample_wor_gaussian at every order of ORDERS."""
    if q == 1.0:
        return [a / (2 * z * z) for a in ORDERS]
    log_a = [float_log_a(q, z, a) if a >= 1 else 0.0 for a in range(int(max(ORDERS)) + 1)]
    out = []
    for alpha in ORDERS:
        f, c = math.floor(alpha), math.ceil(alpha)
        t = alpha - f
        out.append(((1 - t) * log_a[f] + t * log_a[c]) / (alpha - 1))
    return out


def epsilon(rdps, steps, delta):
    best = (math.inf, 0)
    for a, r in zip(ORDERS, rdps):
        e = steps * r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, (e, a))
    return (max(0.0, best[0]), best[1])



def compute():
    """The file's lines and the largest relative disagreement of the two evaluations."""
    lines = ["# Written by make_rdp_wor_golden.py (Wang, Balle, Kasiviswanathan 2019, Theorem 27,",
             "# in 400-digit decimals; Balle et al. 2020 conversion). Do not edit: run the script",
             "# again. Z is the replace-one noise multiplier (privacy.noise_multiplier / 2).",
             "# rdp Q Z ORDER RDP / eps Q Z STEPS DELTA EPS ORDER"]
    worst = 0.0
    for q in QS:
        for z in ZS:
            rdps = DecimalBound(z).rdps(q)
            for a, r, f in zip(ORDERS, rdps, float_rdps(q, z)):
                worst = max(worst, abs(f - r) / max(abs(r), 1e-300))
                if a in RDP_ORDERS:
                    lines.append(f"rdp {q!r} {z!r} {a!r} {r!r}")
            for steps in STEPS:
                for delta in DELTAS:
                    e, a = epsilon(rdps, steps, delta)
                    lines.append(f"eps {q!r} {z!r} {steps} {delta!r} {e!r} {a!r}")
    return lines, worst


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rdp_wor_golden.txt")
    lines, worst = compute()
    print(f"decimal vs dp_accounting's log-space algorithm: largest relative difference "
          f"{worst:.3g} (allowed {AGREEMENT:g})")
    if worst > AGREEMENT:
        sys.exit(1)
    sys.exit(check_or_write(out, lines, sys.argv))


if __name__ == "__main__":
    main()
