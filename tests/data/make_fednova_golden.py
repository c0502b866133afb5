#!/usr/bin/python3
"""Writes fednova_golden.txt: FedNova's normaliser and server step in NumPy.

Wang et al. 2020 ("Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", arXiv:2007.07481, Section 4), as the
authors' distoptim/FedNova.py computes it, independently of Cohort, in
float64 from float32 inputs:

    a_i       tau_i (plain SGD); with momentum rho the sum over the steps of
              c_t = rho c_(t-1) + 1 (c_0 = 0): the recursion, not the closed
              form Cohort uses (aggregation/fednova.cc)
    d_i       float32(Delta_i / a_i), what client i sends
    tau_eff   sum n_i a_i / sum n_i
    Delta     tau_eff sum n_i d_i / sum n_i
    x         x + lr Delta (FedAvg; with server momentum, FedAvgM's first
              round, whose velocity is Delta)

The C++ test (coordinator/strategy_fednova_test.cc) computes a_i with
aggregation::FedNovaNorm, d_i with aggregation::NormaliseDelta, the mean with
the streaming FedAvg aggregator and the step with FedNovaStrategy around
MakeStrategy's FedAvg, and compares each.

Run: /usr/bin/python3 tests/data/make_fednova_golden.py (numpy only); the
output is deterministic.
"""
import os

import numpy as np

PARAMS = 6

# (steps, momentum) for the normaliser alone.
NORMS = [(1, 0.0), (7, 0.0), (1, 0.9), (2, 0.9), (10, 0.5), (40, 0.9), (1000, 0.99),
         (3, 0.1)]

# (name, momentum, server learning rate, server momentum, [(n_i, tau_i)]).
CASES = [
    ("sgd", 0.0, 1.0, 0.0, [(30, 3), (100, 10), (250, 25), (70, 7)]),
    ("momentum", 0.9, 1.0, 0.0, [(50, 5), (20, 12), (400, 40)]),
    ("fedavgm", 0.5, 0.7, 0.9, [(64, 2), (128, 9), (32, 30)]),
    # Equal steps: FedNova is FedAvg (the fedavg line).
    ("equal_steps", 0.9, 1.0, 0.0, [(10, 8), (200, 8), (45, 8)]),
]


def f32(x):
    """A float32 value (as the config and the wire hold it), in float64."""
    return np.float64(np.float32(x))


def norm(steps, rho):
    counter, a = 0.0, 0.0
    for _ in range(steps):
        if rho != 0:
            counter = counter * rho + 1
            a += counter
        else:
            a += 1
    return a


def line(tag, values):
    return tag + " " + " ".join(repr(float(v)) for v in values)


def run_case(case, rng, out):
    name, rho, lr, server_momentum, clients = case
    rho = f32(rho)
    x0 = rng.normal(0, 1, PARAMS).astype(np.float32)
    out.append("case %s %r %r %r %d" % (name, float(rho), lr, server_momentum, len(clients)))
    out.append(line("initial", x0))
    weighted, weight, weighted_a, fedavg = np.zeros(PARAMS), 0.0, 0.0, np.zeros(PARAMS)
    for n, tau in clients:
        global_model = x0
        local = (x0 + rng.normal(0, 0.01 * tau, PARAMS)).astype(np.float32)
        delta = (local - global_model).astype(np.float32)  # The float difference.
        a = norm(tau, rho)
        d = (delta.astype(np.float64) / a).astype(np.float32)
        out.append("client %d %d %r" % (n, tau, a))
        out.append(line("local", local))
        out.append(line("normalised", d))
        weighted += n * d.astype(np.float64)
        fedavg += n * delta.astype(np.float64)
        weighted_a += n * a
        weight += n
    tau_eff = weighted_a / weight
    step = tau_eff * weighted / weight
    out.append("tau_eff %r" % tau_eff)
    out.append(line("fedavg", fedavg / weight))
    out.append(line("model", x0.astype(np.float64) + f32(lr) * step))


def main():
    out = [
        "# Written by make_fednova_golden.py (NumPy float64, Wang et al. 2020 and the",
        "# authors' distoptim/FedNova.py). Do not edit: run the script again.",
        "params %d" % PARAMS,
    ]
    for steps, rho in NORMS:
        out.append("norm %d %r %r" % (steps, float(f32(rho)), norm(steps, f32(rho))))
    rng = np.random.default_rng(20261205)
    for case in CASES:
        run_case(case, rng, out)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fednova_golden.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
