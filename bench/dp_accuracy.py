"""Accuracy under central differential privacy (issue 34, acceptance 5's table).

`cohort simulate` of DP-FedAvg (McMahan et al. 2018) on Fashion-MNIST with
LeNet-5: the 60,000 training images split IID over --clients clients, a
fixed-size cohort of --per-round a round (q = per_round / clients), plain
aggregation with a trusted coordinator (central DP), server momentum 0.9.
For each target epsilon (delta 1e-5) the noise multiplier sigma is the
smallest that keeps --rounds rounds within it, found by bisection with the
independent accountant of tests/data/make_rdp_wor_golden.py (the fixed-size
cohort sampled without replacement, replace-one, sigma / 2; not the C++ one);
the run's own accountant then reports its epsilon after
every round, and `privacy.epsilon_budget` is the target, so a sigma that
spent more would stop the run early (the bench fails if any run stops
short). With --baseline, a run without `privacy` (same clients, cohort and
optimizer, no clipping, no noise) comes first, and one with sigma 0.001 (the
least the config takes) and no budget shows what the clipping and the
equally weighted fixed-denominator mean cost without noise.

  /usr/bin/python3 bench/dp_accuracy.py [--cohort build/cli/cohort]
      [--clients 3000] [--per-round 150] [--rounds 50] [--clip 0.5]
      [--epsilons 1,3,8] [--threads 2] [--mechanism central|distributed] [--baseline]

--mechanism distributed runs distributed DP instead (privacy.mechanism
DISTRIBUTED_SKELLAM under SecAgg+: the clients' Skellam noise, shares sized
for the whole cohort since the simulator drops nobody), with sigma from the
independent Skellam accountant of tests/data/make_skellam_golden.py at the
grid the coordinator picks for --dim values (privacy/skellam.cc); its
--baseline rows run under SecAgg+. By default sigma is calibrated on the
view against the coordinator (replace-one, no amplification); with
--budget-view released it is calibrated on the view for the released model
(Theorem 9 of Wang et al. 2019 at q, the independent decimal computation of
tests/data/make_skellam_wor_golden.py) and the runs set privacy.budget_view
RELEASED_MODEL, so the budget stop and the "run's epsilon" column are that
view's (the table then also shows the epsilon against the coordinator).

  /usr/bin/python3 bench/dp_accuracy.py --mechanism distributed --budget-view released
      --epsilons 8

Prints a Markdown table (epsilon target, sigma, the run's final epsilon,
final and best test accuracy) and a JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "data"))
import make_rdp_wor_golden as wor  # noqa: E402  (the independent accountant)
import make_skellam_golden as skellam  # noqa: E402  (distributed DP's)
import make_skellam_wor_golden as skellam_wor  # noqa: E402  (its released-model view)
from robust_bench import fmnist_partition  # noqa: E402

warnings.filterwarnings("ignore", message=".*roundoff error.*")  # scipy's quad, at tiny q.

DELTA = 1e-5


def epsilon(q, sigma, rounds):
    """Central DP's epsilon as the coordinator charges it: a fixed-size cohort
    sampled without replacement, replace-one adjacency, so the noise
    multiplier counts as sigma / 2 (docs/privacy.md)."""
    return wor.epsilon(wor.float_rdps(q, sigma / 2), rounds, DELTA)[0]


def skellam_grid(sigma, clip, dim):
    """(L1, L2, V) of the grid ChooseSkellamParams picks (the noise cap 2^21
    binds at these cohorts: the wrap bound does not)."""
    import math
    scale = 2.0 ** math.floor(math.log2(2.0 ** 21 / (sigma * clip)))
    l2 = skellam.l2_bound(scale * clip, dim)
    l1 = l2 * min(math.sqrt(dim), l2)
    return l1, l2, (scale * sigma * clip) ** 2


def skellam_epsilon(q, sigma, rounds, clip, dim):
    """Distributed DP's epsilon against the coordinator, as it charges it
    (privacy/skellam.h ChargeSkellamRounds): replace-one (twice the
    sensitivities) and no amplification (q = 1)."""
    l1, l2, v = skellam_grid(sigma, clip, dim)
    return skellam.epsilon(1.0, 2 * l1, 2 * l2, v, rounds, DELTA)


def skellam_released_epsilon(q, sigma, rounds, clip, dim):
    """Distributed DP's epsilon for the released model
    (ChargeSkellamRoundsForReleasedModel): Theorem 9 at q over the same
    replace-one curve, capped by it."""
    l1, l2, v = skellam_grid(sigma, clip, dim)
    return skellam_wor.epsilon(skellam_wor.released_rdps(q, l1, l2, v), rounds, DELTA)[0]


def sigma_for(q, rounds, target, eps=None):
    """The smallest sigma (to 1e-6) whose epsilon after `rounds` is <= target."""
    eps = eps or (lambda q, sigma, rounds: epsilon(q, sigma, rounds))
    lo, hi = 0.1, 100.0
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eps(q, mid, rounds) > target else (lo, mid)
    return hi * 1.0001  # Room for the two accountants' last digits.


def config(args, privacy):
    return f"""name: "dp-accuracy"
seed: {args.seed}
{fmnist_partition(args.clients, args.seed)}
model {{ arch: "lenet5" }}
train {{ local_epochs: {args.local_epochs} batch_size: {args.batch} learning_rate: {args.lr} }}
rounds {{ num_rounds: {args.rounds} min_clients: {args.per_round} start_clients: {args.clients}
          max_clients_per_round: {args.per_round} round_deadline_s: 3600 }}
