"""A Python federated client for the tests: a small PyTorch MLP (or, with
--numpy, a NumPy stand-in) whose fit misbehaves on request (--fault R:KIND).

It prints "fit round R zero-copy True|False" as fit starts: whether the
array fit received is the C++ buffer itself.
"""

import argparse
import signal
import sys
import time

import numpy as np

import cohort

FAULTS = ("raise", "short", "nan", "inf", "type", "samples", "metrics", "hang", "delta_nan",
          "slow")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--identity")
    p.add_argument("--coordinator-key")
    p.add_argument("--peers")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--plain", action="store_true", help="require_secure=False")
    p.add_argument("--num-params", type=int)
    p.add_argument("--numpy", action="store_true", help="no PyTorch: a NumPy stand-in")
    p.add_argument("--fault", action="append", default=[], help="ROUND:KIND")
    p.add_argument("--samples", type=int, default=160)
    p.add_argument("--dump-params", help="save each round's received params to PREFIX-R.npy")
    p.add_argument("--eval", help="evaluate returns SAMPLES:LOSS:ACCURACY ('raise': raises)")
    return p.parse_args()


def torch_trainer(name, samples):
    """fit training an MLP (20-8-4, 204 parameters) on this client's data."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import cohort.torch as ct

    g = torch.Generator().manual_seed(sum(map(ord, name)))
    centers = torch.randn(4, 20, generator=torch.Generator().manual_seed(1)) * 2
    y = torch.randint(0, 4, (samples,), generator=g)
    x = centers[y] + torch.randn(samples, 20, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(20, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))

    def train(params, task):
        ct.set_flat(model, params)
        torch.manual_seed(task.seed)
        loader = DataLoader(TensorDataset(x, y), batch_size=task.batch_size, shuffle=True)
        opt = torch.optim.SGD(model.parameters(), lr=task.learning_rate)
        n, metrics = ct.fit_loop(model, loader, opt, task.epochs, mu=task.proximal_mu)
        ct.get_flat(model, out=params)  # Into the C++ buffer: no copy.
        return params, n, metrics

    return train


def numpy_trainer(samples):
    def train(params, task):
        params *= 0.99  # In place: the C++ buffer.
        return params, samples, {"loss": 1.0 / task.round, "accuracy": 0.5}

    return train


def main():
    # Ctrl-C as in a terminal, even where the test runner started this
    # process with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parse_args()
    faults = {}
    for f in args.fault:
        r, kind = f.split(":")
        assert kind in FAULTS, kind
        faults[int(r)] = kind
    train = numpy_trainer(args.samples) if args.numpy else torch_trainer(args.name, args.samples)

    def fit(params, task):
        same = params.__array_interface__["data"][0] == task._buffer_address
        print(f"fit round {task.round} zero-copy {same} {task!r}", flush=True)
        if args.dump_params:
            np.save(f"{args.dump_params}-{task.round}.npy", params)
        kind = faults.get(task.round)
        if kind == "raise":
            raise ValueError(f"planted failure in round {task.round}")
        if kind == "hang":
            print(f"hanging in fit of round {task.round}", flush=True)
            time.sleep(3600)  # The test SIGKILLs this process.
        if kind == "slow":  # Past the round's deadline, then a good result.
            time.sleep(8)
        out, n, metrics = train(params, task)
        if kind == "short":
            return out[:-4], n, metrics
        if kind == "nan":
            out[7] = np.nan
        if kind == "inf":
            out[7] = np.inf
        if kind == "type":
            return "not an array", n, metrics
        if kind == "samples":
            return out, -5, metrics
        if kind == "metrics":
            return out, n, {"loss": float("nan")}
        return out, n, metrics

    client = cohort.Client(coordinator=args.coordinator, identity=args.identity,
                           coordinator_key=args.coordinator_key, peers=args.peers,
                           require_secure=not args.plain, insecure=args.insecure,
                           num_samples=args.samples, num_params=args.num_params, name=args.name)
    evaluate = None
    if args.eval == "raise":
        def evaluate(params, task):
            raise RuntimeError(f"planted evaluate failure in round {task.round}")
    elif args.eval:
        m, loss, acc = args.eval.split(":")

        def evaluate(params, task):
            assert not params.flags.writeable  # The round's global model, read-only.
            print(f"evaluate round {task.round} evaluate={task.evaluate}", flush=True)
            return int(m), {"loss": float(loss), "accuracy": float(acc)}
    client.run(fit, evaluate)
    print("run finished", flush=True)


if __name__ == "__main__":
    sys.exit(main())
