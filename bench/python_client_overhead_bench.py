#!/usr/bin/python3
"""Issue 32, acceptance 3: what a Python client (cohort.Client(...).run(fit))
costs per round beyond a native `cohort client`, outside fit, for a 1M-parameter
model. One invocation runs the pairs, alternating native and Python runs.

    flock /tmp/build.lock /usr/bin/python3 bench/python_client_overhead_bench.py \
        [--cohort build/cli/cohort] [--clients 4] [--rounds 60] [--pairs 8] [--plain-pairs 4] \
        [--single-pairs 2] [--keep]

Every run: a real `cohort coordinator` on 127.0.0.1 (CURVE, an allowlist), the
model of `bench/run.sh secagg-round` (MLP 784-1024-192-10, 1,002,570
parameters, no test shard), and --clients client processes, either all native
(`cohort client --threads 1 --device cpu`, each on a shard of --samples
synthetic samples, batch = the shard, 1 epoch: one SGD step) or all Python
(this file with --py-client: cohort.Client, whose fit does one in-place step
`params -= 0.05 * g` on the C++ buffer with a fixed g; same sample weight).
First plain pairs of 1 client (--single-pairs), then SecAgg+ pairs (--pairs)
and plain pairs (--plain-pairs) of --clients; native first in even pairs,
Python first in odd ones. The training is small on both sides and taken out:

  fit (Python)  : perf_counter and thread_time around the body of the user's
                  fit (what fit_bridge calls), printed per round by fit.
  fit (native)  : the trainer's own training seconds (train::TrainLocal's
                  TrainResult.seconds). Plain rounds store them per client
                  and round (run.db round_clients.train_seconds): subtracted
                  as they are. Secure rounds keep only their masked mean,
                  and the client logs them with 10 ms resolution, so for
                  the SecAgg+ runs the mean of the plain native runs with
                  --clients of the same invocation is subtracted (same
                  model, shard and batch). For the CPU figure of the runs
                  with --clients, the mean of the 1-client native runs
                  (nothing else runs: wall ~ CPU). Bracket: the ratio is also given with the native
                  training taken as 0 (native outside fit too large) and as
                  the span between the client's own log lines "round R: task
                  received" and "round R: trained" (ms timestamps: the
                  model copy, the job thread's start and the training: an
                  upper bound, so native outside fit too small).

Figures per run, on rounds 2..R (round 1 waits for the clients and warms up):

  round wall outside fit = the coordinator's round seconds (run.db
                  `rounds.seconds`, tasks sent to commit, what `cohort
                  status` prints) minus the longest fit among the round's
                  clients; the median over the rounds.
  client CPU outside fit = each client process's CPU (utime+stime of all
                  its threads, /proc/PID/stat, 10 ms ticks), read when its
                  log line "round r: task received" reaches this bench, for
                  r = 2 and r = R, divided by R-2, minus its mean fit CPU
                  over rounds 2..R-1 (Python: thread_time of fit; native:
                  the training seconds above, single-threaded); the mean
                  over the run's clients.

Per side: the median over its runs; the ratio Python/native of the medians
and each pair's ratio. JSON lines go to --out/python_client_overhead.jsonl.
"""

import argparse
import json
import os
import queue
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NUM_PARAMS = 1002570  # MLP 784-1024-192-10.
MODEL = 'model { arch: "mlp" input_dim: 784 num_classes: 10 hidden: 1024 hidden: 192 }'
CLK_TCK = os.sysconf("SC_CLK_TCK")

TASK_RE = re.compile(r"round (\d+): task received")
TRAINED_RE = re.compile(r"round (\d+): trained (\d+) samples in ([0-9.]+) s")
STAMP_RE = re.compile(r"^\[\d{4}-\d\d-\d\d (\d\d):(\d\d):(\d\d\.\d+)\]")  # spdlog's, ms.
FIT_RE = re.compile(r"FIT round (\d+) wall ([0-9.]+) cpu ([0-9.]+)")


# --------------------------------------------------------------------------
# The Python client (a child process of the bench).

