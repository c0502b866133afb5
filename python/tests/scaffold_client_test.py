"""SCAFFOLD (issue 34, item 2) and Python clients: their fit does not apply
the control variates, so a Python client leaves every train.scaffold round
saying so, and the SecAgg+ rounds commit with the five native `cohort
client`s (127.0.0.1)."""

import os
import sys
import unittest

from harness import Run, cohort_bin

ROUNDS = 2
REFUSAL = ("training failed: train.scaffold: a Python client's fit does not apply SCAFFOLD's "
           "control variates; use `cohort client` or leave train.scaffold out")


class ScaffoldPythonClientTest(unittest.TestCase):
    def test_a_python_client_leaves_each_scaffold_round_saying_why(self):
        run = Run("scaffold-python")
        self.addCleanup(run.close)
        run.cohort("partition", "--format", "synthetic", "--samples", "320", "--test-samples",
                   "200", "--features", "20", "--classes", "4", "--clients", "5", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        config = run.write_config(
            ROUNDS, "min_clients: 3 start_clients: 6 round_deadline_s: 60",
            extra=f'data {{ test_shard: "{run.path("shards/test.shard")}" }}')
        with open(config) as f:
            text = f.read().replace("local_epochs: 1 }", "local_epochs: 1 scaffold: true }")
        with open(config, "w") as f:
            f.write(text)
        run.start_coordinator(config)
        python_client = run.start_python_client("py-a")
        natives = [run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
                              run.path(f"shards/client-00{k}.shard"), "--insecure",
                              "--state-dir", run.path(f"state-{k}")], f"native-{k}.log")
                   for k in range(5)]
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in natives + [python_client]:
            self.assertEqual(c.wait(30), 0, c.output())
        for r in range(1, ROUNDS + 1):
            self.assertIn(f"round {r}: training failed: " + REFUSAL[len("training failed: "):],
                          python_client.output())
        rounds = run.rounds()
        self.assertEqual(sorted(rounds), list(range(1, ROUNDS + 1)))
        for r in rounds.values():
            self.assertEqual(r["participants"], 5, r)
            self.assertEqual(r["aggregation"], "secagg+", r)
        for k in range(5):
            self.assertTrue(os.path.exists(run.path(f"state-{k}/scaffold_variate.bin")))


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
