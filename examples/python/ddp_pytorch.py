#!/usr/bin/env python3
"""DistributedDataParallel over Cohort's collectives: an ordinary DDP
script whose only Cohort line is the import that registers the backend.

  PYTHONPATH=build/python build/cli/cohort launch --nproc 2 -- \
      /usr/bin/python3 examples/python/ddp_pytorch.py [--backend cohort] [--epochs 1]

`cohort launch` (or torchrun, where it works: Debian 12's fails at start)
sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the `cohort`
backend meets the other ranks through torch's store (env://) and runs over
shared memory on one host (see python/cohort/distributed/__init__.py for tcp
between hosts and its keys). `--backend gloo` runs the same script over
gloo, for comparison.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cohort.distributed  # noqa: F401  (registers the "cohort" backend)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="cohort")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)  # env:// from torchrun's variables
    rank, world = dist.get_rank(), dist.get_world_size()

    # A toy task every rank can make alike: 4,096 points, 10 classes.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=gen)
    y = (x @ torch.randn(32, 10, generator=gen)).argmax(dim=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        for i in range(0, len(x), args.global_batch):
            # This rank's share of the global batch.
            lo = i + args.global_batch * rank // world
            hi = i + args.global_batch * (rank + 1) // world
            loss = F.cross_entropy(model(x[lo:hi]), y[lo:hi])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients over the backend
            opt.step()
        accuracy = (model(x).argmax(dim=1) == y).float().mean()
        dist.all_reduce(accuracy)  # SUM: gloo has no AVG
        accuracy /= world
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, accuracy {accuracy.item():.4f} "
                  f"({dist.get_backend()}, {world} ranks, "
                  f"{time.perf_counter() - start:.2f} s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
