"""A model the coordinator does not know (model.external): the run starts
from --initial-model's .npz, resumes without it, and every way to get it
wrong is an error that names what was wrong. Real coordinators and Python
clients (NumPy stand-ins: the protocol is under test, not PyTorch) on
127.0.0.1."""

import os
import signal
import sys
import unittest

import numpy as np

from harness import Run, cohort_bin

# conv.weight (2, 3), conv.bias (2,), and BatchNorm's integer counter, which
# does not travel: 8 values.
NUM_PARAMS = 8


def write_initial(path, extra=None):
    arrays = {"conv.weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
              "conv.bias": np.array([0.5, -1.5], np.float32),
              "bn.num_batches_tracked": np.array(7, np.int64)}
    arrays.update(extra or {})
    np.savez(path, **arrays)


def external_config(run, rounds, num_params=NUM_PARAMS, extra=""):
    path = run.path("run.textproto")
    with open(path, "w") as f:
        f.write("seed: 1\n"
                f"model {{ external {{ num_params: {num_params}\n"
                '  layout { name: "conv.weight" shape: 2 shape: 3 }\n'
                '  layout { name: "conv.bias" shape: 2 } } }\n'
                "net { heartbeat_s: 0.5 }\n"
                f"rounds {{ num_rounds: {rounds} min_clients: 3 start_clients: 3 "
                "round_deadline_s: 60 }\n"
                f"secagg {{ aggregation: PLAIN }}\n{extra}")
    return path


def expected_init():
    return np.concatenate([np.arange(6, dtype=np.float32) / 4, [0.5, -1.5]]).astype(np.float32)


