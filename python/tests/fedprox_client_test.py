"""FedProx and L2 norm bounding end to end (issue 34): a secure run with
train.proximal_mu and secagg.l2_clip, three Python clients training a
PyTorch MLP with cohort.torch.fit_loop(..., mu=task.proximal_mu) and one
native `cohort client`, CURVE and SecAgg+, on 127.0.0.1."""

import os
import sys
import unittest

from harness import Run, cohort_bin

ROUNDS = 2


class FedProxRunTest(unittest.TestCase):
    def test_mu_reaches_every_client_and_every_update_is_norm_bounded(self):
        run = Run("fedprox")
        self.addCleanup(run.close)
        names = ["py-a", "py-b", "py-c", "native"]
        run.keygen(["coordinator"] + names, allow=names)
        run.cohort("partition", "--format", "synthetic", "--samples", "320", "--test-samples",
                   "200", "--features", "20", "--classes", "4", "--clients", "1", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        config = run.write_config(
            ROUNDS, "min_clients: 4 start_clients: 4 round_deadline_s: 60",
            extra=f'data {{ test_shard: "{run.path("shards/test.shard")}" }}\n'
                  "secagg { l2_clip: 0.01 }")
        with open(config) as f:
            text = f.read().replace("local_epochs: 1 }", "local_epochs: 1 proximal_mu: 0.25 }")
        with open(config, "w") as f:
            f.write(text)
        run.start_coordinator(config, curve=True)
        clients = [run.start_python_client(n, "--peers", run.path("allow"), curve=True)
                   for n in names[:3]]
        native = run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
                            run.path("shards/client-000.shard"), "--identity",
                            run.path("keys/native.key"), "--coordinator-key",
                            run.path("keys/coordinator.pub"), "--peers", run.path("allow")],
                           "native.log")
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients + [native]:
            self.assertEqual(c.wait(30), 0, c.output())
            # An epoch of training moves a model far more than 0.01: every
            # update of every round is scaled onto the bound before masking.
            for r in range(1, ROUNDS + 1):
                self.assertRegex(c.output(), f"round {r}: secagg.l2_clip 0.01 scaled the update "
                                             r"\(L2 norm [0-9.e+-]+\) by [0-9.e+-]+ before masking")
        for c in clients:
            for r in range(1, ROUNDS + 1):
                self.assertRegex(c.output(), f"fit round {r} zero-copy True Task\\(round={r}, .*"
                                             r"learning_rate=0\.05, proximal_mu=0\.25, ")
        rounds = run.rounds()
        self.assertEqual(sorted(rounds), list(range(1, ROUNDS + 1)))
        for r in rounds.values():
            self.assertEqual(r["aggregation"], "secagg+", r)
            self.assertEqual(r["participants"], 4, r)


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
