#!/usr/bin/env python3
"""PyTorch eager on a GPU: the comparator of bench/gpu_check.sh.

Uses the peer's data loader and models (../shared/bench/peers/fmnist.py), on
the device: one epoch of SGD (lr 0.05) over the 60,000 training images at
the given batch, samples/s = 60000 / the epoch's wall time (synchronised),
then test accuracy. One JSON line per repeat.

  python3 bench/torch_gpu_train.py PEERS_DIR --model mlp|lenet --batch B [--repeats N]
"""
import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("peers")
parser.add_argument("--model", default="mlp")
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--repeats", type=int, default=2)
args = parser.parse_args()
sys.path.insert(0, args.peers)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import fmnist  # noqa: E402

dev = torch.device("cuda")
Xtr, Ytr = (t.to(dev) for t in fmnist.load("train"))
Xte, Yte = (t.to(dev) for t in fmnist.load("test"))
for rep in range(args.repeats):
    torch.manual_seed(rep)
    model = fmnist.make_model(args.model).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator(device=dev).manual_seed(rep)
    torch.cuda.synchronize()
    start = time.perf_counter()
    perm = torch.randperm(len(Xtr), generator=gen, device=dev)
    for i in range(0, len(Xtr), args.batch):
        idx = perm[i:i + args.batch]
        loss = F.cross_entropy(model(Xtr[idx]), Ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    acc, _ = fmnist.evaluate(model, Xte, Yte)
    print(json.dumps({"bench": "train_gpu", "impl": "pytorch", "model": args.model,
                      "batch": args.batch, "device": torch.cuda.get_device_name(0),
                      "torch": torch.__version__, "epoch_s": round(seconds, 4),
                      "samples_per_s": round(len(Xtr) / seconds, 1), "test_acc": acc}))
    sys.stdout.flush()
