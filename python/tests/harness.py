"""Helpers for the Python client's integration tests: a real `cohort
coordinator` on 127.0.0.1 (port 0) and real Python client processes.

Synchronisation is on events (a line a process prints, its exit), never on
a sleep. Every wait is bounded.
"""

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FL_CLIENT = os.path.join(HERE, "fl_client.py")


def cohort_bin():
    """The cohort binary under test ($COHORT_BIN; the tests take it from argv[1])."""
    path = os.environ.get("COHORT_BIN")
    if not path:
        raise RuntimeError("set COHORT_BIN to build/cli/cohort")
    return path


class Process:
    """A child process with stdout and stderr merged, read line by line."""

    def __init__(self, argv, log_path, env=None):
        self.argv = argv
        self.log_path = log_path
        self.lines = []
        self._queue = queue.Queue()
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, needle, timeout=60):
        """The first unread line containing `needle`; None at EOF or timeout."""
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if needle in line:
                return line
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self._queue.put(None)
                return None
            self.lines.append(line)
            if needle in line:
                return line

    def wait(self, timeout=60):
        """Exit code (negative: killed by that signal); kills it at the timeout."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.argv[:3]} did not exit within {timeout} s")
        self._reader.join(timeout=10)
        self.wait_for_line("\0", timeout=0)  # Drain what is queued.
        while not self._queue.empty():
            line = self._queue.get()
            if line is not None:
                self.lines.append(line)
        return code

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        """Kills it if it still runs; closes its pipe and log."""
        self.kill()
        self._reader.join(timeout=10)
        self.proc.stdout.close()
        self._log.close()


class Run:
    """A temporary directory with a coordinator and its clients."""

    def __init__(self, tag):
        self.dir = tempfile.mkdtemp(prefix=f"cohort-py-{tag}-")
        self.processes = []
        self.coordinator = None
        self.endpoint = None

    def close(self):
        for p in self.processes:
            p.close()
        if os.environ.get("COHORT_KEEP_TEST_DIRS"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def cohort(self, *args):
        """Runs a cohort subcommand to completion; returns its output."""
        out = subprocess.run([cohort_bin(), *args], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"cohort {' '.join(args)}: {out.stdout}{out.stderr}")
        return out.stdout

    def keygen(self, names, allow=None):
        """Identity keys under keys/; `allow` (names) copied to allow/."""
        for name in names:
            self.cohort("keygen", "--out", self.path("keys"), "--name", name)
        os.makedirs(self.path("allow"), exist_ok=True)
        for name in allow or []:
            shutil.copy(self.path(f"keys/{name}.pub"), self.path(f"allow/{name}.pub"))

    def write_config(self, rounds, rounds_extra="", extra="", hidden=8):
        """An mlp of 20 features, `hidden` units and 4 classes:
        20*h + h + 4*h + 4 parameters (204 for h=8)."""
        path = self.path("run.textproto")
        with open(path, "w") as f:
            f.write("seed: 5\n"
                    f"model {{ arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: {hidden} }}\n"
                    "train { batch_size: 16 learning_rate: 0.05 local_epochs: 1 }\n"
                    "net { heartbeat_s: 0.5 }\n"
                    f"rounds {{ num_rounds: {rounds} {rounds_extra} }}\n{extra}\n")
        return path

    def start_coordinator(self, config, curve=False, extra=()):
        argv = [cohort_bin(), "coordinator", "--config", config, "--run-dir", self.path("run"),
                "--bind", "tcp://127.0.0.1:0", *extra]
        if curve:
            argv += ["--identity", self.path("keys/coordinator.key"), "--allow",
                     self.path("allow")]
        else:
            argv.append("--insecure")
        self.coordinator = self.spawn(argv, "coordinator.log")
        line = self.coordinator.wait_for_line("coordinator listening on ")
        if line is None:
            raise AssertionError("coordinator did not start:\n" + self.coordinator.output())
        self.endpoint = line.rsplit(" ", 1)[1]
        return self.endpoint

    def spawn(self, argv, log_name):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        p = Process(argv, self.path(log_name), env=env)
        self.processes.append(p)
        return p

    def start_python_client(self, name, *args, curve=False):
        argv = [sys.executable, FL_CLIENT, "--coordinator", self.endpoint, "--name", name]
        if curve:
            argv += ["--identity", self.path(f"keys/{name}.key"), "--coordinator-key",
                     self.path("keys/coordinator.pub")]
        else:
            argv.append("--insecure")
        return self.spawn(argv + list(args), f"{name}.log")

    def status(self):
        """`cohort status`: the table a user reads."""
        return self.cohort("status", "--run-dir", self.path("run"))

    def rounds(self):
        """`cohort status --json`: one dict per round, by round number."""
        out = self.cohort("status", "--run-dir", self.path("run"), "--json")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return {r["round"]: r for r in rows}


