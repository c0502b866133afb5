#!/usr/bin/python3
"""A federated site that is data-parallel inside: one cohort.Client whose
training runs on several DistributedDataParallel ranks over the `cohort`
torch.distributed backend.

Rank 0 is the site's federated client. Each round its fit hands the global
model to every rank; the ranks train one local round together with DDP
(each rank on its own shard of the site's data, gradients all-reduced over
shared memory); rank 0 returns the trained model to the coordinator,
weighed by the site's total sample count (`Client(num_samples=site.total)`). When the run finishes, rank 0 tells the
other ranks to stop and every rank exits 0.

    B=build/cli/cohort; export PYTHONPATH=build/python; D=runs/site
    # 1. The run's config: Cohort's mlp (20 features, 4 classes), 5 rounds,
    #    two clients per round.
    /usr/bin/python3 examples/python/site_pytorch.py prepare --out $D --clients 2
    $B coordinator --config $D/run.textproto --run-dir $D/run \\
        --bind tcp://127.0.0.1:7000 --insecure
    # 2. Site 0: two DDP ranks; this process is rank 0 (the federated client)
    #    and starts rank 1.
    /usr/bin/python3 examples/python/site_pytorch.py site --ranks 2 \\
        --coordinator tcp://127.0.0.1:7000 --insecure --plain --site 0
    # 3. Another client: here a second site of two ranks.
    /usr/bin/python3 examples/python/site_pytorch.py site --ranks 2 \\
        --coordinator tcp://127.0.0.1:7000 --insecure --plain --site 1
    $B status --run-dir $D/run

With keys instead of --insecure: `--identity keys/site-0.key --coordinator-key
keys/coordinator.pub [--peers keys/peers]` (rank 0 only uses them; the ranks
of one host meet over shared memory, no keys needed), and no --plain where the
config asks for SecAgg+ (`prepare --secagg`).

The ranks can also be started by torchrun (`torchrun --nproc_per_node 2
examples/python/site_pytorch.py site ...`: RANK and WORLD_SIZE from its
environment; a second torchrun on the host needs its own --master_port; the
torchrun of Debian's torch 1.13 fails at start under Python 3.11), or each by
hand, meeting through a file:

    for r in 0 1; do /usr/bin/python3 examples/python/site_pytorch.py site \\
        --rank $r --world-size 2 --init-method file:///tmp/site-0.store \\
        --coordinator tcp://127.0.0.1:7000 --insecure --plain --site 0 & done

Every rank prints a line per round: its samples, the site's loss and a
checksum of its model after the round; DDP keeps the ranks' models
identical, so the checksums agree.

Failures. A rank that dies or stalls breaks the site's process group, which
cannot be used again: rank 0's fit fails with the error naming the rank
(e.g. "rank 1 is gone (its process exited)"); rank 0 then says Goodbye to
the coordinator (the round goes on without the site, a dropout) and exits 1
with that message. A rank that loses rank 0 exits 1 with a message at once
when rank 0's process is gone, or after --timeout seconds when rank 0 stalls.
--timeout bounds every wait of the ranks, including the wait for the next
round between rounds: make it longer than a round of the whole federation.
"""

import argparse
import hashlib
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cohort
import cohort.distributed  # noqa: F401  (registers the "cohort" backend)
import cohort.torch as ct

FEATURES, CLASSES = 20, 4
TRAIN, STOP = 1, 2  # Rank 0's commands to the site's ranks.


def make_model(hidden):
    """Cohort's mlp under PyTorch's names: its flat vector is the coordinator's."""
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, CLASSES))


def site_data(site, samples):
    """The site's data: overlapping Gaussian clusters, one per class (a
    task the mlp learns to about 80%). The centres are the same on every
    site, the draws each site's own."""
    centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(1)) * 0.5
    g = torch.Generator().manual_seed(1000 + site)
    y = torch.randint(0, CLASSES, (samples,), generator=g)
    return centers[y] + torch.randn(samples, FEATURES, generator=g), y


def rank_shard(x, y, rank, world):
    """This rank's share of the site's data: every world-th sample. (A real
    site loads only its own files; every rank here makes the same data.)"""
    return x[rank::world], y[rank::world]


