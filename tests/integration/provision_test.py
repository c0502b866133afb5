"""`cohort provision` kits run a federation (issue 35, acceptance 1 and 2).

A project of a coordinator and three sites is provisioned into a temporary
folder; the coordinator and the three clients are started from their kits'
own start.sh (one of them from its tarball, extracted elsewhere) on
127.0.0.1, and a SecAgg+ run over CURVE with --peers completes. Provisioning
again writes the same bytes; --add-site keeps every key. With a fourth site
in the federation, --revoke and a SIGHUP make the running coordinator refuse
the revoked client at once (both sides log it), the next round runs without
it, and SIGTERM stops the coordinator with its rounds committed. The
systemd units pass `systemd-analyze verify` and carry their hardening. Bad
inputs get errors a user can act on.

  /usr/bin/python3 tests/integration/provision_test.py build/cli/cohort

Synchronisation is on events (a printed line, a process's exit), each with
a bounded deadline; never a sleep.
"""

import csv
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from harness import Process, Run, cohort_bin  # noqa: E402

SITES = ["site-1", "site-2", "site-3"]
HARDENING = ["ProtectSystem=strict", "NoNewPrivileges=yes", "Restart=on-failure",
             "KillSignal=SIGTERM", "PrivateTmp=yes", "ProtectHome=yes", "User=cohort",
             "CapabilityBoundingSet=", "SystemCallFilter=@system-service"]


