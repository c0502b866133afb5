#!/usr/bin/python3
"""The same DistributedDataParallel script over gloo and over the `cohort`
backend (issue 32, acceptance 4): samples/s per backend, runs alternating
gloo/cohort in one invocation, and the two backends' models compared.

  PYTHONPATH=build/python /usr/bin/python3 bench/ddp_cohort_bench.py \
      [--peers ../shared/bench/peers] [--worlds 2,4] [--pairs 5] [--settings comm,compute]

Each run: WORLD ranks, each a process forked from this one (CPU, float32,
torch.set_num_threads(1)), meeting through a FileStore in a fresh folder
(no port; gloo itself on 127.0.0.1). The training step below never names
the backend: init_process_group(BACKEND) is the only difference.

Workload: Fashion-MNIST (the peers' loader, ../shared/bench/peers/fmnist.py;
synthetic data of the same shape if it is missing), an MLP
784-2048-1024-10 (3,716,106 parameters, 14.9 MB of float32 gradients per
step, two DDP buckets), plain SGD lr 0.05, the global batch split evenly
over the ranks, every rank the same sample order (seed 0).

  comm     per-rank batch 16: a small batch, so the all-reduce of 14.9 MB
           is a large share of each step (what data parallelism with a
           few-million-parameter model on CPUs meets).
  compute  per-rank batch 128: eight times the compute per step for the
           same communication.

samples/s = timed steps x global batch / rank 0's time from a barrier
before the first timed step to a barrier after the last (after warm-up
steps). Per pair, the order alternates (gloo first, then cohort first, ...).
Each run's final parameters (rank 0; warm-up and timed steps) are compared
with the other backend's from the same pair: they start from the same
seed and see the same data, so they differ only by float rounding (the
backends add in different orders). Ends with a table: medians per backend
and the median of the per-pair ratios cohort/gloo.
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cohort.distributed  # noqa: E402,F401  (registers the "cohort" backend)

torch.set_num_threads(1)

SETTINGS = {
    # name: (per-rank batch, warm-up steps, timed steps)
    "comm": (16, 5, 300),
    "compute": (128, 3, 100),
}
HIDDEN = (2048, 1024)
LR = 0.05

# Set in the parent before the ranks fork (shared copy-on-write).
DATA = {}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, HIDDEN[0]), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN[0], HIDDEN[1]), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN[1], 10))


def load_data(peers):
    try:
        sys.path.insert(0, peers)
        import fmnist
        x, y = fmnist.load("train")
        source = f"Fashion-MNIST train ({fmnist.DATA_DIR})"
    except (ImportError, OSError) as e:
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(60000, 784, generator=gen)
        y = (x @ torch.randn(784, 10, generator=gen)).argmax(dim=1)
        source = f"synthetic 60000x784 (Fashion-MNIST not loaded: {e})"
    gen = torch.Generator().manual_seed(0)
    return x, y, torch.randperm(len(x), generator=gen), source


def train(rank, world, backend, per_rank, warmup, steps):
    """The DDP script: nothing below names the backend."""
    x, y, order = DATA["x"], DATA["y"], DATA["order"]
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    global_batch = per_rank * world
    losses = []

    def step(i):
        lo = (i * global_batch) % len(order)
        idx = order[lo:lo + global_batch][per_rank * rank:per_rank * (rank + 1)]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets here
        opt.step()
        return loss

    for i in range(warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        loss = step(i)
    dist.barrier()
    seconds = time.perf_counter() - start
    losses.append(loss.item())
    state = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    digest = hashlib.sha256(state.numpy().tobytes()).hexdigest()[:16]
    out = {"seconds": seconds, "samples_per_s": steps * global_batch / seconds,
           "loss": losses[-1], "digest": digest, "backend": dist.get_backend()}
    if rank == 0:
        out["state"] = state.numpy().tobytes()
    return out


def _rank_main(rank, world, backend, store, cfg, results):
    try:
        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=120))
        results.put((rank, "ok", train(rank, world, backend, *cfg)))
        dist.barrier()
    except BaseException as e:  # noqa: B902  every failure goes back to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # no destroy_process_group: a failed group must not wait at exit


def run_once(backend, world, cfg, wait_s):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="ddp-bench-")
    procs = [ctx.Process(target=_rank_main,
                         args=(r, world, backend, os.path.join(folder, "store"), cfg, results))
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        out = {}
        deadline = time.monotonic() + wait_s
        while len(out) < world and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.5)
                out[rank] = (status, value)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
            if p.is_alive():
                p.kill()
                p.join()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    bad = {r: v for r, v in out.items() if v[0] != "ok"}
    if bad or len(out) < world:
        missing = [r for r in range(world) if r not in out]
        raise RuntimeError(f"{backend} world {world}: " + "; ".join(
            [f"rank {r}: {v[1]}" for r, v in sorted(bad.items())] +
            [f"rank {r}: no result (hung or died)" for r in missing]))
    ranks = [out[r][1] for r in range(world)]
    if any(v["backend"] != backend for v in ranks):
        raise RuntimeError(f"asked for {backend}, ran {ranks[0]['backend']}")
    return ranks


def main():
    parser = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--peers", default=os.path.join(here, "..", "..", "shared", "bench",
                                                         "peers"))
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--settings", default="comm,compute")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiplies every setting's timed steps")
    parser.add_argument("--wait-s", type=float, default=300)
    args = parser.parse_args()

    x, y, order, source = load_data(args.peers)
    DATA.update(x=x, y=y, order=order)
    params = sum(p.numel() for p in make_model().parameters())
    t0 = time.time()
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}; data: {source}; MLP 784-{HIDDEN[0]}-{HIDDEN[1]}-10, "
          f"{params:,} parameters; SGD lr {LR}", flush=True)

    rows = []
    for name in args.settings.split(","):
        per_rank, warmup, steps = SETTINGS[name]
        steps = max(2, int(round(steps * args.steps_scale)))
        cfg = (per_rank, warmup, steps)
        for world in [int(w) for w in args.worlds.split(",")]:
            figures = {"gloo": [], "cohort": []}
            ratios, diffs = [], []
            for pair in range(args.pairs):
                order_ = ("gloo", "cohort") if pair % 2 == 0 else ("cohort", "gloo")
                finals = {}
                for backend in order_:
                    ranks = run_once(backend, world, cfg, args.wait_s)
                    r0 = ranks[0]
                    figures[backend].append(r0["samples_per_s"])
                    finals[backend] = torch.frombuffer(bytearray(r0["state"]),
                                                       dtype=torch.float32).double()
                    same = len({v["digest"] for v in ranks}) == 1
                    print(json.dumps({"setting": name, "world": world, "pair": pair,
                                      "backend": backend, "per_rank_batch": per_rank,
                                      "steps": steps, "seconds": round(r0["seconds"], 3),
                                      "samples_per_s": round(r0["samples_per_s"], 1),
                                      "last_loss": round(r0["loss"], 4),
                                      "ranks_same_bits": same}), flush=True)
                ratios.append(figures["cohort"][-1] / figures["gloo"][-1])
                diff = (finals["gloo"] - finals["cohort"]).abs().max().item()
                scale = finals["gloo"].abs().max().item()
                diffs.append(diff / scale)
                print(f"#   pair {pair}: cohort/gloo {ratios[-1]:.2f}x; models: max |gloo - "
                      f"cohort| = {diff:.3g} (relative to max |param| {scale:.3g}: "
                      f"{diff / scale:.2g}, {'agree' if diff <= 1e-5 * scale else 'DIFFER'} "
                      f"to 1e-5)", flush=True)
            rows.append({"setting": name, "world": world, "per_rank_batch": per_rank,
                         "global_batch": per_rank * world, "steps": steps,
                         "gloo": figures["gloo"], "cohort": figures["cohort"],
                         "ratios": ratios, "max_rel_diff": max(diffs)})

    print(f"\n# {len(rows)} settings, {time.time() - t0:.0f} s in all; samples/s: median of "
          f"{args.pairs} runs each; ratio: median of the per-pair ratios cohort/gloo")
    print("| setting | ranks | per-rank batch | gloo samples/s | cohort samples/s | "
          "cohort/gloo (median; per pair) | models: max rel. diff |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['world']} | {r['per_rank_batch']} | "
              f"{statistics.median(r['gloo']):.0f} | {statistics.median(r['cohort']):.0f} | "
              f"**{statistics.median(r['ratios']):.2f}×** "
              f"({', '.join(f'{q:.2f}' for q in r['ratios'])}) | {r['max_rel_diff']:.1g} |")
    agree = all(r["max_rel_diff"] <= 1e-5 for r in rows)
    print(f"# models agree to 1e-5 (relative to the largest parameter) in every pair: "
          f"{'yes' if agree else 'NO'}")
    # float32 rounding grows with the steps: 100 steps of a 3.7M-parameter
    # model at 4 ranks came to 6e-4 with both backends equally far from a
    # float64 run (bench/README.md). Past 1e-3 it is no longer rounding.
    return 0 if all(r["max_rel_diff"] <= 1e-3 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
