#!/usr/bin/python3
"""Robust aggregation under attack (issue 34, acceptance 3).

`cohort simulate` on Fashion-MNIST split IID over 20 clients, every client
in every round, PLAIN aggregation without the L2 norm bound
(server.max_update_norm 0, so only the rule defends), with 20 % of the
clients (4, drawn from the seed) misbehaving in every round through the
simulator's testing flags (--fault-misbehave, --fault-misbehave-fraction):
  sign_flip          each sends -1 x its update
  scale10            each sends 10 x its update
  sign_flip_scale10  each sends -10 x its update
Rules: FedAvg (the weighted mean), MEDIAN, TRIMMED_MEAN (trim 0.2),
KRUM, MULTI_KRUM (m = n - f) and BULYAN, with f = 4 (Bulyan's n >= 4f + 3
= 19 holds with 20). Prints the final test accuracy of every (rule, attack)
pair, averaged over the seeds, as a Markdown table, and the acceptance
check: every robust rule within 3 points of attack-free FedAvg, FedAvg more
than 10 points below it.

  /usr/bin/python3 bench/robust_bench.py [--cohort build/cli/cohort]
      [--rounds 20] [--seeds 1,2,3] [--hidden 100] [--threads 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

DATA = "/usr/share/datasets/fashion-mnist"
RULES = [
    ("FedAvg", ""),
    ("MEDIAN", "robust { rule: MEDIAN }"),
    ("TRIMMED_MEAN 0.2", "robust { rule: TRIMMED_MEAN trim_fraction: 0.2 }"),
    ("KRUM f=4", "robust { rule: KRUM byzantine_clients: 4 }"),
    ("MULTI_KRUM f=4", "robust { rule: MULTI_KRUM byzantine_clients: 4 }"),
    ("BULYAN f=4", "robust { rule: BULYAN byzantine_clients: 4 }"),
]
ATTACKS = ["none", "sign_flip", "scale10", "sign_flip_scale10"]


def fmnist_partition(clients, seed, scheme="iid"):
    """A data section: Fashion-MNIST's idx files split over `clients` by `scheme`
    (`cohort partition`'s: iid, dirichlet:A, shards:K, quantity:A)."""
    return f"""data {{
  partition {{
    format: "idx"
    train_images: "{DATA}/train-images-idx3-ubyte.gz"
    train_labels: "{DATA}/train-labels-idx1-ubyte.gz"
    test_images: "{DATA}/t10k-images-idx3-ubyte.gz"
    test_labels: "{DATA}/t10k-labels-idx1-ubyte.gz"
    clients: {clients}
    scheme: "{scheme}"
    seed: {seed}
  }}
}}"""


def config(seed, rounds, hidden, robust):
    model = 'arch: "mlp" hidden: %d' % hidden if hidden else 'arch: "logreg"'
    return f"""name: "robust-bench"
seed: {seed}
{fmnist_partition(20, seed)}
model {{ {model} input_dim: 784 num_classes: 10 }}
train {{ local_epochs: 1 batch_size: 32 learning_rate: 0.05 }}
rounds {{ num_rounds: {rounds} min_clients: 20 start_clients: 20 fraction: 1 round_deadline_s: 600 }}
secagg {{ aggregation: PLAIN }}
server {{ max_update_norm: 0 {robust} }}
"""


def final_accuracy(args, work, name, text, attack):
    path = os.path.join(work, name + ".textproto")
    with open(path, "w") as f:
        f.write(text)
    cmd = [args.cohort, "simulate", "--config", path, "--run-dir", os.path.join(work, name),
           "--threads", str(args.threads), "--json"]
    if attack != "none":
        cmd += ["--fault-misbehave", attack, "--fault-misbehave-fraction", "0.2"]
    with open(os.path.join(work, name + ".log"), "w") as log:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, check=True).stdout
    rounds = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rounds[-1]["test_accuracy"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cohort", default="build/cli/cohort")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--hidden", type=int, default=100, help="MLP hidden width; 0: logreg")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    acc = {}
    with tempfile.TemporaryDirectory(prefix="robust-bench-") as work:
        for rule, robust in RULES:
            for attack in ATTACKS:
                runs = []
                for seed in seeds:
                    name = "%s-%s-%d" % (rule.split()[0], attack, seed)
                    runs.append(final_accuracy(args, work, name,
                                               config(seed, args.rounds, args.hidden, robust),
                                               attack))
                acc[rule, attack] = 100 * sum(runs) / len(runs)
                print("%-17s %-18s %s" % (rule, attack, " ".join("%.4f" % r for r in runs)),
                      file=sys.stderr, flush=True)
    model = "MLP 784-%d-10" % args.hidden if args.hidden else "logreg"
    print("Fashion-MNIST, %s, 20 IID clients, %d rounds, 4 attackers (20 %%), "
          "seeds %s: final test accuracy %%, mean over seeds\n" % (model, args.rounds, args.seeds))
    print("| rule | " + " | ".join(ATTACKS) + " |")
    print("|---|" + "---|" * len(ATTACKS))
    for rule, _ in RULES:
        print("| %s | " % rule + " | ".join("%.2f" % acc[rule, a] for a in ATTACKS) + " |")
    base = acc["FedAvg", "none"]
    print("\nattack-free FedAvg: %.2f %%" % base)
    for attack in ATTACKS[1:]:
        fedavg_loss = base - acc["FedAvg", attack]
        worst = max(base - acc[rule, attack] for rule, _ in RULES[1:])
        print("%-18s FedAvg loses %6.2f points (> 10: %s); the robust rules lose at most "
              "%5.2f (<= 3: %s)" % (attack, fedavg_loss, "yes" if fedavg_loss > 10 else "NO",
                                    worst, "yes" if worst <= 3 else "NO"))


if __name__ == "__main__":
    main()