class ExternalModelTest(unittest.TestCase):
    def clients(self, run, dump=True):
        return [run.start_python_client(
            f"c{i}", "--numpy", "--num-params", str(NUM_PARAMS),
            *(["--dump-params", run.path(f"c{i}")] if dump else []), "--plain")
            for i in range(3)]

    def test_the_run_starts_from_the_initial_model_and_resumes_without_it(self):
        run = Run("external")
        self.addCleanup(run.close)
        write_initial(run.path("init.npz"))
        config = external_config(run, 2)
        run.start_coordinator(config, extra=["--initial-model", run.path("init.npz")])
        clients = self.clients(run)
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients:
            self.assertEqual(c.wait(30), 0, c.output())
        # Round 1 starts from the .npz, in the layout's order; each NumPy
        # client returns params * 0.99, so round 2 starts from their mean.
        init = expected_init()
        for i in range(3):
            np.testing.assert_array_equal(np.load(run.path(f"c{i}-1.npy")), init)
            np.testing.assert_allclose(np.load(run.path(f"c{i}-2.npy")), init * 0.99, rtol=1e-6)
        self.assertEqual(sorted(run.rounds()), [1, 2])

        # Extended by a round: it resumes from round 2's model, no .npz needed.
        run.coordinator.close()
        run.start_coordinator(config, extra=["--rounds", "3"])
        self.assertIsNotNone(run.coordinator.wait_for_line("resuming run after committed round 2"))
        clients = self.clients(run)
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients:
            self.assertEqual(c.wait(30), 0, c.output())
        np.testing.assert_allclose(np.load(run.path("c0-3.npy")), init * 0.99 ** 2, rtol=1e-6)
        self.assertEqual(sorted(run.rounds()), [1, 2, 3])

        # cohort export (issue 33): the layout's names and shapes, the last model.
        import torch
        run.cohort("export", "--run-dir", run.path("run"), "-o", run.path("model.pt"))
        state = torch.load(run.path("model.pt"))
        self.assertEqual(list(state), ["conv.weight", "conv.bias"])
        self.assertEqual(tuple(state["conv.weight"].shape), (2, 3))
        final = init * 0.99 ** 3
        np.testing.assert_allclose(state["conv.weight"].numpy().ravel(), final[:6], rtol=1e-6)
        np.testing.assert_allclose(state["conv.bias"].numpy(), final[6:], rtol=1e-6)
        p = run.spawn([cohort_bin(), "export", "--run-dir", run.path("run"), "--format", "onnx",
                       "-o", run.path("model.onnx")], "export.log")
        self.assertNotEqual(p.wait(30), 0)
        self.assertIn("--format onnx: the run's model is the clients' own", p.output())
        self.assertFalse(os.path.exists(run.path("model.onnx")))

    def coordinator_error(self, run, config, *extra):
        p = run.spawn([cohort_bin(), "coordinator", "--config", config, "--run-dir",
                       run.path("run"), "--bind", "tcp://127.0.0.1:0", "--insecure", *extra],
                      f"coordinator-{len(run.processes)}.log")
        self.assertNotEqual(p.wait(60), 0, p.output())
        return p.output()

    def test_every_wrong_initial_model_is_named(self):
        run = Run("external-bad")
        self.addCleanup(run.close)
        write_initial(run.path("init.npz"))
        config = external_config(run, 1)
        out = self.coordinator_error(run, config)
        self.assertIn("--initial-model: a new run of a model the clients bring (model.external) "
                      "starts from its initial values", out)
        # A layout tensor the file lacks; one of another shape.
        np.savez(run.path("short.npz"), **{"conv.weight": np.zeros((2, 3), np.float32)})
        out = self.coordinator_error(run, config, "--initial-model", run.path("short.npz"))
        self.assertIn("holds no array 'conv.bias' (model.external.layout names it)", out)
        np.savez(run.path("shape.npz"), **{"conv.weight": np.zeros((3, 2), np.float32),
                                            "conv.bias": np.zeros(2, np.float32)})
        out = self.coordinator_error(run, config, "--initial-model", run.path("shape.npz"))
        self.assertIn("array 'conv.weight' has shape (3, 2); model.external.layout says (2, 3)",
                      out)
        # Without a layout, the floating arrays' total must be num_params.
        no_layout = run.path("nolayout.textproto")
        with open(no_layout, "w") as f:
            f.write("model { external { num_params: 10 } }\n")
        out = self.coordinator_error(run, no_layout, "--initial-model", run.path("init.npz"))
        self.assertIn("init.npz holds 8 values (floating-point arrays); the run's model has 10 "
                      "(model.external.num_params)", out)
        write_initial(run.path("nan.npz"), {"conv.bias": np.array([0.5, np.nan], np.float32)})
        out = self.coordinator_error(run, config, "--initial-model", run.path("nan.npz"))
        self.assertIn("array 'conv.bias' value 1 is not finite", out)
        with open(run.path("model.pt"), "wb") as f:
            f.write(b"\x80\x02not a zip")
        out = self.coordinator_error(run, config, "--initial-model", run.path("model.pt"))
        self.assertIn("not an .npz (a zip of .npy arrays", out)
        out = self.coordinator_error(run, config, "--initial-model", run.path("missing.npz"))
        self.assertIn("--initial-model: File does not exist", out)
        # Cohort's own models start from the seed.
        native = run.write_config(1)
        out = self.coordinator_error(run, native, "--initial-model", run.path("init.npz"))
        self.assertIn("--initial-model: only a model the clients bring (model.external) takes one",
                      out)

    def test_clients_that_cannot_run_the_model_are_refused_with_both_sizes(self):
        run = Run("external-clients")
        self.addCleanup(run.close)
        write_initial(run.path("init.npz"))
        run.start_coordinator(external_config(run, 1),
                              extra=["--initial-model", run.path("init.npz")])
        # A Python client whose model has another size.
        other = run.start_python_client("other", "--numpy", "--num-params", "9", "--plain")
        self.assertNotEqual(other.wait(60), 0, other.output())
        self.assertIn("the coordinator's model has 8 parameters; this client's has 9", other.output())
        # The native client cannot build it, and says who can.
        run.cohort("partition", "--format", "synthetic", "--samples", "40", "--features", "4",
                   "--classes", "2", "--clients", "1", "--test-samples", "0", "--out",
                   run.path("shards"))
        native = run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--insecure",
                            "--data", run.path("shards/client-000.shard")], "native.log")
        self.assertNotEqual(native.wait(60), 0, native.output())
        self.assertIn("model.external: the run's model is the clients' own (a PyTorch model "
                      "behind cohort.Client)", native.output())
        run.coordinator.signal(signal.SIGINT)
        run.coordinator.wait(30)

    def test_simulate_refuses_a_model_the_clients_bring(self):
        run = Run("external-sim")
        self.addCleanup(run.close)
        p = run.spawn([cohort_bin(), "simulate", "--config", external_config(run, 1),
                       "--run-dir", run.path("run"), "--shards", run.path("shards")], "sim.log")
        self.assertNotEqual(p.wait(60), 0, p.output())
        self.assertIn("simulate: model.external is not simulated", p.output())


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