def file_mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def snapshot(root):
    """Every file under `root`: relative path -> bytes."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


def wait_after(process, predicate, start, timeout=90):
    """The first line at index >= `start` of `process`'s output that
    satisfies `predicate`, and its index; fails after `timeout` s or when
    the process ended without printing one."""
    deadline = time.monotonic() + timeout
    seen = start
    while True:
        for i in range(seen, len(process.lines)):
            if predicate(process.lines[i]):
                return i, process.lines[i]
        seen = max(seen, len(process.lines))
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no such line within {timeout} s:\n" + process.output())
        # Blocks on the process's output (at most 0.5 s), reading what it
        # printed into process.lines; None at once when it has ended.
        if process.wait_for_line("\0", timeout=min(0.5, left)) is None and \
                process.proc.poll() is not None and len(process.lines) == seen:
            raise AssertionError("ended without such a line:\n" + process.output())


class ProvisionTest(unittest.TestCase):
    def setUp(self):
        self.run_ = Run("provision")
        self.addCleanup(self.run_.close)
        run = self.run_
        run.cohort("partition", "--format", "synthetic", "--samples", "800", "--test-samples",
                   "100", "--features", "20", "--classes", "4", "--clients", "4", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        with open(run.path("run.textproto"), "w") as f:
            f.write("name: \"kits\"\nseed: 5\n"
                    "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
                    "train { batch_size: 16 learning_rate: 0.05 local_epochs: 1 }\n"
                    "net { heartbeat_s: 0.5 }\n"
                    "rounds { num_rounds: 2 min_clients: 3 start_clients: 3 "
                    "round_deadline_s: 30 }\n"
                    "secagg { aggregation: SECAGG_PLUS corrupt_fraction: 0 stage_timeout_s: 5 }\n"
                    f"data {{ test_shard: \"{run.path('shards/test.shard')}\" }}\n")
        self.write_project(SITES)
        self.kits = run.path("kits")

    def write_project(self, sites, name="project.textproto", extra=""):
        run = self.run_
        with open(run.path(name), "w") as f:
            f.write("name: \"test\"\n"
                    "coordinator { host: \"127.0.0.1\" port: 7000 config_file: \"run.textproto\" }\n")
            for i, s in enumerate(sites):
                f.write(f"site {{ name: \"{s}\" data: \"{run.path(f'shards/client-00{i}.shard')}\" }}\n")
            f.write("client_args: \"--corrupt-fraction\"\nclient_args: \"0\"\n"
                    f"systemd {{ binary: \"{os.path.abspath(cohort_bin())}\" "
                    f"kit_root: \"{run.path('kits')}\" }}\n{extra}")
        return run.path(name)

    def provision(self, *args, ok=True, out_dir=None):
        out = subprocess.run([cohort_bin(), "provision", "--out", out_dir or self.kits, *args],
                             capture_output=True, text=True, timeout=60)
        if ok:
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out

    def start_kit(self, kit_dir, log, extra_env, *args):
        env = dict(os.environ, OMP_NUM_THREADS="1", COHORT_BIN=os.path.abspath(cohort_bin()),
                   **extra_env)
        p = Process([os.path.join(kit_dir, "start.sh"), *args], self.run_.path(log), env=env)
        self.run_.processes.append(p)
        return p

    def start_coordinator(self, run_dir, *args):
        p = self.start_kit(os.path.join(self.kits, "coordinator"), "coordinator.log",
                           {"COHORT_BIND": "tcp://127.0.0.1:0", "COHORT_RUN_DIR": run_dir}, *args)
        line = p.wait_for_line("coordinator listening on ")
        self.assertIsNotNone(line, p.output())
        return p, line.rsplit(" ", 1)[1]

    def start_client(self, name, endpoint, kit_dir=None, log=None):
        return self.start_kit(kit_dir or os.path.join(self.kits, name), log or name + ".log",
                              {"COHORT_COORDINATOR": endpoint})

    def status(self, run_dir, *args):
        return self.run_.cohort("status", "--run-dir", run_dir, *args)

    def rounds(self, run_dir):
        out = self.status(run_dir, "--json")
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def check_modes(self, names):
        self.assertEqual(file_mode(self.kits), 0o700)
        for name in names:
            kit = os.path.join(self.kits, name)
            self.assertEqual(file_mode(kit), 0o700, name)
            self.assertEqual(file_mode(os.path.join(kit, name + ".key")), 0o600, name)
            self.assertEqual(file_mode(kit + ".tar.gz"), 0o600, name)
            self.assertEqual(file_mode(os.path.join(kit, "start.sh")), 0o755, name)

    def test_kits_run_a_secure_federation_and_provision_again_writes_the_same_bytes(self):
        out = self.provision("--project", self.run_.path("project.textproto")).stdout
        for name in ["coordinator"] + SITES:
            self.assertIn(f"{self.kits}/{name}/ and {name}.tar.gz (new key)", out)
        self.check_modes(["coordinator"] + SITES)
        self.assertEqual(sorted(os.listdir(os.path.join(self.kits, "coordinator", "allow"))),
                         [s + ".pub" for s in SITES])
        # site-3 runs from its tarball, unpacked elsewhere: the kit is whole
        # and its start script finds its files wherever it lies.
        moved = self.run_.path("site-3-host")
        with tarfile.open(os.path.join(self.kits, "site-3.tar.gz")) as tar:
            tar.extractall(moved)
        self.assertEqual(file_mode(os.path.join(moved, "site-3", "site-3.key")), 0o600)

        coordinator, endpoint = self.start_coordinator(self.run_.path("run1"))
        clients = [self.start_client(s, endpoint) for s in SITES[:2]]
        clients.append(self.start_client("site-3", endpoint, os.path.join(moved, "site-3")))
        self.assertEqual(coordinator.wait(120), 0, coordinator.output())
        for c in clients:
            self.assertEqual(c.wait(30), 0, c.output())
        rounds = self.rounds(self.run_.path("run1"))
        self.assertEqual(len(rounds), 2, rounds)
        for r in rounds:
            self.assertEqual((r["outcome"], r["aggregation"], r["participants"]),
                             ("committed", "secagg+", 3), r)

        before = snapshot(self.kits)
        out = self.provision("--project", self.run_.path("project.textproto")).stdout
        self.assertIn(f"{self.kits}/site-1/ and site-1.tar.gz (key kept)", out)
        self.assertEqual(snapshot(self.kits), before)  # Tarballs and kits.textproto too.

        out = self.provision("--add-site", "site-4", "--data",
                             self.run_.path("shards/client-003.shard")).stdout
        self.assertIn(f"{self.kits}/site-4/ and site-4.tar.gz (new key)", out)
        after = snapshot(self.kits)
        for name in ["coordinator"] + SITES:
            for f in (f"{name}/{name}.key", f"{name}/{name}.pub"):
                self.assertEqual(after[f], before[f], f)
        self.assertEqual(after["coordinator/allow/site-4.pub"], after["site-4/site-4.pub"])
        self.assertEqual(after["site-1/peers/site-4.pub"], after["site-4/site-4.pub"])
        self.check_modes(["site-4"])

    def test_a_revoked_site_is_refused_by_the_running_coordinator_after_sighup(self):
        self.provision("--project", self.run_.path("project.textproto"))
        self.provision("--add-site", "site-4", "--data", self.run_.path("shards/client-003.shard"))
        everyone = SITES + ["site-4"]
        run_dir = self.run_.path("run2")
        coordinator, endpoint = self.start_coordinator(run_dir, "--rounds", "1000")
        clients = {s: self.start_client(s, endpoint) for s in everyone}
        # A round of all four, so site-2 is in the federation when revoked.
        wait_after(coordinator, lambda l: "clients 4/4" in l and "aborted" not in l, 0)
        # site-2 keeps a copy of its kit, as a site would.
        kept = self.run_.path("site-2-kept")
        shutil.copytree(os.path.join(self.kits, "site-2"), kept)
        out = self.provision("--revoke", "site-2").stdout
        self.assertIn(f"{self.kits}/site-2/ removed (revoked)", out)
        self.assertFalse(os.path.exists(os.path.join(self.kits, "site-2")))
        for kit, sub in [("coordinator", "allow"), ("site-1", "peers"), ("site-4", "peers")]:
            self.assertEqual(sorted(os.listdir(os.path.join(self.kits, kit, sub))),
                             ["site-1.pub", "site-3.pub", "site-4.pub"], kit)
        mark = len(coordinator.lines)
        coordinator.signal(signal.SIGHUP)
        wait_after(coordinator, lambda l: "client site-2: key revoked" in l, mark)
        self.assertIn(f"SIGHUP: reloaded the allowlist {self.kits}/coordinator/allow: 3 client "
                      "keys, 0 new, 1 revoked", coordinator.output())
        # The client is told at once, and says so.
        self.assertEqual(clients["site-2"].wait(60), 1, clients["site-2"].output())
        self.assertIn("coordinator rejected this client: key revoked",
                      clients["site-2"].output())
        # The next round runs with the three others.
        index, line = wait_after(coordinator,
                                 lambda l: "clients 3/3" in l and "aborted" not in l, mark)
        committed_round = int(line.split()[1].split("/")[0])
        # Started again from its old kit, site-2 is refused at the handshake,
        # and the coordinator names the revoked key's owner.
        again = self.start_client("site-2", endpoint, kept, "site-2-again.log")
        self.assertIsNotNone(again.wait_for_line("refused this client's key", 60), again.output())
        wait_after(coordinator, lambda l: "is site-2's, revoked from the allowlist" in l, mark)
        again.signal(signal.SIGTERM)
        self.assertEqual(again.wait(30), 0, again.output())
        self.stop_with_sigterm(coordinator, run_dir, committed_round, clients, everyone)

    def stop_with_sigterm(self, coordinator, run_dir, seen_round, clients, everyone):
        """SIGTERM stops the coordinator cleanly; every round it printed is
        committed, and the last ones are the three remaining sites'."""
        coordinator.signal(signal.SIGTERM)
        self.assertEqual(coordinator.wait(60), 0, coordinator.output())
        self.assertIn("coordinator stopped by signal: stopped after round", coordinator.output())
        printed = [l for l in coordinator.lines if l.startswith("round ")]
        rounds = self.rounds(run_dir)
        self.assertGreaterEqual(len(rounds), seen_round)
        self.assertEqual(len(rounds), len(printed), coordinator.output())
        rows = list(csv.DictReader(io.StringIO(self.status(run_dir, "--clients", "--csv"))))
        in_round = sorted(r["client"] for r in rows if int(r["round"]) == seen_round)
        self.assertEqual(in_round, ["site-1", "site-3", "site-4"], rows)
        for s in everyone:
            if s != "site-2":
                clients[s].signal(signal.SIGTERM)
                self.assertEqual(clients[s].wait(30), 0, clients[s].output())

    def test_systemd_units_verify_and_carry_their_hardening(self):
        analyze = shutil.which("systemd-analyze")
        self.assertIsNotNone(analyze, "systemd-analyze is not installed: run scripts/setup.sh "
                                      "(it installs Debian's systemd package)")
        self.provision("--project", self.run_.path("project.textproto"))
        binary = os.path.abspath(cohort_bin())
        for name in ["coordinator"] + SITES:
            unit = os.path.join(self.kits, name, f"cohort-{name}.service")
            out = subprocess.run([analyze, "verify", unit], capture_output=True, text=True,
                                 timeout=60)
            self.assertEqual((out.returncode, out.stdout + out.stderr), (0, ""), unit)
            with open(unit) as f:
                text = f.read()
            for line in HARDENING + [f"ReadWritePaths=/var/lib/cohort/{name}",
                                     f"StateDirectory=cohort/{name}"]:
                self.assertIn("\n" + line + "\n", text, unit)
            self.assertIn(f"ExecStart={binary} {'coordinator' if name == 'coordinator' else 'client'}",
                          text)
            self.assertIn(f"--identity {self.kits}/{name}/{name}.key", text)
            exposure = self.exposure(analyze, unit)
            self.assertLessEqual(exposure, 2.0 if name == "coordinator" else 3.0, unit)
        with open(os.path.join(self.kits, "coordinator", "cohort-coordinator.service")) as f:
            text = f.read()
        self.assertIn("ExecReload=/bin/kill -HUP $MAINPID\n", text)
        self.assertIn(f"--allow {self.kits}/coordinator/allow", text)

    def exposure(self, analyze, unit):
        """`systemd-analyze security`'s exposure score (0 best, 10 worst)."""
        out = subprocess.run([analyze, "security", "--offline=true", unit], capture_output=True,
                             text=True, timeout=60)
        line = [l for l in out.stdout.splitlines() if "Overall exposure level" in l]
        self.assertTrue(line, out.stdout + out.stderr)
        return float(line[0].split(":")[1].split()[0])

    def test_bad_input_gets_an_error_a_user_can_act_on(self):
        run = self.run_
        with open(run.path("typo.textproto"), "w") as f:
            f.write("coordinator {\n  host: \"127.0.0.1\"\n  prot: 7000\n}\n")
        dup = self.write_project(["a", "b", "a"], "dup.textproto")
        os.makedirs(run.path("other"))
        with open(run.path("other/notes.txt"), "w") as f:
            f.write("mine\n")
        cases = [
            (["--project", run.path("typo.textproto")],
             f"{run.path('typo.textproto')}: line 3, column 7: Message type "
             "\"cohort.provision.CoordinatorSpec\" has no field named \"prot\"."),
            (["--project", dup], "site[2].name: kit name \"a\" is also site[0].name's"),
            (["--project", run.path("project.textproto")],
             f"--out {run.path('other')}: exists and is not a kits folder (no kits.textproto)"),
        ]
        for i, (args, want) in enumerate(cases):
            out = self.provision(*args, ok=False, out_dir=run.path("other") if i == 2 else None)
            self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
            self.assertIn(want, out.stderr)
        with open(run.path("other/notes.txt")) as f:
            self.assertEqual(f.read(), "mine\n")
        self.provision("--project", run.path("project.textproto"))
        out = self.provision("--revoke", "site-9", ok=False)
        self.assertEqual(out.returncode, 1)
        self.assertIn("--revoke site-9: " + self.kits +
                      " has no site of that name (its sites: site-1, site-2, site-3)", out.stderr)
        out = self.provision("--revoke", "site-1", "--project", run.path("project.textproto"),
                             ok=False)
        self.assertEqual(out.returncode, 2)
        self.assertIn("leave out --project", out.stderr)


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
