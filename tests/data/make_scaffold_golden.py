#!/usr/bin/env python3
"""Records tests/data/scaffold_golden.txt: one SCAFFOLD round in plain NumPy.

An independent implementation of SCAFFOLD (Karimireddy et al. 2020,
Algorithm 1, option II) with NIID-Bench's conventions (experiments.py,
train_net_scaffold and the scaffold branch of the main loop):
  * each local step is torch.optim.SGD's (momentum, weight decay) followed
    by y <- y - lr (c - c_i), the correction outside the momentum buffer;
  * K counts every step of every epoch; c_i+ = c_i - c + (x - y) / (K lr);
  * the model: x <- x + eta_g * sum_i p_i (y_i - x), p_i = n_i / sum n
    (NIID-Bench: eta_g = 1, the sample-weighted average of the local models);
  * the variate: c <- c + (1 / N) * sum_{i in S} (c_i+ - c_i), unweighted,
    N the number of clients (NIID-Bench's n_parties).
The model is Cohort's "mlp" preset with input_dim 6, hidden [5], 3 classes:
Linear(6, 5), ReLU, Linear(5, 3), flat in state_dict order (each weight
[out, in] row-major, then its bias). Loss: mean softmax cross-entropy over
the batch. Every step is over a client's whole shard (one batch per epoch),
so the shuffled order does not change the step beyond summation order.

  /usr/bin/python3 tests/data/make_scaffold_golden.py > tests/data/scaffold_golden.txt

Lines: "start" (x), "c" (the server variate), "features" (8 x 6) and
"labels" (8); per client a "client NAME LO HI EPOCHS LR MOMENTUM WD" line
(its shard is samples LO..HI-1), then "ci" (its variate before the round),
"local" (y after its EPOCHS steps), "ci_plus" and "delta_c"; then "server
N ETA_G" and "x" and "c_new" after the round of the listed clients.
"""
import numpy as np

rng = np.random.default_rng(20200)
IN, HID, OUT = 6, 5, 3
SIZES = [HID * IN, HID, OUT * HID, OUT]
P = sum(SIZES)
START = (rng.standard_normal(P) * 0.3).astype(np.float32)
C = (rng.standard_normal(P) * 0.05).astype(np.float32)
X = rng.standard_normal((8, IN)).astype(np.float32)
Y = np.array([0, 1, 2, 1, 0, 2, 2, 1])
N_CLIENTS = 4
ETA_G = 1.0
CLIENTS = [
    # name, lo, hi, epochs (= steps), lr, momentum, weight_decay
    ("a", 0, 5, 3, 0.1, 0.0, 0.0),
    ("b", 5, 8, 2, 0.05, 0.9, 0.01),
]


def unpack(p):
    w1, b1, w2, b2 = np.split(p, np.cumsum(SIZES)[:-1])
    return w1.reshape(HID, IN), b1, w2.reshape(OUT, HID), b2


def grad(p, x, y):
    w1, b1, w2, b2 = unpack(p.astype(np.float64))
    h = np.maximum(x @ w1.T + b1, 0)
    z = h @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    s = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    s[np.arange(len(y)), y] -= 1
    dz = s / len(y)
    gw2, gb2 = dz.T @ h, dz.sum(axis=0)
    dh = (dz @ w2) * (h > 0)
    gw1, gb1 = dh.T @ x, dh.sum(axis=0)
    return np.concatenate([gw1.ravel(), gb1, gw2.ravel(), gb2]).astype(np.float32)


def fmt(values):
    return " ".join("%.9g" % v for v in values)


print("# Recorded with numpy " + np.__version__ + " by tests/data/make_scaffold_golden.py")
print("start " + fmt(START))
print("c " + fmt(C))
print("features " + fmt(X.ravel()))
print("labels " + " ".join(str(int(v)) for v in Y))
total = sum(hi - lo for _, lo, hi, *_ in CLIENTS)
sum_dy = np.zeros(P, np.float64)
sum_dc = np.zeros(P, np.float64)
for name, lo, hi, epochs, lr, momentum, wd in CLIENTS:
    ci = (rng.standard_normal(P) * 0.05).astype(np.float32)
    y = START.copy()
    buf = None
    lr32, mom32, wd32 = np.float32(lr), np.float32(momentum), np.float32(wd)
    for _ in range(epochs):
        g = grad(y, X[lo:hi], Y[lo:hi]) + wd32 * y
        if momentum != 0:
            buf = g.copy() if buf is None else mom32 * buf + g
            g = buf
        y = y - lr32 * g
        y = y - lr32 * (C - ci)  # NIID-Bench: after the optimizer's step.
    ci_plus = (ci.astype(np.float64) - C + (START.astype(np.float64) - y) / (epochs * lr))
    delta_c = ci_plus - ci
    print("client %s %d %d %d %r %r %r" % (name, lo, hi, epochs, lr, momentum, wd))
    print("ci " + fmt(ci))
    print("local " + fmt(y))
    print("ci_plus " + fmt(ci_plus))
    print("delta_c " + fmt(delta_c))
    sum_dy += (hi - lo) / total * (y.astype(np.float64) - START)
    sum_dc += delta_c
print("server %d %r" % (N_CLIENTS, ETA_G))
print("x " + fmt(START + ETA_G * sum_dy))
print("c_new " + fmt(C + sum_dc / N_CLIENTS))
