"""cohort.torch.fit_loop's FedProx term (mu, the task's proximal_mu) against
tests/data/fedprox_golden.txt, the vectors Cohort's C++ engine matches too
(train/fedprox_test.cc), and what a user sees for a bad mu."""

import math
import os
import unittest

import torch

import cohort
import cohort.torch as ct

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data",
                      "fedprox_golden.txt")


def read_golden():
    g = {"cases": []}
    with open(GOLDEN) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] in ("start", "features"):
                g[words[0]] = [float(v) for v in words[1:]]
            elif words[0] == "labels":
                g["labels"] = [int(v) for v in words[1:]]
            elif words[0] == "case":
                name, kind, lr, wd, momentum, mu = words[1:]
                g["cases"].append(dict(name=name, kind=kind, lr=float(lr), wd=float(wd),
                                       momentum=float(momentum), mu=float(mu), steps=[]))
            elif words[0] == "step":
                g["cases"][-1]["steps"].append([float(v) for v in words[2:]])
    return g


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


class FedProxFitLoopTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.g = read_golden()
        x = torch.tensor(cls.g["features"], dtype=torch.float32).reshape(8, 6)
        y = torch.tensor(cls.g["labels"])
        # The golden batches: samples 0-3, 4-7, 0-3, 4-7 (two epochs of two).
        cls.loader = [(x[0:4], y[0:4]), (x[4:8], y[4:8])]

    def train(self, case, mu):
        net = mlp()
        ct.set_flat(net, self.g["start"])
        if case["kind"] == "adam":
            opt = torch.optim.Adam(net.parameters(), lr=case["lr"], weight_decay=case["wd"])
        else:
            opt = torch.optim.SGD(net.parameters(), lr=case["lr"], momentum=case["momentum"],
                                  weight_decay=case["wd"])
        n, metrics = ct.fit_loop(net, self.loader, opt, 2, mu=mu)
        self.assertEqual(n, 8)
        self.assertFalse(math.isnan(metrics["loss"]))
        return ct.get_flat(net)

    def test_fit_loop_with_mu_matches_the_golden_vectors(self):
        # Tolerance 2e-6 x max(1, |value|), as train/fedprox_test.cc's.
        self.assertEqual(len(self.g["cases"]), 4)
        for case in self.g["cases"]:
            got = self.train(case, case["mu"])
            want = case["steps"][-1]
            self.assertEqual(len(got), len(want))
            for i, (a, b) in enumerate(zip(got, want)):
                self.assertLessEqual(abs(a - b), 2e-6 * max(1.0, abs(b)),
                                     f"{case['name']}, parameter {i}: {a} != {b}")

    def test_mu_zero_trains_exactly_as_without_it(self):
        case = self.g["cases"][1]
        net_a, net_b = mlp(), mlp()
        for net in (net_a, net_b):
            ct.set_flat(net, self.g["start"])
        opt_a = torch.optim.SGD(net_a.parameters(), lr=0.1, momentum=0.9)
        opt_b = torch.optim.SGD(net_b.parameters(), lr=0.1, momentum=0.9)
        # A plain PyTorch loop against fit_loop at mu 0 (fit_loop's default is
        # 0 too, so comparing two fit_loop calls would show nothing).
        net_a.train()
        for _ in range(2):
            for x, y in self.loader:
                opt_a.zero_grad()
                torch.nn.functional.cross_entropy(net_a(x), y).backward()
                opt_a.step()
        ct.fit_loop(net_b, self.loader, opt_b, 2, mu=0.0)
        self.assertEqual(ct.get_flat(net_a).tobytes(), ct.get_flat(net_b).tobytes())
        self.assertNotEqual(self.train(case, 0.0).tobytes(), self.train(case, 0.5).tobytes())

    def test_a_bad_mu_is_a_value_error_naming_the_field(self):
        net = mlp()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for mu in (-0.1, float("nan"), float("inf")):
            with self.assertRaises(ValueError) as e:
                ct.fit_loop(net, self.loader, opt, 1, mu=mu)
            self.assertIn("fit_loop: mu (train.proximal_mu) must be finite and >= 0",
                          str(e.exception))

    def test_the_task_carries_proximal_mu(self):
        self.assertIn("proximal_mu", dir(cohort.Task))


if __name__ == "__main__":
    unittest.main()
