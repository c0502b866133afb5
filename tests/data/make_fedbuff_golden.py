#!/usr/bin/python3
"""Golden numbers of coordinator/strategy_fedbuff_test.cc: FedBuff's staleness
weight s(tau) = 1 / sqrt(1 + tau) (Nguyen et al. 2022) applied to a fixed mean
delta, then the server step (FedAvg, FedAvgM) in float32 as Cohort does it.
Run: /usr/bin/python3 tests/data/make_fedbuff_golden.py"""
import numpy as np

DELTA = np.array([0.5, -1.25, 3.0, 1e-3], dtype=np.float32)
MODEL = np.array([1.0, 2.0, -0.5, 0.25], dtype=np.float32)
LR = np.float32(0.5)


def weighted(tau):
    s = 1.0 / np.sqrt(1.0 + tau)  # float64, rounded to float32 once
    return (s * DELTA.astype(np.float64)).astype(np.float32)


for tau in [0, 1, 3, 8, 99]:
    model = (MODEL + LR * weighted(tau)).astype(np.float32)
    print("fedavg tau", tau, "s", repr(1.0 / np.sqrt(1.0 + tau)),
          "model", [repr(float(x)) for x in model])

# FedAvgM (server.momentum 0.9): a group of staleness 3, then one of 0.
velocity, model = np.zeros(4, np.float32), MODEL.copy()
for tau in [3, 0]:
    velocity = (np.float32(0.9) * velocity + weighted(tau)).astype(np.float32)
    model = (model + LR * velocity).astype(np.float32)
print("fedavgm", [repr(float(x)) for x in model])
