"""FedNova end to end (issue 34, item 2): a secure run with train.fednova,
three Python clients of 160, 320 and 48 samples training a PyTorch MLP with
cohort.torch.fit_loop (which reports the steps it took) and one native
`cohort client` of 320, CURVE and SecAgg+, on 127.0.0.1. Batches of 16 and
one epoch give 10, 20, 3 and 20 steps: each client logs its normaliser and
the coordinator the round's tau_eff, sum n a / sum n, from the masked sum."""

import os
import re
import sys
import unittest

from harness import Run, cohort_bin

ROUNDS = 2
PYTHON = {"py-a": 160, "py-b": 320, "py-c": 48}
NATIVE = 320


class FedNovaRunTest(unittest.TestCase):
    def test_every_client_sends_its_normaliser_and_the_coordinator_learns_tau_eff(self):
        run = Run("fednova")
        self.addCleanup(run.close)
        names = list(PYTHON) + ["native"]
        run.keygen(["coordinator"] + names, allow=names)
        run.cohort("partition", "--format", "synthetic", "--samples", str(NATIVE),
                   "--test-samples", "200", "--features", "20", "--classes", "4", "--clients",
                   "1", "--scheme", "iid", "--seed", "3", "--out", run.path("shards"))
        config = run.write_config(
            ROUNDS, "min_clients: 4 start_clients: 4 round_deadline_s: 60",
            extra=f'data {{ test_shard: "{run.path("shards/test.shard")}" }}')
        with open(config) as f:
            text = f.read().replace("local_epochs: 1 }", "local_epochs: 1 fednova: true }")
        with open(config, "w") as f:
            f.write(text)
        run.start_coordinator(config, curve=True)
        clients = {n: run.start_python_client(n, "--peers", run.path("allow"), "--samples",
                                              str(s), curve=True)
                   for n, s in PYTHON.items()}
        clients["native"] = run.spawn(
            [cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
             run.path("shards/client-000.shard"), "--identity", run.path("keys/native.key"),
             "--coordinator-key", run.path("keys/coordinator.pub"), "--peers",
             run.path("allow")], "native.log")
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        samples = dict(PYTHON, native=NATIVE)
        for name, c in clients.items():
            self.assertEqual(c.wait(30), 0, c.output())
            steps = samples[name] // 16
            for r in range(1, ROUNDS + 1):
                self.assertIn(f"round {r}: FedNova: {steps} steps, normaliser {steps}\n",
                              c.output())
                if name != "native":
                    self.assertRegex(c.output(), f"fit round {r} zero-copy True "
                                                 f"Task\\(round={r}, .*fednova=True")
        tau_eff = sum(n * (n // 16) for n in samples.values()) / sum(samples.values())
        logged = re.findall(r"round (\d+): FedNova tau_eff ([0-9.e+-]+)", run.coordinator.output())
        self.assertEqual([int(r) for r, _ in logged], list(range(1, ROUNDS + 1)))
        for _, value in logged:
            # The masked sum's grid: about 1e5 / 2^31 per client.
            self.assertAlmostEqual(float(value), tau_eff, delta=2e-3)
        rounds = run.rounds()
        self.assertEqual(sorted(rounds), list(range(1, ROUNDS + 1)))
        for r in rounds.values():
            self.assertEqual(r["aggregation"], "secagg+", r)
            self.assertEqual(r["participants"], 4, r)


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
