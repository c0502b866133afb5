#!/usr/bin/python3
"""Writes fedopt_golden.txt: the adaptive server optimizers stepped in NumPy.

FedAdam, FedYogi and FedAdagrad as Reddi et al. 2021 ("Adaptive Federated
Optimization", arXiv:2003.00295v5, Algorithm 2) state them, computed
independently of Cohort in float64 from float32 inputs: the C++ test
(coordinator/strategy_test.cc) steps the same inputs through MakeStrategy
and compares every model, m and v at a float32 tolerance.

    m = b1 m + (1 - b1) d
    v = v + d^2                          Adagrad
    v = v - (1 - b2) d^2 sign(v - d^2)   Yogi
    v = b2 v + (1 - b2) d^2              Adam
    x = x + lr m / (sqrt(v) + tau)
with m starting at 0 and v at tau^2.

Run: /usr/bin/python3 tests/data/make_fedopt_golden.py (numpy only); the
output is deterministic.
"""
import os

import numpy as np

PARAMS = 7
ROUNDS = 6

# (optimizer, learning_rate, beta_1, beta_2, tau); beta_2 is unused by
# FEDADAGRAD. Flower's default learning rates and betas first (with
# Cohort's default tau 1e-3; Flower's is 1e-9 for FEDADAM and FEDADAGRAD),
# then settings that stress one term.
CASES = [
    ("FEDADAM", 0.1, 0.9, 0.99, 1e-3),
    ("FEDADAM", 0.5, 0.5, 0.9, 0.1),
    ("FEDYOGI", 0.01, 0.9, 0.99, 1e-3),
    ("FEDYOGI", 0.3, 0.0, 0.5, 1e-2),
    ("FEDADAGRAD", 0.1, 0.9, 0.0, 1e-3),
    ("FEDADAGRAD", 0.1, 0.0, 0.0, 1e-9),
]


def f32(x):
    """A float32 value (as the config and the wire hold it), in float64."""
    return np.float64(np.float32(x))


def inputs():
    rng = np.random.default_rng(20261205)
    x0 = rng.normal(0, 1, PARAMS).astype(np.float32)
    deltas = rng.normal(0, 0.05, (ROUNDS, PARAMS)).astype(np.float32)
    # Coordinates that test the edges: a delta that stays 0 (v only decays
    # or stays), one that grows 100x after round 3 (Yogi's sign flips), one
    # that changes sign every round (m cancels).
    deltas[:, 0] = 0
    deltas[3:, 1] *= 100
    deltas[:, 2] = np.float32(0.02) * np.array([(-1) ** r for r in range(ROUNDS)], np.float32)
    return x0, deltas


def run(case, x0, deltas):
    name, lr, b1, b2, tau = case
    lr, b1, b2, tau = f32(lr), f32(b1), f32(b2), f32(tau)
    x = x0.astype(np.float64)
    m = np.zeros(PARAMS)
    v = np.full(PARAMS, f32(np.float32(tau) * np.float32(tau)))
    steps = []
    for d in deltas.astype(np.float64):
        m = b1 * m + (1 - b1) * d
        if name == "FEDADAGRAD":
            v = v + d * d
        elif name == "FEDYOGI":
            v = v - (1 - b2) * d * d * np.sign(v - d * d)
        else:
            v = b2 * v + (1 - b2) * d * d
        x = x + lr * m / (np.sqrt(v) + tau)
        steps.append((x.copy(), m.copy(), v.copy()))
    return steps


def line(tag, values):
    return tag + " " + " ".join(repr(float(v)) for v in values)


def main():
    x0, deltas = inputs()
    out = [
        "# Written by make_fedopt_golden.py (NumPy float64, Reddi et al. 2021 Algorithm 2).",
        "# Do not edit: run the script again.",
        "params %d rounds %d" % (PARAMS, ROUNDS),
        line("initial", x0),
    ]
    out += [line("delta", d) for d in deltas]
    for case in CASES:
        name, lr, b1, b2, tau = case
        out.append("case %s %r %r %r %r" % (name, lr, b1, b2, tau))
        for x, m, v in run(case, x0, deltas):
            out += [line("model", x), line("m", m), line("v", v)]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fedopt_golden.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
