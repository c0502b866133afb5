#!/usr/bin/python3
"""Issue 32: mixed clients. Native `cohort client`s and Python clients
(cohort.Client, PyTorch) train the same LeNet-5 in one secure run.

Two runs, one after the other, with the same shards, config and seed (the
coordinator gives both the same initial weights, from the seed):

  native : --clients `cohort client` processes (--threads 1), all native.
  mixed  : the first --native of them native, the rest Python clients of
           this file (`client` subcommand): each fit turns Cohort's flat
           vector into PyTorch's LeNet-5 (cohort._client.model.to_torch,
           cohort.run_model.sequential), trains it with torch.optim.SGD on
           the same shard (read with read_shard), and returns it in Cohort's
           order (from_torch).

Clients have the same names in both runs (client-0 ...), so each gets the
same per-round seed; the native clients of the mixed run train exactly as
in the native run (same seed) given the same global model. Fashion-MNIST from
`cohort partition --scheme dirichlet:ALPHA` (full 60k training set), the 10k
test images as data.test_shard (the coordinator evaluates every round),
LeNet-5, batch 32, SGD lr 0.05, 1 local epoch, CURVE keys, SecAgg+, on
127.0.0.1. Final test accuracies are `cohort status --json`'s; the mixed
run's final model is also read back with cohort.run_model.load_run and
evaluated in PyTorch as a cross-check.

    PYTHONPATH=build/python /usr/bin/python3 bench/mixed_clients_bench.py \\
        [--cohort build/cli/cohort] [--out DIR] [--rounds 10] [--clients 4] [--native 2] \\
        [--seeds 0,1,2]

A third run per seed (off with --no-reseeded), all native again with the
clients under other names (reseeded: other per-client training seeds,
everything else the same), measures how far two runs land apart from the
shuffling alone: the yardstick for the mixed run's difference. Each
client's round-1 loss (the same initial model in every run) is printed
too: native and PyTorch training of the same shard side by side.

With --seeds S1,S2,... one such set of runs per seed (the seed of `cohort
partition` and of the run), to show how far apart the two runs land
across splits, not only on one.

Exits 1 unless every round of every run is a committed secagg+ round of all
clients. JSON summary on the last line.
"""

import argparse
import json
import os
import re
import sys
import time

import numpy as np

