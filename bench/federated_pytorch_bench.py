#!/usr/bin/python3
"""Issue 32: a model the C++ engine cannot express trains securely.

examples/python/federated_pytorch.py's CNN (BatchNorm, dropout, a residual
connection), imported from the example (Net, client_share, make_fit), on
Fashion-MNIST split Dirichlet(0.5) over 5 clients, 10 rounds, batch 32,
SGD lr 0.05, 1 local epoch:

  cohort : a real `cohort coordinator` on 127.0.0.1 (CURVE keys, an
           allowlist, SecAgg+, model.external, --initial-model) and 5
           cohort.Client processes running the example's fit; the final
           model read back with cohort.torch.load_flat.
  torch  : plain FedAvg of the same model in PyTorch alone, in this process:
           the same initial weights, the same split, the same local
           training (seeded with the seeds the coordinator gave each
           client in each round, read from the cohort clients' logs, so
           shuffling and dropout are the same), then the sample-weighted
           mean of every floating-point state_dict entry (parameters and
           BatchNorm's running statistics), as the coordinator computes it.

Both final models are evaluated on the 10,000 test images. Also reported:
how far the two global models drift apart round by round (the cohort
clients' received parameters against the torch loop's), the largest update
coordinate against secagg.clip, whether any client clipped, and
(--reference-seeds, default 1) the plain loop again with every client's
seed changed: how far the accuracy moves with shuffling and dropout alone.

With every BLAS/OpenMP pool at one thread (set below, inherited by the
clients), a client's local training is bit-identical to the torch loop's
given the same starting model, so the two runs differ only by what
secure aggregation does to the sum (clipping at secagg.clip, fixed point,
stochastic rounding) and the float order of the mean.

    PYTHONPATH=build/python /usr/bin/python3 bench/federated_pytorch_bench.py \\
        [--cohort build/cli/cohort] [--out DIR] [--rounds 10]

Exits 1 when `cohort status` does not show every round secagg+ and
committed with all 5 clients. JSON summary on the last line.
"""

import argparse
import importlib.util
import json
import os
import sys
import time
import types

# One thread for every BLAS and OpenMP pool, here and in the clients (which
# inherit it), before NumPy or torch load them: torch.set_num_threads(1)
# alone leaves OpenBLAS's own pool as it is, and its GEMMs then sum in
# another order, so the same local training drifts apart in the last bits
# (found by this bench: round 1's losses differed at 1e-5 without it).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "python", "federated_pytorch.py")
CLIENTS = 5