# --- What rank 0 sends each round: one int64 tensor, every rank receives it.

def encode(cmd, task=None):
    if task is None:
        return torch.tensor([cmd, 0, 0, 0, 0, 0, 0, 0], dtype=torch.int64)
    bits = [struct.unpack("<q", struct.pack("<d", float(v)))[0]
            for v in (task.learning_rate, task.momentum, task.weight_decay)]
    return torch.tensor([cmd, task.round, task.seed & (2**63 - 1), task.epochs,
                         task.batch_size, *bits], dtype=torch.int64)


def decode(t):
    v = t.tolist()
    floats = [struct.unpack("<d", struct.pack("<q", b))[0] for b in v[5:8]]
    return {"cmd": v[0], "round": v[1], "seed": v[2], "epochs": max(1, v[3]),
            "batch_size": max(1, v[4]), "learning_rate": floats[0], "momentum": floats[1],
            "weight_decay": floats[2]}


def say(line, stream=sys.stdout):
    """One line in one write: the ranks share a terminal (or a pipe)."""
    stream.write(line + "\n")
    stream.flush()


def checksum(model):
    return hashlib.sha256(ct.get_flat(model).tobytes()).hexdigest()[:16]


class Site:
    """One rank of the site: its DDP model and its shard."""

    def __init__(self, args, rank, world):
        self.rank, self.world = rank, world
        x, y = site_data(args.site, args.samples)
        self.total = len(y)
        self.x, self.y = rank_shard(x, y, rank, world)
        self.min_shard = self.total // world
        if self.min_shard < 1:
            raise SystemExit(f"site: {self.total} samples for {world} ranks: each rank needs one")
        torch.manual_seed(0)
        self.module = make_model(args.hidden)
        # DDP's constructor broadcasts rank 0's parameters: a collective.
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.module)
        self.num_params = ct.num_params(self.module)

    def command(self, cmd, task=None):
        """Rank 0: sends the command; the others: receive it."""
        t = encode(cmd, task) if self.rank == 0 else torch.zeros(8, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return decode(t)

    def train_round(self, c, params=None):
        """Every rank: the round's global model from rank 0, one DDP round on
        the shards; returns the site's (samples, metrics). `params` (rank 0):
        the global model in, the trained model out (in place)."""
        flat = (torch.from_numpy(params) if self.rank == 0
                else torch.empty(self.num_params, dtype=torch.float32))
        dist.broadcast(flat, src=0)
        ct.set_flat(self.module, flat.numpy())
        torch.manual_seed(c["seed"])
        opt = torch.optim.SGD(self.ddp.parameters(), lr=c["learning_rate"],
                              momentum=c["momentum"], weight_decay=c["weight_decay"])
        # The site's batch is split among the ranks; every rank takes the
        # same number of steps (DDP's all-reduces pair up), the shard's last
        # batch takes what is left.
        per_rank = max(1, c["batch_size"] // self.world)
        steps = math.ceil(self.min_shard / per_rank)
        shuffle = torch.Generator().manual_seed((c["seed"] * 1000003 + self.rank) % 2**63)
        self.ddp.train()
        sums = torch.zeros(3, dtype=torch.float32)  # loss * n, correct, n (every epoch)
        for _ in range(c["epochs"]):
            order = torch.randperm(len(self.y), generator=shuffle)
            for k in range(steps):
                idx = order[k * per_rank:(k + 1) * per_rank if k < steps - 1 else None]
                out = self.ddp(self.x[idx])
                loss = F.cross_entropy(out, self.y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()  # DDP all-reduces the gradients.
                opt.step()
                sums += torch.tensor([loss.item() * len(idx),
                                      (out.argmax(1) == self.y[idx]).sum().item(), len(idx)])
        dist.all_reduce(sums)  # The site's totals.
        mine = len(self.y)
        site_samples = int(round(sums[2].item())) // c["epochs"]
        metrics = {"loss": sums[0].item() / sums[2].item(),
                   "accuracy": sums[1].item() / sums[2].item()}
        say(f"site rank {self.rank}/{self.world} round {c['round']}: trained {mine} of the "
            f"site's {site_samples} samples, loss {metrics['loss']:.4f}, "
            f"accuracy {metrics['accuracy']:.4f}, model {checksum(self.module)}")
        if params is not None:
            ct.get_flat(self.module, out=params)  # Into the client's buffer: no copy.
        return site_samples, metrics


_FOLDERS = []  # Rank 0's temporary folders (--ranks), removed even by fail().


def fail(rank, message):
    say(f"site rank {rank}: {message}", sys.stderr)
    for folder in _FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)
    # No destroy_process_group: a broken group must not be waited on at exit.
    os._exit(1)


def run_worker(site):
    """Ranks 1..N-1: a round whenever rank 0 says, until it says stop."""
    while True:
        try:
            c = site.command(None)
            if c["cmd"] == STOP:
                break
            site.train_round(c)
        except Exception as e:  # noqa: BLE001  a collective failed: rank 0 is gone or stalled
            fail(site.rank, f"lost the site's process group ({e}); exiting")
    dist.barrier()  # Rank 0 knows every rank has stopped.
    say(f"site rank {site.rank}/{site.world}: stopped")
    dist.destroy_process_group()


def run_client(site, args):
    """Rank 0: the federated client; its fit runs a round on every rank."""
    broken, in_round = [], [False]

    def fit(params, task):
        try:
            in_round[0] = True  # Until every rank is through the round.
            site.command(TRAIN, task)
            out = (params, *site.train_round(decode(encode(TRAIN, task)), params))
            in_round[0] = False
            return out
        except Exception as e:  # noqa: BLE001  any failure leaves the ranks out of step
            broken.append(f"round {task.round}: site training failed: {e}")
            say(f"site rank 0: {broken[-1]}; the site's process group cannot be used again: "
                "leaving the run", sys.stderr)
            # SystemExit from fit: the client says Goodbye and run() re-raises
            # it; its message is the coordinator's record of why the site left.
            raise SystemExit(broken[-1]) from e

    client = cohort.Client(coordinator=args.coordinator, identity=args.identity,
                           coordinator_key=args.coordinator_key, peers=args.peers,
                           insecure=args.insecure, require_secure=not args.plain,
                           num_samples=site.total, num_params=site.num_params,
                           name=args.name or (None if args.identity else f"site-{args.site}"))
    try:
        client.run(fit)
    except SystemExit:
        fail(0, f"left the run after {broken[-1]}" if broken else "stopped")
    except BaseException as e:  # The run failed or Ctrl-C: the ranks stop all the same ...
        if in_round[0]:  # ... unless they are in the middle of a round: they see rank 0 go.
            fail(0, f"the run ended in the middle of a round ({type(e).__name__})")
        say(f"site rank 0: the run ended ({type(e).__name__}{': ' if str(e) else ''}{e}): "
            "stopping the other ranks", sys.stderr)
        stop(site)
        raise
    say(f"site rank 0/{site.world}: run finished")
    stop(site)


def stop(site):
    try:
        site.command(STOP)
        dist.barrier()
    except RuntimeError as e:
        fail(0, f"could not stop the other ranks ({e})")
    dist.destroy_process_group()


class Children:
    """--ranks N: ranks 1..N-1 as child processes of rank 0, meeting through a
    file in a fresh folder. A thread waits for each: a rank that died must
    be reaped, or it still looks alive to the others (the backend tells a
    dead rank from its process id)."""

    def __init__(self, world):
        self.folder = tempfile.mkdtemp(prefix="cohort-site-")
        _FOLDERS.append(self.folder)
        self.init = f"file://{self.folder}/store"
        self.procs, self.codes = [], {}
        argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
        for r in range(1, world):
            # Ctrl-C reaches rank 0 only: it stops the others after its Goodbye.
            p = subprocess.Popen(argv + ["--rank", str(r), "--world-size", str(world),
                                         "--init-method", self.init],
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            self.procs.append(p)
            threading.Thread(target=self._reap, args=(r, p), daemon=True).start()

    def _reap(self, rank, p):
        self.codes[rank] = p.wait()

    def wait(self, timeout=60):
        """Rank 0, after the others stopped: their exit codes."""
        for r, p in enumerate(self.procs, start=1):
            try:
                self.codes[r] = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                self.codes[r] = p.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        return self.codes


def site_main(args):
    torch.set_num_threads(1)
    children = None
    if not (args.rank or int(os.environ.get("RANK", 0))) and not (
            args.insecure or (args.identity and args.coordinator_key)):
        raise SystemExit("site: rank 0 needs --insecure, or --identity and --coordinator-key")
    if args.rank is not None:  # Started by hand (or by --ranks): --rank/--world-size/--init-method.
        rank, world, init = args.rank, args.world_size, args.init_method
        if world is None or init is None:
            raise SystemExit("site: --rank needs --world-size and --init-method")
    elif "RANK" in os.environ:  # torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
        rank, world, init = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://"
    else:  # --ranks N: this process is rank 0 and starts the others.
        if args.ranks < 1:
            raise SystemExit(f"site: --ranks {args.ranks}: expected 1 or more")
        rank, world = 0, args.ranks
        children = Children(world)
        init = children.init
    try:
        dist.init_process_group("cohort", init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=args.timeout))
        site = Site(args, rank, world)
    except RuntimeError as e:
        fail(rank, f"could not form the site's process group of {world} ranks ({e})")
    say(f"site rank {rank}/{world}: {len(site.y)} of the site's {site.total} samples, "
        f"{site.num_params} parameters (pid {os.getpid()})")
    if rank != 0:
        run_worker(site)
        return
    try:
        run_client(site, args)
    finally:
        codes = children.wait() if children is not None else {}
    if children is not None:
        for r, code in sorted(codes.items()):
            say(f"site rank {r}/{world}: exited {code}")
        if any(codes.values()):
            raise SystemExit(1)


def prepare(args):
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "run.textproto")
    secagg = "SECAGG_PLUS" if args.secagg else "PLAIN"
    with open(path, "w") as f:
        f.write(f"seed: 0\n"
                f"model {{ arch: \"mlp\" input_dim: {FEATURES} num_classes: {CLASSES} "
                f"hidden: {args.hidden} }}\n"
                "train { batch_size: 32 learning_rate: 0.05 momentum: 0.9 local_epochs: 1 }\n"
                f"rounds {{ num_rounds: {args.rounds} min_clients: {args.clients} "
                f"start_clients: {args.clients} round_deadline_s: 120 }}\n"
                f"secagg {{ aggregation: {secagg} }}\n")
    print(f"wrote {path} ({ct.num_params(make_model(args.hidden))} parameters)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prepare", help="write the coordinator's run.textproto")
    pre.add_argument("--out", required=True)
    pre.add_argument("--clients", type=int, default=2)
    pre.add_argument("--rounds", type=int, default=5)
    pre.add_argument("--hidden", type=int, default=32)
    pre.add_argument("--secagg", action="store_true", help="SecAgg+ (default: plain)")
    s = sub.add_parser("site", help="one rank of a site (rank 0: the federated client)")
    s.add_argument("--coordinator", required=True)
    s.add_argument("--identity")
    s.add_argument("--coordinator-key")
    s.add_argument("--peers")
    s.add_argument("--insecure", action="store_true", help="no CURVE (local development)")
    s.add_argument("--plain", action="store_true", help="accept rounds without SecAgg+")
    s.add_argument("--name", help="the client's name (default: site-K, or the key's name)")
    s.add_argument("--site", type=int, default=0, help="which site's data (K)")
    s.add_argument("--samples", type=int, default=1200, help="the site's samples, all ranks")
    s.add_argument("--hidden", type=int, default=32, help="the mlp's hidden units")
    s.add_argument("--timeout", type=float, default=1800,
                   help="seconds any rank waits for another (default 1800)")
    s.add_argument("--ranks", type=int, default=2,
                   help="the site's ranks, started by this process (without torchrun)")
    s.add_argument("--rank", type=int, help="started by hand: this rank")
    s.add_argument("--world-size", type=int, help="started by hand: the site's ranks")
    s.add_argument("--init-method", help="started by hand: where the ranks meet (file://...)")
    args = p.parse_args()
    if args.command == "prepare":
        prepare(args)
    else:
        site_main(args)


if __name__ == "__main__":
    main()