def py_client(args):
    import numpy as np

    import cohort

    signal.signal(signal.SIGINT, signal.default_int_handler)
    g = np.random.default_rng(sum(map(ord, args.name))).standard_normal(
        args.num_params).astype(np.float32) * np.float32(0.01)
    steps = {}

    def fit(params, task):
        w0, c0 = time.perf_counter(), time.thread_time()
        step = steps.get(task.learning_rate)
        if step is None:
            step = steps[task.learning_rate] = g * np.float32(task.learning_rate)
        params -= step  # In place: the C++ buffer, as a trained model would be.
        out = (params, args.samples, {"loss": 1.0, "accuracy": 0.5})
        w, c = time.perf_counter() - w0, time.thread_time() - c0
        print(f"FIT round {task.round} wall {w:.6f} cpu {c:.6f}", flush=True)
        return out

    client = cohort.Client(coordinator=args.coordinator, identity=args.identity,
                           coordinator_key=args.coordinator_key, num_samples=args.samples,
                           num_params=args.num_params, require_secure=not args.plain,
                           name=args.name)
    client.run(fit)
    print("run finished", flush=True)
    return 0


# --------------------------------------------------------------------------
# The bench.

def cpu_seconds(pid):
    """utime + stime of every thread of `pid`, live or exited (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


class Proc:
    """A child with stdout+stderr merged, logged, parsed line by line."""

    def __init__(self, argv, log_path, env):
        self.log = open(log_path, "w")
        self.lines = queue.Queue()
        self.task_cpu = {}   # round -> CPU seconds when "task received" was read.
        self.task_t = {}     # round -> the client's timestamp of "task received".
        self.trained = {}    # round -> seconds (the daemon's log line, 10 ms resolution).
        self.span = {}       # round -> from "task received" to "trained" (its timestamps).
        self.fit = {}        # round -> (wall, cpu) of the Python fit.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            m = TASK_RE.search(line)
            if m:
                self.task_cpu.setdefault(int(m.group(1)), cpu_seconds(self.proc.pid))
            stamp = STAMP_RE.match(line)
            t = (int(stamp.group(1)) * 3600 + int(stamp.group(2)) * 60
                 + float(stamp.group(3))) if stamp else None
            if m and t is not None:
                self.task_t.setdefault(int(m.group(1)), t)
            m = TRAINED_RE.search(line)
            if m:
                r = int(m.group(1))
                self.trained[r] = float(m.group(3))
                if r in self.task_t and t is not None:
                    self.span[r] = (t - self.task_t[r]) % 86400  # Past midnight too.
            self.log.write(line)
            m = FIT_RE.search(line)
            if m:
                self.fit[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, needle, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if needle in line:
                return line
        return None

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            self.thread.join(timeout=10)
            self.log.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_cmd(argv):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stdout}{out.stderr}")
    return out.stdout


def setup(args, work):
    names = [f"client-{k}" for k in range(args.clients)]
    for name in ["coordinator"] + names:
        run_cmd([args.cohort, "keygen", "--out", f"{work}/keys", "--name", name])
    os.makedirs(f"{work}/allow")
    for name in names:
        shutil.copy(f"{work}/keys/{name}.pub", f"{work}/allow/{name}.pub")
    run_cmd([args.cohort, "partition", "--format", "synthetic", "--samples",
             str(args.samples * args.clients), "--test-samples", "10", "--features", "784",
             "--classes", "10", "--clients", str(args.clients), "--scheme", "iid", "--seed", "1",
             "--out", f"{work}/shards"])
    return names


def one_run(args, work, names, side, agg, tag):
    """One coordinator and len(names) clients of `side`; what the run recorded."""
    rdir = f"{work}/{tag}"
    os.makedirs(rdir)
    config = f"{rdir}/run.textproto"
    with open(config, "w") as f:
        f.write(f"seed: 1\n{MODEL}\n"
                f"train {{ batch_size: {args.samples} learning_rate: 0.05 local_epochs: 1 }}\n"
                f"rounds {{ num_rounds: {args.rounds} min_clients: {len(names)} "
                f"start_clients: {len(names)} round_deadline_s: 120 }}\n"
                "net { heartbeat_s: 1 }\n"
                f"secagg {{ aggregation: {agg} stage_timeout_s: 60 }}\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=args.pythonpath)
    procs = []
    try:
        coord = Proc([args.cohort, "coordinator", "--config", config, "--run-dir", f"{rdir}/run",
                      "--bind", "tcp://127.0.0.1:0", "--identity", f"{work}/keys/coordinator.key",
                      "--allow", f"{work}/allow"], f"{rdir}/coordinator.log", env)
        procs.append(coord)
        line = coord.wait_line("coordinator listening on ", 60)
        if line is None:
            raise RuntimeError(f"coordinator did not start: see {rdir}/coordinator.log")
        endpoint = line.strip().rsplit(" ", 1)[1]
        clients = []
        for k, name in enumerate(names):
            key = ["--identity", f"{work}/keys/{name}.key",
                   "--coordinator-key", f"{work}/keys/coordinator.pub"]
            if side == "native":
                argv = [args.cohort, "client", "--coordinator", endpoint, "--data",
                        f"{work}/shards/client-{k:03d}.shard", "--threads", "1",
                        "--device", "cpu", *key]
            else:
                argv = [sys.executable, os.path.abspath(__file__), "--py-client",
                        "--coordinator", endpoint, "--name", name, "--samples",
                        str(args.samples), "--num-params", str(NUM_PARAMS), *key]
                if agg == "PLAIN":
                    argv.append("--plain")
            c = Proc(argv, f"{rdir}/{name}.log", env)
            procs.append(c)
            clients.append(c)
        if coord.wait(args.run_timeout) != 0:
            raise RuntimeError(f"coordinator failed: see {rdir}/coordinator.log")
        for c in clients:
            if c.wait(60) != 0:
                raise RuntimeError(f"a client failed: see {rdir}")
    finally:
        for p in procs:
            p.kill()
    return raw_run(args, rdir, side, agg, names, clients)


def raw_run(args, rdir, side, agg, names, clients):
    """What one run recorded: round seconds, and per client its fit, training
    and CPU by round (lists indexed by round; None where unknown)."""
    db = sqlite3.connect(f"file:{rdir}/run/run.db?mode=ro", uri=True)
    rows = db.execute("SELECT round, seconds, coordinator_seconds, outcome, participants, "
                      "aggregation FROM rounds ORDER BY round").fetchall()
    train = {(r, c): t for r, c, t in db.execute(
        "SELECT round, client, train_seconds FROM round_clients")}
    db.close()
    if len(rows) != args.rounds or any(r[3] != "committed" or r[4] != len(names)
                                       for r in rows):
        raise RuntimeError(f"{rdir}: rounds not all committed with every client: {rows}")
    n = args.rounds + 1
    out = {"side": side, "aggregation": rows[0][5], "rounds": args.rounds, "clients_n": len(names),
           "seconds": [None] + [r[1] for r in rows],
           "coordinator_seconds": [None] + [r[2] for r in rows], "clients": []}
    for name, c in zip(names, clients):
        out["clients"].append({
            "name": name,
            "fit_wall": [c.fit.get(r, (None, None))[0] for r in range(n)],
            "fit_cpu": [c.fit.get(r, (None, None))[1] for r in range(n)],
            "span": [c.span.get(r) for r in range(n)],
            "store_train": [train.get((r, name)) if out["aggregation"] == "plain" else None
                            for r in range(n)],
            "cpu_at_task": [c.task_cpu.get(r) for r in range(n)],
        })
    return out


def native_train_estimate(runs, clients_n):
    """Mean training seconds (the store's) of the plain native runs with
    clients_n clients, rounds 2..R-1; None without such runs."""
    vals = [t for run in runs if run["side"] == "native" and run["aggregation"] == "plain"
            and run["clients_n"] == clients_n
            for c in run["clients"] for t in c["store_train"][2:run["rounds"]] if t is not None]
    return statistics.mean(vals) if vals else None


def figures(run, wall_fit, cpu_fit=None):
    """The run's figures. For a native run, what is taken out as its
    training: 'exact' (the store's, plain rounds), 'zero', 'span', or a
    number (seconds, every round); cpu_fit for the CPU figure (default:
    wall_fit)."""
    R = run["rounds"]

    def fit(c, r, cpu):
        if run["side"] == "python":
            return c["fit_cpu" if cpu else "fit_wall"][r]
        how = cpu_fit if cpu and cpu_fit is not None else wall_fit
        if how == "zero":
            return 0.0
        if how == "span":
            return c["span"][r]
        if how == "exact":
            return c["store_train"][r]
        return how

    wall = [run["seconds"][r] - max(fit(c, r, False) for c in run["clients"])
            for r in range(2, R + 1)]
    cpu = [(c["cpu_at_task"][R] - c["cpu_at_task"][2]) / (R - 2)
           - statistics.mean(fit(c, r, True) for r in range(2, R)) for c in run["clients"]]
    return {"wall_outside_fit_s": statistics.median(wall),
            "cpu_outside_fit_s": statistics.mean(cpu)}


def describe(how):
    return how if isinstance(how, str) else f"{how * 1e3:.3f} ms"


def summarize(runs, clients):
    """Per group (aggregation, clients) and figure: medians per side, the
    ratio, pair ratios, and the bracket (native training taken as 0 and as
    the log span)."""
    wall_est = native_train_estimate(runs, clients)  # Contended: as in the rounds.
    cpu_est = native_train_estimate(runs, 1)         # Alone: wall ~ CPU.
    out = []
    for agg, n_clients in (("secagg+", clients), ("plain", clients), ("plain", 1)):
        rows = [r for r in runs if r["aggregation"] == agg and r["clients_n"] == n_clients]
        if not rows:
            continue
        if agg == "plain":
            wall_fit = "exact"
        else:
            wall_fit = wall_est if wall_est is not None else "span"
        cpu_fit = "exact" if n_clients == 1 else (cpu_est if cpu_est is not None else wall_fit)
        nat = [r for r in rows if r["side"] == "native"]
        py = [r for r in rows if r["side"] == "python"]
        for key in ("wall_outside_fit_s", "cpu_outside_fit_s"):
            def med(rs, w, c=None):
                return statistics.median(figures(r, w, c)[key] for r in rs)
            n, p = med(nat, wall_fit, cpu_fit), med(py, wall_fit, cpu_fit)
            s = {"bench": "python_client_overhead_summary", "aggregation": agg,
                 "clients": n_clients, "figure": key,
                 "native_fit": describe(cpu_fit if key.startswith("cpu") else wall_fit),
                 "native_median_s": n, "python_median_s": p, "ratio": p / n,
                 "pair_ratios": [figures(b, wall_fit, cpu_fit)[key]
                                 / figures(a, wall_fit, cpu_fit)[key] for a, b in zip(nat, py)],
                 "native_runs_s": [figures(r, wall_fit, cpu_fit)[key] for r in nat],
                 "python_runs_s": [figures(r, wall_fit, cpu_fit)[key] for r in py],
                 "ratio_native_fit_zero": p / med(nat, "zero"),
                 "ratio_native_fit_span": p / med(nat, "span")}
            out.append(s)
        for side, rs in (("native", nat), ("python", py)):
            def mean_of(field):
                vals = [v for r in rs for c in r["clients"] for v in c[field][2:r["rounds"] + 1]
                        if v is not None]
                return statistics.mean(vals) if vals else None
            out.append({
                "bench": "python_client_overhead_detail", "aggregation": agg,
                "clients": n_clients, "side": side,
                "median_round_s": statistics.median(
                    statistics.median(r["seconds"][2:]) for r in rs),
                "median_coordinator_s": statistics.median(
                    statistics.median(r["coordinator_seconds"][2:]) for r in rs),
                "mean_fit_s": mean_of("fit_wall"),
                "mean_fit_cpu_s": mean_of("fit_cpu"),
                "mean_store_train_s": mean_of("store_train"),
                "mean_span_s": mean_of("span")})
    return out


def ms(v):
    return "-" if v is None else f"{v * 1e3:.2f}"


def bench(args):
    os.makedirs(args.out, exist_ok=True)
    jsonl = open(os.path.join(args.out, "python_client_overhead.jsonl"), "w")
    work = tempfile.mkdtemp(prefix="cohort-pyoverhead-")
    start = time.monotonic()
    runs = []
    try:
        names = setup(args, work)
        # Plain runs of one client (min_clients 1) first: each client's cost
        # with nothing beside it, and the native training seconds alone.
        plan = [("PLAIN", i, 1) for i in range(args.single_pairs)]
        plan += [("SECAGG_PLUS", i, args.clients) for i in range(args.pairs)]
        plan += [("PLAIN", i, args.clients) for i in range(args.plain_pairs)]
        for agg, i, n_clients in plan:
            if time.monotonic() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: skipping {agg} pair {i}",
                      file=sys.stderr)
                continue
            # Native first in even pairs, Python first in odd ones.
            for side in ("native", "python") if i % 2 == 0 else ("python", "native"):
                run = one_run(args, work, names[:n_clients], side, agg,
                              f"{agg}-{n_clients}-{i}-{side}")
                run["pair"] = i
                runs.append(run)
                jsonl.write(json.dumps({"bench": "python_client_overhead_run", **run}) + "\n")
                jsonl.flush()
                f = figures(run, "zero")
                print(f"{agg} {n_clients} clients pair {i} {side}: median round {statistics.median(run['seconds'][2:]):.4f} s, "
                      f"client CPU/round {f['cpu_outside_fit_s'] * 1e3:.2f} ms (fit not taken out)",
                      flush=True)
        summary = summarize(runs, args.clients)
        for s in summary:
            jsonl.write(json.dumps(s) + "\n")
        print(f"\nwall time of the invocation: {time.monotonic() - start:.0f} s "
              f"({len(runs)} runs of {args.rounds} rounds)")
        print("\n| aggregation | clients | figure | native (median) | Python (median) "
              "| Python/native | native training taken out | bracket (native training 0 .. span) "
              "| pair ratios |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in summary:
            if s["bench"] != "python_client_overhead_summary":
                continue
            bracket = f"{s['ratio_native_fit_zero']:.3f} .. {s['ratio_native_fit_span']:.3f}"
            label = {"wall_outside_fit_s": "round wall outside fit",
                     "cpu_outside_fit_s": "client CPU outside fit, per client"}[s["figure"]]
            print(f"| {s['aggregation']} | {s['clients']} | {label} | "
                  f"{s['native_median_s'] * 1e3:.2f} ms | {s['python_median_s'] * 1e3:.2f} ms | "
                  f"{s['ratio']:.3f} | {s['native_fit']} | {bracket} | "
                  + " ".join(f"{x:.3f}" for x in s["pair_ratios"]) + " |")
        print("\n| aggregation | clients | side | median round | median coordinator "
              "| mean fit (Python) | mean fit CPU (Python) | store train (plain) "
              "| log span task->trained |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in summary:
            if s["bench"] == "python_client_overhead_detail":
                print(f"| {s['aggregation']} | {s['clients']} | {s['side']} | "
                      f"{ms(s['median_round_s'])} ms | "
                      f"{ms(s['median_coordinator_s'])} ms | {ms(s['mean_fit_s'])} ms | "
                      f"{ms(s['mean_fit_cpu_s'])} ms | {ms(s['mean_store_train_s'])} ms | "
                      f"{ms(s['mean_span_s'])} ms |")
    except BaseException:
        args.keep = True  # The logs the error names.
        raise
    finally:
        jsonl.close()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--py-client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--coordinator")
    p.add_argument("--name")
    p.add_argument("--identity")
    p.add_argument("--coordinator-key")
    p.add_argument("--num-params", type=int, default=NUM_PARAMS)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--cohort", default=os.path.join(ROOT, "build/cli/cohort"))
    p.add_argument("--pythonpath", default=os.environ.get("PYTHONPATH")
                   or os.path.join(ROOT, "build/python"))
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--samples", type=int, default=2, help="per client (= the batch)")
    p.add_argument("--pairs", type=int, default=8, help="SecAgg+ pairs")
    p.add_argument("--plain-pairs", type=int, default=4)
    p.add_argument("--single-pairs", type=int, default=2,
                   help="plain pairs of one client each (the native training alone)")
    p.add_argument("--run-timeout", type=float, default=180)
    p.add_argument("--budget-s", type=float, default=600,
                   help="start no pair after this many seconds")
    p.add_argument("--out", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                 "cohort-bench"))
    p.add_argument("--keep", action="store_true", help="keep the run directories and logs")
    args = p.parse_args()
    if args.py_client:
        return py_client(args)
    if args.rounds < 4:
        p.error("--rounds: at least 4")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
