"""`cohort launch --nproc N -- PROGRAM ...`: a PyTorch script started once
per rank with torchrun's variables, so DDP over the `cohort` backend runs
under Cohort's own launcher; a rank that fails stops the group and is named."""

import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = "/usr/bin/python3"


def launch(*args, timeout=120):
    out = subprocess.run([os.environ["COHORT_BIN"], "launch", *args], capture_output=True,
                         text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return out.returncode, out.stdout + out.stderr


class LaunchPythonTest(unittest.TestCase):
    def test_each_rank_gets_torchruns_variables(self):
        code, out = launch("--nproc", "3", "--", PY, "-c",
                           # One write per line: the ranks share the pipe.
                           "import os; os.write(1, ('rank ' + ' '.join(os.environ[k] for k in "
                           "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', "
                           "'MASTER_ADDR', 'MASTER_PORT')) + '\\n').encode())")
        self.assertEqual(code, 0, out)
        lines = sorted(re.findall(r"^rank (\d) (\d) 3 3 127\.0\.0\.1 (\d+)$", out, re.M))
        self.assertEqual([(r, lr) for r, lr, _ in lines], [("0", "0"), ("1", "1"), ("2", "2")],
                         out)
        self.assertEqual(len({port for _, _, port in lines}), 1, out)  # One rendezvous.

    def test_the_ddp_example_trains_over_the_cohort_backend(self):
        code, out = launch("--nproc", "2", "--", PY,
                           os.path.join(ROOT, "examples", "python", "ddp_pytorch.py"),
                           "--backend", "cohort", "--epochs", "1")
        self.assertEqual(code, 0, out)
        self.assertRegex(out, r"epoch 1: loss [0-9.]+, accuracy [0-9.]+ \(cohort, 2 ranks")

    def test_a_failing_rank_stops_the_group_and_is_named(self):
        code, out = launch("--nproc", "2", "--", PY, "-c",
                           "import os, sys, time\n"
                           "if os.environ['RANK'] == '1': sys.exit(3)\n"
                           "time.sleep(600)\n")  # Rank 0 waits: the launcher stops it.
        self.assertNotEqual(code, 0, out)
        self.assertIn("rank 1 exited with status 3", out)
        code, out = launch("--nproc", "1", "--", "no-such-program-here")
        self.assertNotEqual(code, 0, out)
        self.assertIn("launch: cannot start no-such-program-here: No such file or directory", out)
        self.assertIn("rank 0 exited with status 127", out)

    def test_without_a_program_or_a_config_it_says_what_it_needs(self):
        code, out = launch("--nproc", "2")
        self.assertNotEqual(code, 0, out)
        self.assertIn("--config and --run-dir (cohort worker's), or a program after --", out)


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
