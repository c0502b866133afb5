#!/usr/bin/env python3
"""PyTorch DDP over Gloo: the comparator of `bench/run.sh dp`.

N processes on this host (torch.distributed, gloo on loopback), the peer's
data and models (../shared/bench/peers/fmnist.py), synchronous SGD (lr 0.05)
with a global batch split evenly over the ranks, like `cohort launch`. One
epoch; samples/s = 60000 / the epoch's wall time (all ranks, barrier to
barrier). One JSON line from rank 0.

  /usr/bin/python3 bench/ddp_torch.py PEERS_DIR --world N --global-batch B [--model mlp]
"""
import argparse
import json
import os
import socket
import sys
import time

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def run(rank, args, port):
    sys.path.insert(0, args.peers)
    import fmnist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    Xtr, Ytr = fmnist.load("train")
    Xte, Yte = fmnist.load("test")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(fmnist.make_model(args.model))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(Xtr), generator=gen)
    dist.barrier()
    start = time.perf_counter()
    for i in range(0, len(Xtr), args.global_batch):
        # Every rank an equal share (+-1) of the global batch, as cohort's
        # workers; DDP averages the ranks' mean gradients.
        batch = perm[i:i + args.global_batch]
        idx = batch[len(batch) * rank // args.world:len(batch) * (rank + 1) // args.world]
        loss = F.cross_entropy(model(Xtr[idx]), Ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        acc, _ = fmnist.evaluate(model.module, Xte, Yte)
        print(json.dumps({"bench": "dp", "impl": "torch-ddp-gloo", "model": args.model,
                          "world": args.world, "global_batch": args.global_batch,
                          "epoch_s": round(seconds, 3),
                          "samples_per_s": round(len(Xtr) / seconds, 1), "test_acc": acc}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("peers")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--model", default="mlp")
    args = parser.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(args, port), nprocs=args.world, join=True)
