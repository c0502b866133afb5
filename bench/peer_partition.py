#!/usr/bin/python3
"""Writes the exact client split that ../shared/bench/peers/fedavg_torch.py uses,
as a `cohort partition --assignment` file (one line of sample indices per client),
so Cohort and the PyTorch peer can train on the very same partition.

Usage: peer_partition.py PEERS_DIR {iid|dirichlet} SEED OUT [--clients 10] [--alpha 0.5]

It imports the peer's own split functions (nothing is copied) and draws from
numpy.random.default_rng(SEED) in the same order as its run_partition().
"""
import os
import sys


def main():
    peers, part, seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    opts = dict(clients=10, alpha=0.5)
    rest = sys.argv[5:]
    for i in range(0, len(rest), 2):
        opts[rest[i].lstrip("-")] = type(opts[rest[i].lstrip("-")])(rest[i + 1])
    sys.dont_write_bytecode = True
    sys.path.insert(0, peers)
    import numpy as np
    import fedavg_torch
    import fmnist
    y = fmnist._read_idx(os.path.join(fmnist.DATA_DIR, "train-labels-idx1-ubyte.gz"), 0x801, 8)
    rng = np.random.default_rng(seed)
    if part == "iid":
        shards = fedavg_torch.split_iid(len(y), opts["clients"], rng)
    else:
        shards, _ = fedavg_torch.split_dirichlet(y, opts["clients"], opts["alpha"], rng)
    with open(out, "w") as f:
        for s in shards:
            f.write(" ".join(str(int(i)) for i in s) + "\n")


if __name__ == "__main__":
    main()
