"""cohort.run_model.load_run (issue 32, item 6; acceptance 5, the round trip).

A real LeNet-5 run on a slice of Fashion-MNIST (a coordinator and client
processes on 127.0.0.1, port 0), loaded into PyTorch: its test accuracy is
what `cohort status` reports. The layouts are checked against Cohort's own
forward pass on layer lists where the permutations matter, and bad input
gets errors that name it.

    python3 test_load_run.py PATH/TO/cohort   (PYTHONPATH=build/python)
"""

import gzip
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

from cohort._client import model as _model
from cohort.run_model import load_run, load_shard, sequential

COHORT = sys.argv[1] if len(sys.argv) > 1 else "build/cli/cohort"
FMNIST = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")

CONFIG = """
name: "load-run-test"
seed: 0
mode: FEDERATED
data {{ test_shard: "{test_shard}" }}
model {{ arch: "lenet5" }}
train {{ local_epochs: 3 batch_size: 16 learning_rate: 0.05 }}
rounds {{ num_rounds: 3 start_clients: 3 min_clients: 3 keep_checkpoints: 2 }}
secagg {{ aggregation: PLAIN }}
"""


def write_idx_slice(src_dir, out_dir, name, count):
    """The first `count` items of an IDX file as a plain IDX file."""
    with gzip.open(os.path.join(src_dir, name + ".gz"), "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    item = int(np.prod(shape[1:], dtype=np.int64)) if dims > 1 else 1
    body = data[4 + 4 * dims:4 + 4 * dims + count * item]
    path = os.path.join(out_dir, name)
    with open(path, "wb") as f:
        f.write(data[:4] + struct.pack(">I", count) + data[8:4 + 4 * dims] + body)
    return path


def run(*args, **kwargs):
    return subprocess.run([COHORT, *args], check=True, capture_output=True,
                          text=True, **kwargs)


def start_coordinator(config_path, run_dir):
    """A coordinator on 127.0.0.1:0; returns it once it has announced its
    endpoint (its run store then holds round 0)."""
    proc = subprocess.Popen(
        [COHORT, "coordinator", "--config", config_path, "--run-dir", run_dir,
         "--bind", "tcp://127.0.0.1:0", "--insecure"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("coordinator listening on "):
        proc.kill()
        raise RuntimeError(f"coordinator did not start: {line!r}")
    return proc, line.split()[-1]


def status_rounds(run_dir):
    out = run("status", "--run-dir", run_dir, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def evaluate(model, x, y):
    """Accuracy and mean cross-entropy of `model` on (x, y), in PyTorch."""
    with torch.no_grad():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
        correct = (logits.argmax(1) == y).sum().item()
    return correct / len(y), loss.item() / len(y)


def run_onnx(proto, x):
    """The ONNX graph's output for input x: each node as its ONNX operator
    means it (attributes and initializers read from the file)."""
    from onnx import numpy_helper
    F = torch.nn.functional
    values = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy())
              for i in proto.graph.initializer}
    values[proto.graph.input[0].name] = x
    for node in proto.graph.node:
        a = {at.name: list(at.ints) if at.ints else at.i for at in node.attribute}
        args = [values[name] for name in node.input]
        if node.op_type == "Conv":
            p = a["pads"]
            assert p[0] == p[2] and p[1] == p[3]
            out = F.conv2d(args[0], args[1], args[2], stride=a["strides"], padding=p[:2])
        elif node.op_type == "MaxPool":
            out = F.max_pool2d(args[0], a["kernel_shape"], a["strides"])
        elif node.op_type == "Relu":
            out = F.relu(args[0])
        elif node.op_type == "Flatten":
            out = args[0].flatten(a["axis"])
        elif node.op_type == "Gemm":
            w = args[1].t() if a.get("transB") else args[1]
            out = args[0] @ w + args[2]
        else:
            raise AssertionError(f"unexpected node {node.op_type}")
        values[node.output[0]] = out
    return values[proto.graph.output[0].name]


class RoundTripTest(unittest.TestCase):
    """One federated LeNet-5 run, shared by the tests below."""

    @classmethod
    def setUpClass(cls):
        if not os.path.isdir(FMNIST):
            raise unittest.SkipTest(f"{FMNIST}: no Fashion-MNIST here")
        cls.tmp = tempfile.mkdtemp(prefix="cohort_load_run_")
        raw = os.path.join(cls.tmp, "raw")
        os.makedirs(raw)
        idx = {}
        for name, count in [("train-images-idx3-ubyte", 1500),
                            ("train-labels-idx1-ubyte", 1500),
                            ("t10k-images-idx3-ubyte", 1000),
                            ("t10k-labels-idx1-ubyte", 1000)]:
            idx[name] = write_idx_slice(FMNIST, raw, name, count)
        shards = os.path.join(cls.tmp, "shards")
        run("partition", "--format", "idx",
            "--train-images", idx["train-images-idx3-ubyte"],
            "--train-labels", idx["train-labels-idx1-ubyte"],
            "--test-images", idx["t10k-images-idx3-ubyte"],
            "--test-labels", idx["t10k-labels-idx1-ubyte"],
            "--clients", "3", "--scheme", "iid", "--seed", "0",
            "--out", shards)
        cls.test_shard = os.path.join(shards, "test.shard")
        cls.config = os.path.join(cls.tmp, "run.textproto")
        with open(cls.config, "w") as f:
            f.write(CONFIG.format(test_shard=cls.test_shard))
        cls.run_dir = os.path.join(cls.tmp, "run")
        coordinator, endpoint = start_coordinator(cls.config, cls.run_dir)
        clients = [subprocess.Popen(
            [COHORT, "client", "--coordinator", endpoint, "--insecure",
             "--data", os.path.join(shards, f"client-{k:03d}.shard")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for k in range(3)]
        try:
            coordinator.communicate(timeout=120)  # Drains its stdout.
            if coordinator.returncode != 0:
                raise RuntimeError("the coordinator failed")
        finally:
            for p in clients + [coordinator]:
                if p.poll() is None:
                    p.kill()
                p.wait()
        cls.rounds = status_rounds(cls.run_dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_loaded_model_has_the_accuracy_cohort_status_reports(self):
        model = load_run(self.run_dir)
        self.assertEqual(model.cohort_round, 3)
        self.assertIsInstance(model, torch.nn.Sequential)
        self.assertEqual(
            [type(m).__name__ for m in model],
            ["Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d",
             "Flatten", "Linear", "ReLU", "Linear", "ReLU", "Linear"])
        self.assertEqual(tuple(model.state_dict()["3.weight"].shape),
                         (16, 6, 5, 5))
        x, y = load_shard(self.test_shard, model.cohort_input_shape)
        self.assertEqual(tuple(x.shape), (1000, 1, 28, 28))
        accuracy, loss = evaluate(model, x, y)
        last = self.rounds[-1]
        self.assertEqual(last["round"], 3)
        print(f"round 3: cohort status test_accuracy {last['test_accuracy']:.6f}"
              f" test_loss {last['test_loss']:.6f}; PyTorch {accuracy:.6f}"
              f" {loss:.6f}", file=sys.stderr)
        self.assertAlmostEqual(accuracy, last["test_accuracy"], delta=1e-4)
        self.assertAlmostEqual(loss, last["test_loss"], delta=1e-4)

    def test_an_earlier_kept_round_loads_with_its_own_accuracy(self):
        model = load_run(self.run_dir, round=2)
        self.assertEqual(model.cohort_round, 2)
        x, y = load_shard(self.test_shard, model.cohort_input_shape)
        accuracy, _ = evaluate(model, x, y)
        self.assertAlmostEqual(accuracy, self.rounds[1]["test_accuracy"],
                               delta=1e-4)
        last = load_run(self.run_dir).state_dict()["0.weight"]
        self.assertFalse(torch.equal(model.state_dict()["0.weight"], last))
        # cohort.torch.load_run is the same loader, beside get_flat and set_flat.
        import cohort.torch
        again = cohort.torch.load_run(self.run_dir, round=2).state_dict()["0.weight"]
        self.assertTrue(torch.equal(model.state_dict()["0.weight"], again))

    def test_cohort_export_loads_into_pytorch_with_the_reported_accuracy(self):
        # Issue 33: `cohort export --format torch` is torch.load-able, and
        # load_state_dict into the same nn.Sequential gives status's accuracy.
        x, y = load_shard(self.test_shard, (1, 28, 28))
        last = self.rounds[-1]
        for fmt in ("torch", "npz"):
            out = os.path.join(self.tmp, f"model.{fmt}")
            printed = run("export", "--run-dir", self.run_dir, "--format", fmt, "-o", out).stdout
            self.assertIn(f"wrote {out}: round 3 of {self.run_dir}, 10 tensors", printed)
            if fmt == "torch":
                state = torch.load(out)
            else:
                with np.load(out) as npz:
                    state = {k: torch.from_numpy(npz[k]) for k in npz.files}
            model = load_run(self.run_dir)
            reference = {k: v.clone() for k, v in model.state_dict().items()}
            self.assertEqual(list(state), list(reference))
            for k, v in state.items():
                self.assertTrue(torch.equal(v, reference[k]), k)
            model.load_state_dict(state)
            accuracy, loss = evaluate(model, x, y)
            self.assertAlmostEqual(accuracy, last["test_accuracy"], delta=1e-4)
            self.assertAlmostEqual(loss, last["test_loss"], delta=1e-4)
        # An earlier kept round; the run directory is left as it was.
        before = sorted((f, os.path.getsize(os.path.join(self.run_dir, f)))
                        for f in os.listdir(self.run_dir))
        out = os.path.join(self.tmp, "round2.pt")
        run("export", "--run-dir", self.run_dir, "--round", "2", "-o", out)
        self.assertTrue(torch.equal(torch.load(out)["0.weight"],
                                    load_run(self.run_dir, round=2).state_dict()["0.weight"]))
        after = sorted((f, os.path.getsize(os.path.join(self.run_dir, f)))
                       for f in os.listdir(self.run_dir))
        self.assertEqual(before, after)

    def test_the_onnx_export_checks_and_runs_to_the_reported_accuracy(self):
        # Debian 12's python3-onnx (1.12) has no reference evaluator (onnx >=
        # 1.13): onnx.checker checks the model, and run_onnx below interprets
        # its graph, node by node, from the ONNX file alone.
        import onnx
        out = os.path.join(self.tmp, "model.onnx")
        run("export", "--run-dir", self.run_dir, "--format", "onnx", "-o", out)
        proto = onnx.load(out)
        onnx.checker.check_model(proto, full_check=True)
        self.assertEqual([n.op_type for n in proto.graph.node],
                         ["Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool", "Flatten",
                          "Gemm", "Relu", "Gemm", "Relu", "Gemm"])
        x, y = load_shard(self.test_shard, (1, 28, 28))
        logits = run_onnx(proto, x)
        self.assertEqual(tuple(logits.shape), (len(y), 10))
        with torch.no_grad():
            reference = load_run(self.run_dir)(x)
        self.assertLess((logits - reference).abs().max().item(), 1e-4)
        accuracy = (logits.argmax(1) == y).float().mean().item()
        self.assertAlmostEqual(accuracy, self.rounds[-1]["test_accuracy"], delta=1e-4)

    def test_cohort_export_names_what_is_wrong(self):
        def error(*args):
            p = subprocess.run([COHORT, "export", *args], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            return p.stdout + p.stderr
        out = os.path.join(self.tmp, "x.pt")
        self.assertIn("round 4 is past the last committed round, 3",
                      error("--run-dir", self.run_dir, "--round", "4", "-o", out))
        self.assertIn("round 1's model was not kept",
                      error("--run-dir", self.run_dir, "--round", "1", "-o", out))
        self.assertIn("--format: onnx5 not in {torch,npz,onnx}",
                      error("--run-dir", self.run_dir, "--format", "onnx5", "-o", out))
        self.assertIn("run.db", error("--run-dir", os.path.join(self.tmp, "shards"), "-o", out))
        self.assertIn("cannot write", error("--run-dir", self.run_dir, "-o",
                                            os.path.join(self.tmp, "no", "such", "dir", "x.pt")))
        self.assertFalse(os.path.exists(out))

    def test_a_round_past_the_last_or_not_kept_is_named(self):
        with self.assertRaisesRegex(
                LookupError, "round 4 is past the last committed round, 3"):
            load_run(self.run_dir, round=4)
        # keep_checkpoints: 2 keeps rounds 2 and 3.
        with self.assertRaisesRegex(
                LookupError, "round 1's model was not kept.*rounds 2 and 3"):
            load_run(self.run_dir, round=1)
        with self.assertRaisesRegex(TypeError, "round must be an int"):
            load_run(self.run_dir, round="3")

    def test_a_missing_directory_or_run_store_is_named(self):
        missing = os.path.join(self.tmp, "no-such-run")
        with self.assertRaisesRegex(FileNotFoundError,
                                    f"{missing}: no such run directory"):
            load_run(missing)
        with self.assertRaisesRegex(FileNotFoundError,
                                    "no run database \\(run.db\\)"):
            load_run(os.path.join(self.tmp, "shards"))

    def test_a_model_the_clients_bring_is_refused_naming_model_external(self):
        other = os.path.join(self.tmp, "external")
        os.makedirs(other)
        shutil.copy(os.path.join(self.run_dir, "run.db"), other)
        db = sqlite3.connect(os.path.join(other, "run.db"))
        (text,) = db.execute("SELECT config FROM runs").fetchone()
        start = text.index("model {")
        end = text.index("\n}\n", start) + 3
        n = _model.num_params(text)
        text = (text[:start] + f"model {{\n  external {{\n    num_params: {n}\n  }}\n}}\n"
                + text[end:])
        db.execute("UPDATE runs SET config = ?", (text,))
        db.commit()
        db.close()
        with self.assertRaisesRegex(ValueError, "model.external"):
            load_run(other)

    def test_a_run_without_a_committed_round_is_named_while_its_coordinator_holds_the_lock(self):
        run_dir = os.path.join(self.tmp, "waiting")
        coordinator, _ = start_coordinator(self.config, run_dir)
        try:
            # The coordinator waits for clients, holding RUN_DIR/LOCK.
            with self.assertRaisesRegex(LookupError,
                                        "committed no round yet"):
                load_run(run_dir)
            initial = load_run(run_dir, round=0)
            self.assertEqual(initial.cohort_round, 0)
        finally:
            coordinator.kill()
            coordinator.communicate()


# Layer lists where both permutations matter: several channels into a conv,
# stride and padding, a flatten of a multi-channel image.
TWO_CONVS = """
model {
  input_shape { channels: 3 height: 9 width: 8 }
  num_classes: 5
  layers { conv2d { out_channels: 4 kernel_size: 3 padding: 1 } }
  layers { relu {} }
  layers { conv2d { out_channels: 6 kernel_size: 2 stride: 2 } }
  layers { max_pool2d { kernel_size: 2 stride: 1 } }
  layers { flatten {} }
  layers { linear { out_features: 7 } }
  layers { relu {} }
  layers { linear { out_features: 5 } }
}
"""
MLP = 'model { arch: "mlp" input_dim: 12 hidden: 6 hidden: 5 num_classes: 3 }'


class LayoutTest(unittest.TestCase):
    def check_against_cohort(self, config, features):
        rng = np.random.default_rng(7)
        n = _model.num_params(config)
        flat = rng.normal(0, 0.5, n).astype(np.float32)
        model = sequential(_model.to_torch(config, flat))
        x = rng.normal(0, 1, (11, features)).astype(np.float32)
        expected = _model.native_logits(config, flat, x)
        with torch.no_grad():
            got = model(torch.from_numpy(x).reshape(11, *model.cohort_input_shape))
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4)
        torch_order = np.concatenate(
            [t.detach().numpy().ravel() for t in model.state_dict().values()])
        np.testing.assert_array_equal(_model.from_torch(config, torch_order), flat)

    def test_two_convolutions_of_several_channels_match_cohorts_forward_pass(self):
        self.check_against_cohort(TWO_CONVS, 3 * 9 * 8)

    def test_an_mlp_matches_cohorts_forward_pass(self):
        self.check_against_cohort(MLP, 12)

    def test_cohort_export_of_each_kind_of_model_gives_cohorts_forward_pass(self):
        # Issue 33: the export of a two-conv layer list, an MLP and logreg
        # (round 0 of a run, the seeded initial model) in torch and ONNX
        # computes Cohort's own logits.
        import onnx
        logreg = 'model { arch: "logreg" input_dim: 12 num_classes: 3 }'
        for config, features in ((TWO_CONVS, 3 * 9 * 8), (MLP, 12), (logreg, 12)):
            tmp = tempfile.mkdtemp(prefix="cohort_export_")
            self.addCleanup(shutil.rmtree, tmp, True)
            path = os.path.join(tmp, "run.textproto")
            with open(path, "w") as f:
                f.write(config + "\nrounds { num_rounds: 1 min_clients: 1 }\n"
                        "secagg { aggregation: PLAIN }\n")
            run_dir = os.path.join(tmp, "run")
            coordinator, _ = start_coordinator(path, run_dir)
            try:
                for fmt in ("torch", "onnx"):
                    run("export", "--run-dir", run_dir, "--round", "0", "--format", fmt,
                        "-o", os.path.join(tmp, "model." + fmt))
            finally:
                coordinator.kill()
                coordinator.communicate()
            flat = _model.read_flat(run_dir, 0)["flat"]
            model = sequential(_model.to_torch(config, flat))
            model.load_state_dict(torch.load(os.path.join(tmp, "model.torch")))
            x = np.random.default_rng(3).normal(0, 1, (11, features)).astype(np.float32)
            expected = _model.native_logits(config, flat, x)
            shaped = torch.from_numpy(x).reshape(11, *model.cohort_input_shape)
            with torch.no_grad():
                np.testing.assert_allclose(model(shaped).numpy(), expected, rtol=1e-4,
                                           atol=1e-4)
            proto = onnx.load(os.path.join(tmp, "model.onnx"))
            onnx.checker.check_model(proto, full_check=True)
            np.testing.assert_allclose(run_onnx(proto, shaped).numpy(), expected, rtol=1e-4,
                                       atol=1e-4)

    def test_a_vector_of_another_length_names_both_sizes(self):
        with self.assertRaisesRegex(
                ValueError, "model: 3 parameters given, the model has 131"):
            _model.to_torch(MLP, np.zeros(3, np.float32))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