def load_example():
    spec = importlib.util.spec_from_file_location("federated_pytorch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------
# A cohort client (a child process): the example's fit, logging each task.

def client_main(args):
    import torch

    import cohort

    ex = load_example()
    torch.set_num_threads(1)
    data = ex.client_share(args.index, CLIENTS)
    model = ex.Net()
    fit = ex.make_fit(model, data)

    def logged_fit(params, task):
        if args.dump:  # The global model this round starts from.
            np.save(f"{args.dump}-{task.round}.npy", params)
        start = time.perf_counter()
        out, n, metrics = fit(params, task)
        print("TASK " + json.dumps({
            "round": task.round, "seed": task.seed, "secure": task.secure,
            "n": n, "epochs": task.epochs, "batch_size": task.batch_size,
            "learning_rate": task.learning_rate, "momentum": task.momentum,
            "weight_decay": task.weight_decay, "fit_s": time.perf_counter() - start,
            "loss": metrics["loss"]}), flush=True)
        return out, n, metrics

    cohort.Client(coordinator=args.coordinator, identity=args.identity,
                  coordinator_key=args.coordinator_key, peers=args.peers,
                  num_samples=len(data), num_params=ex.ct.num_params(model),
                  name=f"client-{args.index}").run(logged_fit)
    print("run finished", flush=True)


# --------------------------------------------------------------------------
# Plain FedAvg in PyTorch alone.

def local_train(model, data, global_state, task):
    """One client's round, as the example's fit does it, without Cohort:
    returns (state_dict copy, samples of one epoch)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    model.load_state_dict(global_state, strict=False)  # num_batches_tracked stays local.
    torch.manual_seed(task["seed"])
    loader = DataLoader(data, batch_size=task["batch_size"], shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=task["learning_rate"],
                          momentum=task["momentum"], weight_decay=task["weight_decay"])
    model.train()
    n = 0
    for _ in range(max(1, task["epochs"])):
        n = 0
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            n += len(y)
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if torch.is_floating_point(v)}, n


def plain_fedavg(ex, datas, init_state, tasks, rounds):
    """tasks[(round, client)]: the task dict the cohort client logged.
    Returns the final state, each round's starting global (flat) and each
    round's largest update coordinate."""
    import torch

    models = [ex.Net() for _ in range(CLIENTS)]  # One per client, as in the cohort run.
    state = {k: v.clone() for k, v in init_state.items()}
    starts, max_delta = {}, {}
    for r in range(1, rounds + 1):
        starts[r] = torch.cat([v.reshape(-1) for v in state.values()]).numpy().copy()
        results = [local_train(models[c], datas[c], state, tasks[(r, c)])
                   for c in range(CLIENTS)]
        total = sum(n for _, n in results)
        new = {}
        for k in state:
            acc = torch.zeros_like(state[k], dtype=torch.float64)
            for s, n in results:
                acc += s[k].double() * n
            new[k] = (acc / total).float()
        max_delta[r] = max(float((s[k] - state[k]).abs().max()) for s, _ in results for k in s)
        state = new
    return state, starts, max_delta


def evaluate(ex, model):
    import torch

    images = ex.read_idx("t10k-images-idx3-ubyte.gz")
    labels = torch.from_numpy(ex.read_idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == labels[i:i + 1000]).sum().item()
    return correct / len(x)


# --------------------------------------------------------------------------

def bench_main(args):
    import torch

    sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
    import harness

    os.environ["COHORT_BIN"] = os.path.abspath(args.cohort)
    build_python = os.path.join(ROOT, "build", "python")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [build_python, os.environ.get("PYTHONPATH")] if p)
    import cohort.torch as ct

    torch.set_num_threads(1)
    ex = load_example()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "run")):
        sys.exit(f"{out}/run exists: give a new --out")
    run = harness.Run("fedpt")
    os.rmdir(run.dir)
    run.dir = out

    # The example's own prepare: init.npz (torch.manual_seed(0); Net()) and
    # the config (model.external with the state_dict's layout, SecAgg+).
    ex.prepare(types.SimpleNamespace(out=out, clients=CLIENTS))
    config = run.path("run.textproto")
    with open(config) as f:
        text = f.read()
    text = text.replace("num_rounds: 10", f"num_rounds: {args.rounds}")
    with open(config, "w") as f:
        f.write(text)
    names = [f"client-{i}" for i in range(CLIENTS)]
    run.keygen(["coordinator"] + names, allow=names)

    start = time.monotonic()
    run.start_coordinator(config, curve=True,
                          extra=["--initial-model", run.path("init.npz")])
    clients = []
    for i, name in enumerate(names):
        argv = [sys.executable, os.path.abspath(__file__), "client", "--index", str(i),
                "--coordinator", run.endpoint, "--identity", run.path(f"keys/{name}.key"),
                "--coordinator-key", run.path("keys/coordinator.pub"),
                "--peers", run.path("allow")]
        if i == 0:
            argv += ["--dump", run.path("received")]
        clients.append(run.spawn(argv, f"{name}.log"))
    code = run.coordinator.wait(args.timeout)
    cohort_s = time.monotonic() - start
    if code != 0:
        sys.exit(f"coordinator exited {code}:\n{run.coordinator.output()[-4000:]}")
    tasks = {}
    clipped = []
    for i, c in enumerate(clients):
        if c.wait(60) != 0:
            sys.exit(f"client {i} failed:\n{c.output()[-4000:]}")
        for line in c.output().splitlines():
            if line.startswith("TASK "):
                t = json.loads(line[5:])
                tasks[(t["round"], i)] = t
            if "clipped" in line:
                clipped.append(f"client-{i}: {line.strip()}")

    # Every round secure and complete, as `cohort status` shows it.
    table = run.status()
    rounds = run.rounds()
    ok = (sorted(rounds) == list(range(1, args.rounds + 1)) and
          table.count(" secagg+ ") == args.rounds and
          all(r["aggregation"] == "secagg+" and r["outcome"] == "committed" and
              r["participants"] == CLIENTS for r in rounds.values()))
    print(table)
    if not ok:
        sys.exit("cohort status: not every round is a committed secagg+ round of 5 clients")
    missing = [(r, c) for r in range(1, args.rounds + 1) for c in range(CLIENTS)
               if (r, c) not in tasks]
    if missing:
        sys.exit(f"no task logged for (round, client) {missing}")
    assert all(t["secure"] for t in tasks.values())

    cohort_model = ex.Net()
    final_round = ct.load_flat(cohort_model, run.path("run"))
    acc_cohort = evaluate(ex, cohort_model)

    # The same run in PyTorch alone.
    torch.manual_seed(0)
    init = ex.Net()  # prepare's initial model: same seed, same construction.
    init_state = {k: v.detach().clone() for k, v in init.state_dict().items()
                  if torch.is_floating_point(v)}
    saved = np.load(run.path("init.npz"))
    assert all(np.array_equal(saved[k], v.numpy()) for k, v in init_state.items())
    datas = [ex.client_share(i, CLIENTS) for i in range(CLIENTS)]
    start = time.monotonic()
    state, starts, max_delta = plain_fedavg(ex, datas, init_state, tasks, args.rounds)
    torch_s = time.monotonic() - start
    plain_model = ex.Net()
    plain_model.load_state_dict(state, strict=False)
    acc_torch = evaluate(ex, plain_model)

    # How much the accuracy moves with the seeds alone: the same plain
    # FedAvg with every client's seed changed (shuffling and dropout).
    reference = []
    for k in range(1, args.reference_seeds + 1):
        other = {key: dict(t, seed=(t["seed"] + k) % 2**64) for key, t in tasks.items()}
        ref_state, _, _ = plain_fedavg(ex, datas, init_state, other, args.rounds)
        ref_model = ex.Net()
        ref_model.load_state_dict(ref_state, strict=False)
        reference.append(evaluate(ex, ref_model))

    # Drift: the global each round starts from (cohort: what client-0
    # received), and the final models.
    drift = {}
    for r in range(1, args.rounds + 1):
        got = np.load(run.path(f"received-{r}.npy"))
        drift[r] = float(np.abs(got - starts[r]).max())
    final_cohort = ct.get_flat(cohort_model)
    final_torch = ct.get_flat(plain_model)
    drift["final"] = float(np.abs(final_cohort - final_torch).max())
    clip = 4.0  # secagg.clip's default; the config sets none.
    summary = {
        "bench": "federated_pytorch", "rounds": args.rounds, "clients": CLIENTS,
        "final_round": final_round, "num_params": ct.num_params(init),
        "samples": [len(d) for d in datas],
        "acc_cohort_secagg": acc_cohort, "acc_torch_fedavg": acc_torch,
        "diff_points": 100 * (acc_cohort - acc_torch),
        "acc_torch_fedavg_other_seeds": reference,
        "max_abs_global_diff_by_round": drift,
        "max_abs_update_coordinate_by_round": max_delta, "secagg_clip": clip,
        "clip_warnings": clipped, "cohort_run_s": cohort_s, "torch_loop_s": torch_s,
        "round_seconds": {r: rounds[r].get("seconds") for r in rounds},
        "train_loss_by_round": {r: rounds[r].get("train_loss") for r in rounds},
    }
    print(f"cohort SecAgg+ ({args.rounds} rounds, load_flat round {final_round}): "
          f"test accuracy {100 * acc_cohort:.2f} %")
    print(f"plain FedAvg in PyTorch: test accuracy {100 * acc_torch:.2f} %")
    print(f"difference: {100 * (acc_cohort - acc_torch):+.2f} points; "
          f"max |global diff| by round: "
          + ", ".join(f"{r}: {d:.2e}" for r, d in drift.items()))
    if reference:
        print("plain FedAvg, other seeds: " +
              ", ".join(f"{100 * a:.2f} %" for a in reference))
    print(f"largest update coordinate {max(max_delta.values()):.3f} (secagg.clip {clip}); "
          f"clip warnings: {len(clipped)}")
    print(json.dumps(summary))
    with open(run.path("summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for p in run.processes:
        p.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command")
    cl = sub.add_parser("client")
    cl.add_argument("--index", type=int, required=True)
    for flag in ("--coordinator", "--identity", "--coordinator-key", "--peers"):
        cl.add_argument(flag, required=True)
    cl.add_argument("--dump")
    p.add_argument("--cohort", default=os.path.join(ROOT, "build", "cli", "cohort"))
    p.add_argument("--out", default=os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"cohort-fedpt-{os.getpid()}"))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--timeout", type=float, default=1500)
    p.add_argument("--reference-seeds", type=int, default=1,
                   help="extra plain FedAvg runs with other seeds (the seeds' own spread)")
    args = p.parse_args()
    if args.command == "client":
        client_main(args)
    else:
        bench_main(args)


if __name__ == "__main__":
    main()
