"""Python clients in a secure run: three cohort.Client processes training a
PyTorch MLP and one native `cohort client`, with CURVE, --peers and SecAgg+,
against a real coordinator on 127.0.0.1."""

import os
import sys
import unittest

from harness import Run, cohort_bin

ROUNDS = 3


class SecureRunTest(unittest.TestCase):
    def test_python_and_native_clients_train_with_secagg_plus(self):
        run = Run("secure")
        self.addCleanup(run.close)
        names = ["py-a", "py-b", "py-c", "native"]
        run.keygen(["coordinator"] + names, allow=names)
        run.cohort("partition", "--format", "synthetic", "--samples", "320", "--test-samples",
                   "200", "--features", "20", "--classes", "4", "--clients", "1", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        config = run.write_config(
            ROUNDS, "min_clients: 4 start_clients: 4 round_deadline_s: 60",
            extra=f'data {{ test_shard: "{run.path("shards/test.shard")}" }}')
        run.start_coordinator(config, curve=True)
        clients = [run.start_python_client(n, "--peers", run.path("allow"), curve=True)
                   for n in names[:3]]
        native = run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
                            run.path("shards/client-000.shard"), "--identity",
                            run.path("keys/native.key"), "--coordinator-key",
                            run.path("keys/coordinator.pub"), "--peers", run.path("allow")],
                           "native.log")
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients:
            self.assertEqual(c.wait(30), 0, c.output())
            out = c.output()
            for r in range(1, ROUNDS + 1):
                # fit trained the C++ buffer itself, securely aggregated.
                self.assertIn(f"fit round {r} zero-copy True", out)
            self.assertIn("secure=True", out)
            self.assertIn("run finished", out)
            self.assertNotIn("training failed", out)
        self.assertEqual(native.wait(30), 0, native.output())
        table = run.status()
        self.assertEqual(table.count(" secagg+ "), ROUNDS, table)
        rounds = run.rounds()
        self.assertEqual(sorted(rounds), list(range(1, ROUNDS + 1)))
        for row in rounds.values():
            self.assertEqual(row["aggregation"], "secagg+", row)
            self.assertEqual(row["outcome"], "committed", row)
            self.assertEqual(row["participants"], 4, row)  # Every client in the sum.


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