secagg {{ aggregation: {"SECAGG_PLUS" if args.mechanism == "distributed" else "PLAIN"} }}
server {{ momentum: 0.9 max_update_norm: 0 }}
{privacy}
"""


def run(args, work, name, text):
    path = os.path.join(work, name + ".textproto")
    with open(path, "w") as f:
        f.write(text)
    cmd = [args.cohort, "simulate", "--config", path, "--run-dir", os.path.join(work, name),
           "--threads", str(args.threads), "--json"]
    start = time.monotonic()
    with open(os.path.join(work, name + ".log"), "w") as log:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, check=True).stdout
    rounds = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(rounds) != args.rounds:
        sys.exit(f"{name}: {len(rounds)} rounds committed, not {args.rounds}; "
                 f"see {os.path.join(work, name + '.log')}")
    return rounds, time.monotonic() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cohort", default="build/cli/cohort")
    p.add_argument("--clients", type=int, default=3000)
    p.add_argument("--per-round", type=int, default=150)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epsilons", default="1,3,8")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keep", help="keep the runs in this new directory")
    p.add_argument("--mechanism", choices=["central", "distributed"], default="central")
    p.add_argument("--baseline", action="store_true",
                   help="the none and clip-only rows too (they do not depend on the mechanism "
                        "or the accountant)")
    p.add_argument("--budget-view", choices=["coordinator", "released"], default="coordinator",
                   help="distributed DP: the view sigma is calibrated on and the budget stops "
                        "on (privacy.budget_view)")
    p.add_argument("--dim", type=int, default=44426,
                   help="the model's values (Cohort's LeNet-5: 44,426)")
    args = p.parse_args()
    q = args.per_round / args.clients
    rows = []
    work = args.keep or tempfile.mkdtemp(prefix="dp-accuracy-")
    os.makedirs(work, exist_ok=True)
    distributed = args.mechanism == "distributed"
    released = distributed and args.budget_view == "released"
    if released:
        eps_of = lambda q, s, r: skellam_released_epsilon(q, s, r, args.clip, args.dim)  # noqa
    elif distributed:
        eps_of = lambda q, s, r: skellam_epsilon(q, s, r, args.clip, args.dim)  # noqa
    else:
        eps_of = None
    plan = [("none", None), ("clip only", 0.001)] if args.baseline else []
    plan += [(e, sigma_for(q, args.rounds, float(e), eps_of)) for e in args.epsilons.split(",")]
    mechanism = " mechanism: DISTRIBUTED_SKELLAM" if distributed else ""
    if released:
        mechanism += " budget_view: RELEASED_MODEL"
    for target, sigma in plan:
        budget = 0 if target == "clip only" else target
        privacy = "" if sigma is None else (
            f"privacy {{{mechanism} noise_multiplier: {sigma:.6f} clip_norm: {args.clip} "
            f"target_delta: {DELTA} epsilon_budget: {budget} }}")
        rounds, wall = run(args, work, f"eps-{target}".replace(" ", "-"), config(args, privacy))
        acc = [r["test_accuracy"] for r in rounds]
        views = rounds[-1].get("privacy", {})
        spent = views.get("epsilon_released_model" if released else "epsilon")
        rows.append({"target_epsilon": target, "sigma": sigma, "epsilon": spent,
                     "epsilon_against_coordinator": views.get("epsilon") if released else None,
                     "final_accuracy": acc[-1], "best_accuracy": max(acc), "wall_s": wall})
        print(f"epsilon {target}: sigma {sigma}, run's epsilon {spent}, "
              f"final accuracy {acc[-1]:.4f} ({wall:.0f} s)", file=sys.stderr, flush=True)
    view = ", sigma calibrated on the released model's view" if released else ""
    print(f"{args.mechanism} DP{view}: "
          f"Fashion-MNIST, LeNet-5, {args.clients} IID clients, {args.per_round} a round "
          f"(q = {q:g}), {args.rounds} rounds, {args.local_epochs} local epochs of batch "
          f"{args.batch} at lr {args.lr}, server momentum 0.9, clip norm {args.clip}, "
          f"delta {DELTA:g}, seed {args.seed}\n")
    against = " | epsilon against the coordinator" if released else ""
    print("| target epsilon | noise multiplier | epsilon after the last round (the run's "
          f"accountant){against} | final test accuracy | best round |")
    print("|---|---|---|---|---|" + ("---|" if released else ""))
    for r in rows:
        sigma = "—" if r["sigma"] is None else f"{r['sigma']:.4f}"
        eps = "—" if r["epsilon"] is None else f"{r['epsilon']:.4g}"
        other = r["epsilon_against_coordinator"]
        other = "" if not released else " | " + ("—" if other is None else f"{other:.4g}")
        print(f"| {r['target_epsilon']} | {sigma} | {eps}{other} | "
              f"{100 * r['final_accuracy']:.2f} % | {100 * r['best_accuracy']:.2f} % |")
    print(json.dumps({"bench": "dp_accuracy", "mechanism": args.mechanism,
                      "budget_view": args.budget_view if distributed else None, "q": q,
                      "rows": rows, "work": work}))


if __name__ == "__main__":
    main()
