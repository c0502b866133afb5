#!/usr/bin/python3
"""Writes rdp_golden.txt: the RDP of the sampled Gaussian mechanism by quadrature.

An independent check of privacy/rdp_accountant.cc. The C++ evaluates A_alpha
with Mironov, Talwar and Zhang's series (a binomial sum for integer orders,
erfc terms for fractional ones); this script integrates the definition
instead (arXiv:1908.10530, Section 3.3, with mu0 = N(0, s^2) and
mu = (1 - q) mu0 + q N(1, s^2)):

    A_alpha = E_{z ~ mu0} [ (mu(z) / mu0(z))^alpha ]
            = integral mu0(z) (1 - q + q exp((2z - 1) / (2 s^2)))^alpha dz

with scipy.integrate.quad around the integrand's peak (found with
scipy.optimize), in log space where it is large and as mu0 * expm1(...)
where A_alpha - 1 is small, so tiny RDP values keep their relative
precision. RDP(alpha) = log(A_alpha) / (alpha - 1); steps compose by
multiplication, and epsilon is the minimum over Opacus's DEFAULT_ALPHAS of

    rdp + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1)

(Balle et al. 2020, Theorem 21; what Opacus's get_privacy_spent uses).

Run: /usr/bin/python3 tests/data/make_rdp_golden.py (Debian's python3-scipy,
which scripts/setup.sh installs); deterministic. The C++ test
(privacy/rdp_accountant_test.cc) reads every line. With --check it writes
nothing and fails when the file differs from a fresh computation by more
than 1e-9 relative (meson test rdp_golden_test runs that).
"""
import math
import os
import sys
import warnings

from scipy import integrate, optimize
from golden_compare import check_or_write  # noqa: E402

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
QS = [0.001, 0.01, 0.04, 0.1, 0.5, 1.0]
SIGMAS = [0.7, 1.0, 1.5, 4.0]
STEPS = [1, 100, 10000]
DELTAS = [1e-5, 1e-7]
# Orders whose RDP is written out line by line (fractional and integer).
RDP_ORDERS = [1.1, 1.5, 2.0, 2.5, 3.0, 4.7, 8.0, 10.9, 12, 32, 63]


def log_a(q, sigma, alpha):
    """log A_alpha by quadrature."""
    s2 = sigma * sigma

    def log_mu0(z):
        return -z * z / (2 * s2) - 0.5 * math.log(2 * math.pi * s2)

    def log_ratio(z):  # alpha * log(mu(z) / mu0(z))
        x = (2 * z - 1) / (2 * s2)
        if q == 1.0:
            return alpha * x
        if x > 30:
            return alpha * (x + math.log(q) + math.log1p((1 - q) * math.exp(-x) / q))
        return alpha * math.log1p(q * math.expm1(x))

    peak = optimize.minimize_scalar(lambda z: -(log_mu0(z) + log_ratio(z)),
                                    bounds=(-10 * sigma, alpha + 10 * sigma + 1),
                                    method="bounded", options={"xatol": 1e-10})
    z_peak, top = peak.x, -peak.fun
    lo = min(-40 * sigma, z_peak - 40 * sigma) - 1
    hi = max(alpha, z_peak) + 40 * sigma + 1
    points = sorted({0.0, 0.5, z_peak})
    if top > 1:  # A_alpha is large: integrate exp(log f - top) - mu0 exp(-top).
        def scaled(z):
            return math.exp(log_mu0(z) + log_ratio(z) - top) - math.exp(log_mu0(z) - top)
        v, _ = integrate.quad(scaled, lo, hi, points=points, limit=1000, epsabs=0,
                              epsrel=1e-13)
        return top + math.log(v + math.exp(-top))

    def minus_one(z):  # mu0(z) * ((mu/mu0)^alpha - 1)
        r = log_ratio(z)
        if r > 1:
            return math.exp(log_mu0(z) + r) - math.exp(log_mu0(z))
        return math.exp(log_mu0(z)) * math.expm1(r)
    v, _ = integrate.quad(minus_one, lo, hi, points=points, limit=1000, epsabs=1e-300,
                          epsrel=1e-13)
    return math.log1p(v)


def rdp(q, sigma, alpha):
    # q = 1 (two Gaussians, alpha / (2 s^2) in closed form) is integrated all the same.
    return max(0.0, log_a(q, sigma, alpha)) / (alpha - 1)


def epsilon(rdps, steps, delta):
    best = (math.inf, 0)
    for a, r in zip(ORDERS, rdps):
        e = steps * r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, (e, a))
    return best



def main():
    warnings.simplefilter("ignore")  # quad's roundoff notes at epsrel 1e-13
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rdp_golden.txt")
    lines = ["# Written by make_rdp_golden.py (scipy.integrate.quad of the Renyi divergence of",
             "# the sampled Gaussian mechanism; Balle et al. 2020 conversion). Do not edit: run",
             "# the script again. rdp Q SIGMA ORDER RDP / eps Q SIGMA STEPS DELTA EPS ORDER"]
    for q in QS:
        for sigma in SIGMAS:
            rdps = [rdp(q, sigma, a) for a in ORDERS]
            for a, r in zip(ORDERS, rdps):
                if a in RDP_ORDERS:
                    lines.append(f"rdp {q!r} {sigma!r} {a!r} {r!r}")
            for steps in STEPS:
                for delta in DELTAS:
                    e, a = epsilon(rdps, steps, delta)
                    lines.append(f"eps {q!r} {sigma!r} {steps} {delta!r} {e!r} {a!r}")
    sys.exit(check_or_write(out, lines, sys.argv))


if __name__ == "__main__":
    main()
