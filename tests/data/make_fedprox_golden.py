#!/usr/bin/env python3
"""Records tests/data/fedprox_golden.txt: FedProx's local steps in PyTorch.

An independent implementation of FedProx (Li et al. 2020) as its paper and
Flower's example write it: the proximal term (mu / 2) * ||w - w_global||^2
is added to the cross-entropy loss and autograd differentiates both; then
torch.optim steps. The model is Cohort's "mlp" preset with input_dim 6,
hidden [5], 3 classes, i.e. nn.Sequential(Linear(6, 5), ReLU, Linear(5, 3))
with the same flat layout (state_dict order, each tensor row-major). Eight
fixed samples, four steps over batches of four (samples 0-3, 4-7, 0-3, 4-7),
every case from the same start, which is also w_global.

  /usr/bin/python3 tests/data/make_fedprox_golden.py > tests/data/fedprox_golden.txt

Lines: "start" and the flat start vector; "features" (8 x 6, row-major)
and "labels" (8); then per case a "case" line (name, kind, lr,
weight_decay, momentum, mu) followed by one "step K" line per step with the
flat parameters after step K.
"""
import torch

torch.manual_seed(20201)
model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
START = torch.cat([v.detach().reshape(-1) for v in model.state_dict().values()]).clone()
X = torch.randn(8, 6)
Y = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1])
BATCHES = [(0, 4), (4, 8), (0, 4), (4, 8)]

CASES = [
    # name, kind, lr, weight_decay, momentum, mu
    ("sgd_prox", "sgd", 0.1, 0.0, 0.0, 1.0),
    ("sgd_momentum_wd_prox", "sgd", 0.1, 0.01, 0.9, 0.5),
    ("adam_prox", "adam", 0.01, 0.0, 0.0, 0.1),
    ("sgd_momentum_no_prox", "sgd", 0.1, 0.01, 0.9, 0.0),
]


def fmt(values):
    return " ".join("%.9g" % v for v in values)


def load(net, flat):
    offset = 0
    with torch.no_grad():
        for v in net.state_dict(keep_vars=True).values():
            v.copy_(flat[offset:offset + v.numel()].view_as(v))
            offset += v.numel()


print("# Recorded with torch " + torch.__version__ + " by tests/data/make_fedprox_golden.py")
print("start " + fmt(START.tolist()))
print("features " + fmt(X.reshape(-1).tolist()))
print("labels " + " ".join(str(int(v)) for v in Y.tolist()))
for name, kind, lr, wd, momentum, mu in CASES:
    load(model, START)
    global_params = [p.detach().clone() for p in model.parameters()]
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    print("case %s %s %r %r %r %r" % (name, kind, lr, wd, momentum, mu))
    for k, (lo, hi) in enumerate(BATCHES):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X[lo:hi]), Y[lo:hi])
        prox = sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), global_params))
        (loss + mu / 2 * prox).backward()
        opt.step()
        flat = torch.cat([v.detach().reshape(-1) for v in model.state_dict().values()])
        print("step %d %s" % (k + 1, fmt(flat.tolist())))
