#!/usr/bin/env python3
"""Records tests/data/optimizer_golden.txt with PyTorch's own optimizers.

Five float32 parameters, three steps with fixed gradients, for torch.optim's
SGD (momentum, dampening, weight decay, Nesterov), Adam and AdamW, and the
server optimizer (FedAvgM: velocity = m v + delta, global += lr v, which is
torch.optim.SGD with momentum m on the pseudo-gradient -delta).

  /usr/bin/python3 tests/data/make_optimizer_golden.py > tests/data/optimizer_golden.txt

Each case is one line: name, kind, lr, weight_decay, momentum, dampening,
nesterov, beta1, beta2, eps, then the five parameters after the third step.
"""
import torch

P0 = [0.5, -1.25, 2.0, 0.0, -0.75]
GRADS = [[0.1, -0.2, 0.3, -0.4, 0.5],
         [-0.3, 0.1, 0.05, 0.2, -0.1],
         [0.25, 0.25, -0.5, 0.0, 0.125]]

CASES = [
    ("sgd", "sgd", dict(lr=0.1)),
    ("sgd_momentum_wd", "sgd", dict(lr=0.1, weight_decay=0.01, momentum=0.9)),
    ("sgd_dampening", "sgd", dict(lr=0.1, momentum=0.9, dampening=0.5)),
    ("sgd_nesterov", "sgd", dict(lr=0.1, weight_decay=0.01, momentum=0.9, nesterov=True)),
    ("sgd_wd_only", "sgd", dict(lr=0.05, weight_decay=0.1)),
    ("adam", "adam", dict(lr=0.01)),
    ("adam_l2", "adam", dict(lr=0.01, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6)),
    ("adamw", "adamw", dict(lr=0.01, weight_decay=0.1)),
    ("adamw_betas", "adamw", dict(lr=0.003, weight_decay=0.5, betas=(0.5, 0.9), eps=1e-4)),
    # Server optimizer: SGD with momentum on -delta (rows of GRADS are deltas).
    ("server_momentum", "server", dict(lr=0.7, momentum=0.9)),
    ("server_plain", "server", dict(lr=1.0, momentum=0.0)),
]

print("# Recorded with torch " + torch.__version__ + " by tests/data/make_optimizer_golden.py")
for name, kind, o in CASES:
    p = torch.tensor(P0, dtype=torch.float32, requires_grad=True)
    if kind == "adam":
        opt = torch.optim.Adam([p], **o)
    elif kind == "adamw":
        opt = torch.optim.AdamW([p], **o)
    else:
        opt = torch.optim.SGD([p], **o)
    for g in GRADS:
        grad = torch.tensor(g, dtype=torch.float32)
        p.grad = -grad if kind == "server" else grad
        opt.step()
    betas = o.get("betas", (0.9, 0.999))
    fields = [name, kind, o.get("lr"), o.get("weight_decay", 0.0), o.get("momentum", 0.0),
              o.get("dampening", 0.0), int(o.get("nesterov", False)), betas[0], betas[1],
              o.get("eps", 1e-8)]
    print(" ".join(str(f) for f in fields) + " " +
          " ".join("%.9g" % v for v in p.detach().tolist()))