# A client's round-1 loss: the native client's log line, or ours.
ROUND1_LOSS = re.compile(r"round 1: trained \d+ samples in [0-9.]+ s, loss ([0-9.]+)"
                         r"|FIT round 1 secure \w+ n \d+ loss ([0-9.]+)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FMNIST = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


# --------------------------------------------------------------------------
# The Python client (a child process): PyTorch's LeNet-5 behind cohort.Client.

def client_main(args):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import cohort
    import cohort.torch as ct
    from cohort import run_model
    from cohort._client import model as cmodel

    torch.set_num_threads(1)
    with open(args.config) as f:
        config = f.read()
    num_params = cmodel.num_params(config)
    x, y, _ = cmodel.read_shard(args.shard)
    model = None
    data = None

    def fit(params, task):
        nonlocal model, data
        start = time.perf_counter()
        described = cmodel.to_torch(config, params)  # Cohort's order -> PyTorch's.
        if model is None:
            model = run_model.sequential(described)
            shape = model.cohort_input_shape
            data = TensorDataset(torch.from_numpy(x).reshape(len(x), *shape),
                                 torch.from_numpy(y).long())
            # The conversion is exact both ways.
            back = cmodel.from_torch(config, np.concatenate(
                [a.reshape(-1) for _, a in described["state_dict"]]))
            assert np.array_equal(back, params), "from_torch(to_torch(x)) != x"
        else:
            model.load_state_dict({k: torch.from_numpy(a) for k, a in described["state_dict"]},
                                  strict=True)
        torch.manual_seed(task.seed)
        loader = DataLoader(data, batch_size=task.batch_size, shuffle=True)
        opt = torch.optim.SGD(model.parameters(), lr=task.learning_rate,
                              momentum=task.momentum, weight_decay=task.weight_decay)
        n, metrics = ct.fit_loop(model, loader, opt, task.epochs)
        flat_torch = np.concatenate([v.detach().numpy().reshape(-1)
                                     for v in model.state_dict().values()])
        params[:] = cmodel.from_torch(config, flat_torch)  # PyTorch's order -> Cohort's.
        print(f"FIT round {task.round} secure {task.secure} n {n} "
              f"loss {metrics['loss']:.4f} fit_s {time.perf_counter() - start:.2f}", flush=True)
        return params, n, metrics

    cohort.Client(coordinator=args.coordinator, identity=args.identity,
                  coordinator_key=args.coordinator_key, peers=args.peers,
                  num_samples=len(x), num_params=num_params, name=args.name).run(fit)
    print("run finished", flush=True)


# --------------------------------------------------------------------------

def one_run(harness, args, out, kind, shards, config_text, names):
    run = harness.Run(f"mixed-{kind}")
    os.rmdir(run.dir)
    run.dir = os.path.join(out, kind)
    os.makedirs(run.dir)
    config = run.path("run.textproto")
    with open(config, "w") as f:
        f.write(config_text)
    run.keygen(["coordinator"] + names, allow=names)
    start = time.monotonic()
    run.start_coordinator(config, curve=True)
    procs = []
    for i, name in enumerate(names):
        shard = os.path.join(shards, f"client-{i:03d}.shard")
        keys = ["--identity", run.path(f"keys/{name}.key"), "--coordinator-key",
                run.path("keys/coordinator.pub"), "--peers", run.path("allow")]
        if kind != "mixed" or i < args.native:
            argv = [harness.cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
                    shard, "--name", name, "--threads", "1", *keys]
        else:
            argv = [sys.executable, os.path.abspath(__file__), "client", "--coordinator",
                    run.endpoint, "--name", name, "--config", config, "--shard", shard, *keys]
        procs.append(run.spawn(argv, f"{name}.log"))
    code = run.coordinator.wait(args.timeout)
    wall = time.monotonic() - start
    if code != 0:
        sys.exit(f"{kind}: coordinator exited {code}:\n{run.coordinator.output()[-4000:]}")
    for name, p in zip(names, procs):
        if p.wait(60) != 0:
            sys.exit(f"{kind}: {name} failed:\n{p.output()[-4000:]}")
    table = run.status()
    rounds = run.rounds()
    print(f"--- {kind} run ---\n{table}", flush=True)
    ok = (sorted(rounds) == list(range(1, args.rounds + 1)) and
          table.count(" secagg+ ") == args.rounds and
          all(r["aggregation"] == "secagg+" and r["outcome"] == "committed" and
              r["participants"] == len(names) for r in rounds.values()))
    if not ok:
        sys.exit(f"{kind}: not every round is a committed secagg+ round of {len(names)} clients")
    clipped = [f"{n}: {line}" for n, p in zip(names, procs)
               for line in p.output().splitlines() if "clipped" in line]
    fits = sum(p.output().count("FIT round ") for p in procs)
    # Each client's mean training loss in round 1 (every run starts from the
    # same initial model): native and PyTorch training side by side.
    loss1 = []
    for p in procs:
        m = ROUND1_LOSS.search(p.output())
        loss1.append(float(m.group(1) or m.group(2)) if m else None)
    for p in procs:
        p.close()
    run.coordinator.close()
    return run, rounds, wall, clipped, fits, loss1


def one_seed(harness, args, seed):
    """The pair of runs on the shards and config of `seed`."""
    out = os.path.join(args.out, f"seed-{seed}")
    os.makedirs(out)
    shards = os.path.join(out, "shards")
    helper = harness.Run("mixed-partition")
    helper.cohort("partition", "--format", "idx",
                  "--train-images", f"{FMNIST}/train-images-idx3-ubyte.gz",
                  "--train-labels", f"{FMNIST}/train-labels-idx1-ubyte.gz",
                  "--test-images", f"{FMNIST}/t10k-images-idx3-ubyte.gz",
                  "--test-labels", f"{FMNIST}/t10k-labels-idx1-ubyte.gz",
                  "--clients", str(args.clients), "--scheme", args.scheme or f"dirichlet:{args.alpha}",
                  "--seed", str(seed), "--out", shards)
    helper.close()
    from cohort._client import model as cmodel
    sizes = [len(cmodel.read_shard(os.path.join(shards, f"client-{i:03d}.shard"))[1])
             for i in range(args.clients)]
    config_text = (
        f"seed: {seed}\n"
        'model { arch: "lenet5" }\n'
        f'data {{ test_shard: "{shards}/test.shard" }}\n'
        "train { batch_size: 32 learning_rate: 0.05 local_epochs: 1 }\n"
        f"rounds {{ num_rounds: {args.rounds} min_clients: {args.clients} "
        f"start_clients: {args.clients} round_deadline_s: 300 }}\n"
        "secagg { aggregation: SECAGG_PLUS }\n")
    names = [f"client-{i}" for i in range(args.clients)]

    results = {"seed": seed, "shard_samples": sizes}
    kinds = ("native", "mixed") + (("reseeded",) if args.reseeded else ())
    for kind in kinds:
        # reseeded: all native again, the clients under other names, so
        # other training seeds (shuffling): how far two all-native runs
        # that differ only there land apart.
        run_names = [f"other-{i}" for i in range(args.clients)] if kind == "reseeded" else names
        run, rounds, wall, clipped, fits, loss1 = one_run(harness, args, out, kind, shards,
                                                          config_text, run_names)
        last = rounds[args.rounds]
        tail = [rounds[r]["test_accuracy"] for r in range(max(1, args.rounds - 2), args.rounds + 1)]
        results[kind] = {
            "test_accuracy": last["test_accuracy"], "test_loss": last["test_loss"],
            "last3_mean_accuracy": float(np.mean(tail)), "round1_client_loss": loss1,
            "wall_s": wall, "clip_warnings": clipped, "python_fits": fits,
            "accuracy_by_round": {r: rounds[r]["test_accuracy"] for r in rounds},
            "round_seconds_median": float(np.median([rounds[r]["seconds"] for r in rounds])),
            "run_dir": run.path("run")}
        if kind == "mixed":
            import torch

            from cohort import run_model
            model = run_model.load_run(run.path("run"))
            x, y = run_model.load_shard(os.path.join(shards, "test.shard"),
                                        model.cohort_input_shape)
            with torch.no_grad():
                acc = (model(x).argmax(1) == y).float().mean().item()
            results[kind]["load_run_round"] = model.cohort_round
            results[kind]["load_run_torch_accuracy"] = acc
    results["diff_points"] = 100 * (results["mixed"]["test_accuracy"] -
                                    results["native"]["test_accuracy"])
    results["diff_last3_points"] = 100 * (results["mixed"]["last3_mean_accuracy"] -
                                          results["native"]["last3_mean_accuracy"])
    if args.reseeded:
        results["reseeded_diff_points"] = 100 * (results["reseeded"]["test_accuracy"] -
                                                 results["native"]["test_accuracy"])
    for kind in kinds:
        r = results[kind]
        print(f"seed {seed} {kind:7s}: final test accuracy {100 * r['test_accuracy']:.2f} % "
              f"(run {r['wall_s']:.0f} s, median round {r['round_seconds_median']:.2f} s)")
    print(f"seed {seed} round-1 client losses: native {results['native']['round1_client_loss']}"
          f", mixed {results['mixed']['round1_client_loss']}")
    print(f"seed {seed} mixed - native: {results['diff_points']:+.2f} points "
          f"(mean of the last 3 rounds: {results['diff_last3_points']:+.2f}); "
          + (f"reseeded - native: {results['reseeded_diff_points']:+.2f}; "
             if args.reseeded else "") + "the mixed run's "
          f"model in PyTorch (load_run): "
          f"{100 * results['mixed']['load_run_torch_accuracy']:.2f} %", flush=True)
    return results


def bench_main(args):
    sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
    import harness

    os.environ["COHORT_BIN"] = os.path.abspath(args.cohort)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.join(ROOT, "build", "python"), os.environ.get("PYTHONPATH")] if p)
    args.out = os.path.abspath(args.out)
    if os.path.exists(args.out):
        sys.exit(f"{args.out} exists: give a new --out")
    os.makedirs(args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs = [one_seed(harness, args, seed) for seed in seeds]
    diffs = [p["diff_points"] for p in pairs]
    reseeded = [p["reseeded_diff_points"] for p in pairs if "reseeded_diff_points" in p]
    summary = {"reseeded_diff_points": reseeded,
               "diff_last3_points": [p["diff_last3_points"] for p in pairs],"bench": "mixed_clients", "rounds": args.rounds, "clients": args.clients,
               "native_in_mixed": args.native, "python_in_mixed": args.clients - args.native,
               "alpha": args.alpha, "scheme": args.scheme or f"dirichlet:{args.alpha}", "seeds": seeds, "pairs": pairs,
               "diff_points": diffs, "mean_diff_points": float(np.mean(diffs)),
               "max_abs_diff_points": float(np.max(np.abs(diffs)))}
    print(f"mixed - native over seeds {seeds}: " + ", ".join(f"{d:+.2f}" for d in diffs) +
          f" points (mean {np.mean(diffs):+.2f})" +
          ("; reseeded - native: " + ", ".join(f"{d:+.2f}" for d in reseeded) if reseeded else ""))
    print(json.dumps(summary))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command")
    cl = sub.add_parser("client")
    for flag in ("--coordinator", "--identity", "--coordinator-key", "--peers", "--name",
                 "--config", "--shard"):
        cl.add_argument(flag, required=True)
    p.add_argument("--cohort", default=os.path.join(ROOT, "build", "cli", "cohort"))
    p.add_argument("--out", default=os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"cohort-mixed-{os.getpid()}"))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--native", type=int, default=2, help="native clients in the mixed run")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--scheme", default=None,
                   help="cohort partition's --scheme (iid, dirichlet:A, ...); default dirichlet:ALPHA")
    p.add_argument("--seeds", default="0,1,2",
                   help="comma-separated: one pair of runs per seed (partition and run seed)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--no-reseeded", dest="reseeded", action="store_false",
                   help="skip the third, all-native run under other client names")
    args = p.parse_args()
    if args.command == "client":
        client_main(args)
    else:
        bench_main(args)


if __name__ == "__main__":
    main()
