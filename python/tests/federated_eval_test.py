"""Federated evaluation (rounds.federated_eval_every): the round's clients
evaluate the model they receive on their own test splits, and the
coordinator records the mean weighted by test samples, inside the masked
vector in secure rounds. Real coordinators, Python clients (NumPy
stand-ins) and a native client with --test-data, on 127.0.0.1."""

import csv
import io
import json
import os
import re
import sys
import unittest

from harness import Run, cohort_bin

# (name, evaluate's test samples, loss, accuracy); the training samples
# (the masked mean's weight) differ from the test samples on purpose.
CLIENTS = [("py-a", 40, 0.5, 0.9), ("py-b", 10, 2.0, 0.3), ("py-c", 25, 1.0, 0.6)]
TRAIN_SAMPLES = {"py-a": 160, "py-b": 400, "py-c": 50, "py-d": 100}


def expected(clients):
    m = sum(c[1] for c in clients)
    return (sum(c[1] * c[2] for c in clients) / m, sum(c[1] * c[3] for c in clients) / m, m)


class FederatedEvalTest(unittest.TestCase):
    def start_clients(self, run, curve, extra=()):
        out = []
        for name, m, loss, acc in CLIENTS:
            args = ["--numpy", "--samples", str(TRAIN_SAMPLES[name]), "--eval",
                    f"{m}:{loss}:{acc}", *extra]
            if curve:
                args += ["--peers", run.path("allow")]
            else:
                args.append("--plain")
            out.append(run.start_python_client(name, *args, curve=curve))
        return out

    def test_secure_rounds_carry_the_evaluation_inside_the_masked_vector(self):
        run = Run("fed-eval-secure")
        self.addCleanup(run.close)
        # Four: with --peers, a cohort of three could hold a colluder and
        # too few honest clients, and is refused.
        names = [c[0] for c in CLIENTS] + ["py-d"]
        run.keygen(["coordinator"] + names, allow=names)
        config = run.write_config(3, "min_clients: 4 start_clients: 4 round_deadline_s: 60 "
                                     "federated_eval_every: 2")
        run.start_coordinator(config, curve=True)
        clients = self.start_clients(run, curve=True)
        # One without evaluate: zeros in its slots, left out of the mean.
        idle = run.start_python_client("py-d", "--numpy", "--samples", "100", "--peers",
                                       run.path("allow"), curve=True)
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients:
            self.assertEqual(c.wait(30), 0, c.output())
            # Asked in rounds 1 and 3 (every 2), never in round 2.
            self.assertIn("evaluate round 1 evaluate=True", c.output())
            self.assertIn("evaluate round 3 evaluate=True", c.output())
            self.assertNotIn("evaluate round 2", c.output())
        loss, acc, m = expected(CLIENTS)
        rounds = run.rounds()
        for r in (1, 3):
            self.assertEqual(rounds[r]["aggregation"], "secagg+", rounds[r])
            fe = rounds[r]["federated_eval"]
            self.assertEqual(fe["model_round"], r - 1)
            # Fixed point: the means to 1e-3, the samples to one.
            self.assertAlmostEqual(fe["loss"], loss, delta=1e-3)
            self.assertAlmostEqual(fe["accuracy"], acc, delta=1e-3)
            self.assertLessEqual(abs(fe["samples"] - m), 1, fe)
        self.assertNotIn("federated_eval", rounds[2])
        self.assertEqual(idle.wait(30), 0, idle.output())
        self.assertIn("not evaluated: Client.run was given no evaluate", idle.output())
        for r in (1, 2, 3):
            self.assertEqual(rounds[r]["participants"], 4, rounds[r])
        table = run.status()
        self.assertIn("federated evaluation of the initial model: accuracy", table)
        self.assertIn("fed_acc", table)
        # No central evaluation (no test shard): "-", never a -1 to misread.
        self.assertRegex(table, r"\n +2 secagg\+ +4/4 +0 +[0-9.]+ +- +- +[0-9.]+ +[0-9.]+ +[0-9.]+\n")
        self.assertNotIn("-1.0000", table)
        # Secure rounds hold only the means: no client's own loss to show.
        clients = run.cohort("status", "--run-dir", run.path("run"), "--clients")
        self.assertRegex(clients, r"\n +py-a +ok +samples 160 +loss - +acc - +-")

    def test_plain_rounds_weigh_python_and_native_clients_by_test_samples(self):
        run = Run("fed-eval-plain")
        self.addCleanup(run.close)
        run.cohort("partition", "--format", "synthetic", "--samples", "200", "--test-samples",
                   "60", "--features", "20", "--classes", "4", "--clients", "1", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        config = run.write_config(2, "min_clients: 6 start_clients: 6 round_deadline_s: 60 "
                                     "federated_eval_every: 1",
                                  extra="secagg { aggregation: PLAIN }")
        run.start_coordinator(config)
        clients = self.start_clients(run, curve=False)
        native = run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--insecure",
                            "--name", "native", "--data", run.path("shards/client-000.shard"),
                            "--test-data", run.path("shards/test.shard")], "native.log")
        # A Python client whose evaluate raises: its updates go without one.
        broken = run.start_python_client("broken", "--numpy", "--plain", "--eval", "raise")
        # One whose evaluate returns a negative loss: named, left out.
        negative = run.start_python_client("negative", "--numpy", "--plain", "--eval", "5:-1:0.5")
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients + [native, broken, negative]:
            self.assertEqual(c.wait(30), 0, c.output())
        self.assertIn("not evaluated: evaluate raised RuntimeError: planted evaluate failure in "
                      "round 1", broken.output())
        self.assertIn("not evaluated: evaluate's metrics['loss'] is -1; expected 0 or "
                      "more", negative.output())
        rounds = run.rounds()
        for r in (1, 2):
            line = re.search(rf"round {r}: evaluated the round's model on (\d+) test samples: "
                             r"loss ([0-9.]+), accuracy ([0-9.]+)", native.output())
            self.assertIsNotNone(line, native.output())
            own = ("native", int(line[1]), float(line[2]), float(line[3]))
            self.assertEqual(own[1], 60)
            loss, acc, m = expected(CLIENTS + [own])
            fe = rounds[r]["federated_eval"]
            self.assertEqual(fe["samples"], m)
            self.assertAlmostEqual(fe["loss"], loss, delta=1e-4)  # The log's 4 decimals.
            self.assertAlmostEqual(fe["accuracy"], acc, delta=1e-4)
            self.assertEqual(rounds[r]["participants"], 6, rounds[r])

        # The same figures as a user reads them (issue 33): per client, and CSV.
        table = run.cohort("status", "--run-dir", run.path("run"), "--clients")
        self.assertRegex(table, r"\n +native +ok +samples 200 +loss [0-9]\.[0-9]{4} +acc "
                                r"[0-9]\.[0-9]{4} +[0-9]+\.[0-9]{2}s")
        rows = list(csv.DictReader(io.StringIO(
            run.cohort("status", "--run-dir", run.path("run"), "--csv"))))
        self.assertEqual([r["round"] for r in rows], ["1", "2"])
        loss, acc, m = expected(CLIENTS + [("native", 60, 0.0, 0.0)])
        self.assertEqual(rows[0]["federated_eval_of_round"], "0")
        self.assertEqual(rows[0]["federated_eval_samples"], str(m))
        self.assertAlmostEqual(float(rows[1]["federated_eval_accuracy"]),
                               rounds[2]["federated_eval"]["accuracy"], delta=1e-5)
        self.assertEqual(rows[0]["test_accuracy"], "")  # No central evaluation.
        per_client = list(csv.DictReader(io.StringIO(
            run.cohort("status", "--run-dir", run.path("run"), "--csv", "--clients"))))
        self.assertEqual(len(per_client), 2 * 6)
        native_rows = [r for r in per_client if r["client"] == "native"]
        self.assertEqual([r["num_samples"] for r in native_rows], ["200", "200"])
        self.assertTrue(all(r["status"] == "ok" and float(r["train_loss"]) > 0
                            for r in native_rows), native_rows)

    def test_clients_evaluating_the_coordinators_test_set_agree_with_it(self):
        # Every native client evaluates on the coordinator's own test shard:
        # the federated evaluation of each round's model is then its central
        # one, in plain rounds and through the masked sum alike.
        for agg in ("PLAIN", "SECAGG_PLUS"):
            run = Run("fed-eval-central-" + agg.lower())
            self.addCleanup(run.close)
            names = [f"n{k}" for k in range(4)]
            run.keygen(["coordinator"] + names, allow=names)
            run.cohort("partition", "--format", "synthetic", "--samples", "400",
                       "--test-samples", "100", "--features", "20", "--classes", "4",
                       "--clients", "4", "--scheme", "iid", "--seed", "1", "--out",
                       run.path("shards"))
            test = run.path("shards/test.shard")
            config = run.write_config(3, "min_clients: 4 start_clients: 4 round_deadline_s: 60 "
                                         "federated_eval_every: 1",
                                      extra=f'data {{ test_shard: "{test}" }} '
                                            f'secagg {{ aggregation: {agg} }}')
            run.start_coordinator(config, curve=True)
            # `status --follow` prints each round as it commits and ends with the run.
            follow = run.spawn([cohort_bin(), "status", "--run-dir", run.path("run"), "--json",
                                "--follow"], "follow.log")
            clients = [run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint,
                                  "--data", run.path(f"shards/client-00{k}.shard"),
                                  "--test-data", test, "--identity",
                                  run.path(f"keys/{name}.key"), "--coordinator-key",
                                  run.path("keys/coordinator.pub")], f"{name}.log")
                       for k, name in enumerate(names)]
            self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
            for c in clients:
                self.assertEqual(c.wait(30), 0, c.output())
            rounds = run.rounds()
            self.assertEqual(follow.wait(30), 0, follow.output())
            followed = [json.loads(line) for line in follow.output().splitlines()
                        if line.startswith("{")]
            self.assertEqual([r["round"] for r in followed], [1, 2, 3])
            self.assertEqual(followed[2]["federated_eval"], rounds[3]["federated_eval"])
            for r in (1, 2):
                fe = rounds[r + 1]["federated_eval"]
                self.assertEqual(fe["model_round"], r)
                self.assertEqual(fe["samples"], 400)  # 4 clients x 100.
                self.assertAlmostEqual(fe["accuracy"], rounds[r]["test_accuracy"], delta=1e-5)
                self.assertAlmostEqual(fe["loss"], rounds[r]["test_loss"], delta=1e-4)

    def test_simulate_refuses_it_for_now(self):
        run = Run("fed-eval-sim")
        self.addCleanup(run.close)
        config = run.write_config(1, "federated_eval_every: 1")
        p = run.spawn([cohort_bin(), "simulate", "--config", config, "--run-dir",
                       run.path("run"), "--shards", run.path("shards")], "sim.log")
        self.assertNotEqual(p.wait(60), 0, p.output())
        self.assertIn("simulate: rounds.federated_eval_every is not simulated yet", p.output())


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
