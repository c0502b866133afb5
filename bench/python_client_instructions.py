#!/usr/bin/python3
"""Issue 32, acceptance 3, counted instead of timed: the instructions a Python
client (cohort.Client(...).run(fit)) executes per SecAgg+ round beyond a
native `cohort client`, outside training, for the 1M-parameter model of
bench/python_client_overhead_bench.py (whose set-up, clients and coordinator
this reuses).

    /usr/bin/python3 bench/python_client_instructions.py [--cohort build/cli/cohort] \
        [--rounds 6] [--clients 4] [--aggregation SECAGG_PLUS]

Two runs, one per side, each a real coordinator on 127.0.0.1 (CURVE, an
allowlist) with --clients clients of that side. Client 0 runs under
valgrind's callgrind (the others natively): when it logs "round 2: task
received" its counters are zeroed (`callgrind_control --zero`), and when it
logs "round R: task received" they are dumped, so the dump holds exactly
rounds 2..R-1 of the whole process, every thread: the protocol, CURVE, the
SecAgg+ masking, the copies, and on the Python side the bridge into Python
and fit. Instruction counts do not depend on how loaded the machine is.

Training taken out:
  native: the inclusive instructions of cohort::train::TrainLocal;
  Python: none — fit's own body (one in-place `params -= step` over the
          1M-float NumPy view of the C++ buffer, and a print) stays in, so
          the Python figure is an upper bound of its cost outside fit.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import python_client_overhead_bench as ov  # noqa: E402


def callgrind_argv(out):
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--vgdb=yes"]


def ctl(*argv):
    subprocess.run(["callgrind_control", *argv], check=True, capture_output=True, timeout=300)


def one_side(args, work, names, side):
    """Runs one side; returns the dump file of client 0's rounds 2..R-1."""
    rdir = f"{work}/{side}"
    os.makedirs(rdir)
    config = f"{rdir}/run.textproto"
    with open(config, "w") as f:
        f.write(f"seed: 1\n{ov.MODEL}\n"
                f"train {{ batch_size: {args.samples} learning_rate: 0.05 local_epochs: 1 }}\n"
                f"rounds {{ num_rounds: {args.rounds} min_clients: {len(names)} "
                f"start_clients: {len(names)} round_deadline_s: 600 client_timeout_s: 300 }}\n"
                "net { heartbeat_s: 1 }\n"
                f"secagg {{ aggregation: {args.aggregation} stage_timeout_s: 300 }}\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=args.pythonpath)
    procs = []
    try:
        coord = ov.Proc([args.cohort, "coordinator", "--config", config, "--run-dir",
                         f"{rdir}/run", "--bind", "tcp://127.0.0.1:0", "--identity",
                         f"{work}/keys/coordinator.key", "--allow", f"{work}/allow"],
                        f"{rdir}/coordinator.log", env)
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
                argv = [sys.executable, os.path.join(HERE, "python_client_overhead_bench.py"),
                        "--py-client", "--coordinator", endpoint, "--name", name,
                        "--samples", str(args.samples), "--num-params", str(ov.NUM_PARAMS), *key]
                if args.aggregation == "PLAIN":
                    argv.append("--plain")
            if k == 0:
                argv = callgrind_argv(f"{rdir}/client0.callgrind") + argv
            c = ov.Proc(argv, f"{rdir}/{name}.log", env)
            procs.append(c)
            clients.append(c)
        # Zero at round 2's task, dump at round R's: rounds 2..R-1.
        if clients[0].wait_line("round 2: task received", 900) is None:
            raise RuntimeError(f"client 0 never reached round 2: see {rdir}/{names[0]}.log")
        ctl("--zero", str(clients[0].proc.pid))
        if clients[0].wait_line(f"round {args.rounds}: task received", 1800) is None:
            raise RuntimeError(f"client 0 never reached round {args.rounds}: see {rdir}")
        ctl("--dump=rounds", str(clients[0].proc.pid))
        if coord.wait(1800) != 0:
            raise RuntimeError(f"coordinator failed: see {rdir}/coordinator.log")
    finally:
        for p in procs:
            p.kill()
    dumps = sorted(f for f in os.listdir(rdir) if f.startswith("client0.callgrind")
                   and f != "client0.callgrind")
    if not dumps:
        raise RuntimeError(f"no callgrind dump in {rdir}: {os.listdir(rdir)}")
    return os.path.join(rdir, dumps[0])


def inclusive(dump, pattern):
    """(program total, inclusive instructions of functions matching `pattern`)."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                          check=True, capture_output=True, text=True).stdout
    total = int(re.search(r"^([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text, re.M)
                .group(1).replace(",", ""))
    hits = 0
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.+?)(?: \[[^\]]*\])?$", line)
        if not m or not pattern or "PROGRAM TOTALS" in line:
            continue
        # The file part ("???:") ends at the first ':' that is not part of a '::'.
        name = re.sub(r"^(?:[^:]|::)*?:(?!:)", "", m.group(2), count=1)
        if re.search(pattern, name):
            hits = max(hits, int(m.group(1).replace(",", "")))
    return total, hits


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cohort", default=os.path.join(ov.ROOT, "build/cli/cohort"))
    p.add_argument("--pythonpath", default=os.environ.get("PYTHONPATH")
                   or os.path.join(ov.ROOT, "build/python"))
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--aggregation", default="SECAGG_PLUS", choices=["SECAGG_PLUS", "PLAIN"])
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("python_client_instructions: needs valgrind (apt-get install valgrind)",
              file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="cohort-pyinstr-")
    try:
        names = ov.setup(args, work)
        rounds = args.rounds - 2
        native_total, native_train = inclusive(one_side(args, work, names, "native"),
                                               r"cohort::train::TrainLocal\(")
        python_total, _ = inclusive(one_side(args, work, names, "python"), None)
    except BaseException:
        args.keep = True
        raise
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    native_out = native_total - native_train
    print(f"{args.aggregation}, {args.clients} clients, client 0's rounds 2..{args.rounds - 1} "
          f"({rounds} rounds), instructions per round (callgrind, whole process):")
    print("| side | total | training taken out | outside training |")
    print("|---|---|---|---|")
    print(f"| native | {native_total / rounds:,.0f} | {native_train / rounds:,.0f} (TrainLocal) | "
          f"{native_out / rounds:,.0f} |")
    print(f"| Python | {python_total / rounds:,.0f} | 0 (fit's body stays in) | "
          f"{python_total / rounds:,.0f} |")
    print(f"Python / native, outside training: {python_total / native_out:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
