"""Issue 33, acceptance 5: a run directory that is damaged, of another kind,
or asked for what it does not hold gets a clear error from `cohort status`
and `cohort export` (a non-zero exit, a message that names the file and
what is wrong), and nothing in the directory changes: every file keeps its
bytes and its modification time.

  run_dir_bad_input_test.py COHORT_BINARY
"""

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Run, cohort_bin  # noqa: E402


def snapshot(directory):
    """Each file's bytes (digest), size and modification time."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (
                    hashlib.sha256(f.read()).hexdigest(), st.st_size, st.st_mtime_ns)
    return out


class RunDirBadInputTest(unittest.TestCase):
    maxDiff = None
    @classmethod
    def setUpClass(cls):
        cls.fixture = Run("run-dir-bad-input")
        run = cls.fixture
        run.cohort("partition", "--format", "synthetic", "--samples", "400", "--test-samples",
                   "100", "--features", "20", "--classes", "4", "--clients", "4", "--seed", "1",
                   "--out", run.path("shards"))
        config = run.write_config(2, "min_clients: 4 start_clients: 4",
                                  extra=f'data {{ test_shard: "{run.path("shards/test.shard")}" }} '
                                        'secagg { aggregation: PLAIN }')
        run.cohort("simulate", "--config", config, "--run-dir", run.path("run"), "--shards",
                   run.path("shards"))
        cls.db = run.path("run/run.db")

    @classmethod
    def tearDownClass(cls):
        cls.fixture.close()

    def damaged_copy(self, name, damage):
        """A copy of the good run directory, its run.db passed to `damage`."""
        directory = self.fixture.path(name)
        shutil.copytree(self.fixture.path("run"), directory)
        damage(os.path.join(directory, "run.db"))
        return directory

    def refused(self, args, *needles):
        """Runs cohort ARGS, which must fail saying every needle; the run
        directory (after --run-dir) must be as it was."""
        directory = args[args.index("--run-dir") + 1]
        before = snapshot(directory)
        p = subprocess.run([cohort_bin(), *args], capture_output=True, text=True, timeout=60)
        said = p.stdout + p.stderr
        self.assertNotEqual(p.returncode, 0, said)
        for needle in needles:
            self.assertIn(needle, said)
        self.assertEqual(snapshot(directory), before, f"cohort {' '.join(args)} changed files")
        return said

    def every_reader(self, directory, *needles):
        out = self.fixture.path("out.model")
        for args in (["status"], ["status", "--json"], ["status", "--csv", "--clients"],
                     ["export", "--format", "npz", "-o", out],
                     ["export", "--format", "torch", "-o", out],
                     ["export", "--format", "onnx", "-o", out]):
            self.refused(args[:1] + ["--run-dir", directory] + args[1:], *needles)
            self.assertFalse(os.path.exists(out), args)

    def test_a_truncated_run_store_is_named_damaged(self):
        def truncate(path):
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 3)
        directory = self.damaged_copy("truncated", truncate)
        self.every_reader(directory, os.path.join(directory, "run.db"), "damaged")

    def test_an_overwritten_page_is_found_and_named(self):
        def overwrite(path):
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                f.seek(size // 2)
                f.write(b"garbage!" * 512)
        directory = self.damaged_copy("overwritten", overwrite)
        self.every_reader(directory, os.path.join(directory, "run.db"), "damaged")

    def test_a_file_that_is_not_sqlite_is_named(self):
        def replace(path):
            with open(path, "wb") as f:
                f.write(b"round,loss\n1,0.5\n" * 100)
        directory = self.damaged_copy("not-sqlite", replace)
        self.every_reader(directory, os.path.join(directory, "run.db"),
                          "not a Cohort run store (not an SQLite database)")

    def test_a_directory_of_another_kind_is_named(self):
        # cohort partition's output, and a directory of keys.
        self.every_reader(self.fixture.path("shards"), "run.db")
        os.makedirs(self.fixture.path("keys-only"), exist_ok=True)
        self.every_reader(self.fixture.path("keys-only"), "run.db")
        # An SQLite file that is some other program's.
        other = self.fixture.path("other-db")
        os.makedirs(other)
        db = sqlite3.connect(os.path.join(other, "run.db"))
        db.execute("CREATE TABLE notes (text TEXT)")
        db.commit()
        db.close()
        self.every_reader(other, "not a Cohort run store (it has no runs table)")

    def test_a_round_past_the_last_is_named(self):
        out = self.fixture.path("x.npz")
        self.refused(["export", "--run-dir", self.fixture.path("run"), "--round", "9", "--format",
                      "npz", "-o", out], "round 9 is past the last committed round, 2")
        self.assertFalse(os.path.exists(out))

    def test_a_format_the_model_cannot_take_is_named(self):
        # The run's stored config says the clients bring the model: Cohort
        # holds no graph of it for ONNX.
        def external(path):
            db = sqlite3.connect(path)
            db.execute("UPDATE runs SET config = ?", (
                'seed: 5 model { external { num_params: 204 layout { name: "w" shape: 204 } } }',))
            db.commit()
            db.close()
        directory = self.damaged_copy("external", external)
        out = self.fixture.path("x.onnx")
        self.refused(["export", "--run-dir", directory, "--format", "onnx", "-o", out],
                     "--format onnx: the run's model is the clients' own (model.external)")
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
