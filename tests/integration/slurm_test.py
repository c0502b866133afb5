"""The Slurm recipes of deploy/slurm/ in a real single-node Slurm (issue 35).

Debian's slurm-wlm and munge are brought up on 127.0.0.1 by this test: a
munged with its own key and socket, a slurmctld and a slurmd, every
config, state, log and socket file in a temporary directory, the ports
free ones, and removed at the end (even on failure). Then:

  - deploy/slurm/data_parallel.sbatch, a 2-task job of
    examples/data_parallel.textproto in exact mode (one epoch, a sixth of
    Fashion-MNIST), whose ranks take their rank and world size from Slurm
    and meet over tcp (CURVE, one key per rank), trains the model
    `cohort launch --nproc 2` trains, bit for bit;
  - deploy/slurm/data_parallel_mpi.sbatch, the same job under
    `srun --mpi=pmix` over the MPI transport, likewise bit for bit;
  - deploy/slurm/simulate_mpi.sbatch, a 3-task job of `cohort simulate`
    (1,000 synthetic clients, 100 a round, SecAgg+) under
    `srun --mpi=pmix`, whose ranks 1 and 2 train rank 0's clients, ends
    with the model `cohort simulate` gives in one process, bit for bit.

  /usr/bin/python3 tests/integration/slurm_test.py build/cli/cohort

Exit 77 (Meson's skip) only when Slurm cannot run here, printing the
daemon's own words; missing packages are a failure naming scripts/setup.sh.
The daemons run in a UTS namespace named "localhost" (unshare --uts), so
that Slurm's NoInAddrAny binds its daemons and srun to 127.0.0.1 whatever
this machine's host name resolves to. Synchronisation is on conditions
(a file, a job's state, a daemon's answer), each polled with a deadline.
"""

import hashlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SBATCH_TCP = os.path.join(ROOT, "deploy", "slurm", "data_parallel.sbatch")
SBATCH_MPI = os.path.join(ROOT, "deploy", "slurm", "data_parallel_mpi.sbatch")
SBATCH_SIM = os.path.join(ROOT, "deploy", "slurm", "simulate_mpi.sbatch")
EXAMPLE = os.path.join(ROOT, "examples", "data_parallel.textproto")
FMNIST = "/usr/share/datasets/fashion-mnist"
# simulate_mpi_test.cc's run: 1,000 clients of a synthetic split in memory,
# 100 a round, SecAgg+, a small MLP.
SIMULATION = """name: "slurm-simulate"
seed: 11
data { partition { format: "synthetic" samples: 20000 test_samples: 1000 features: 20 classes: 4
                   clients: 1000 scheme: "iid" seed: 3 } }
model { arch: "mlp" input_dim: 20 num_classes: 4 hidden: 16 }
train { batch_size: 8 learning_rate: 0.05 }
rounds { num_rounds: 2 min_clients: 80 start_clients: 1000 fraction: 1.0
         max_clients_per_round: 100 round_deadline_s: 60 }
secagg { aggregation: SECAGG_PLUS }
"""
# Open MPI on this host only (shared memory, loopback), its ranks as root.
OMPI_ENV = {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_tcp_if_include": "lo",
            "OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# Open MPI leaks at MPI_Finalize (its own allocations, in components it has
# unloaded): under `make test-asan`, LeakSanitizer is off for the MPI ranks,
# as in simulate_mpi_test.cc.
if "ASAN_OPTIONS" in os.environ:
    OMPI_ENV["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1"
SKIP = 77
# Slurm's and munge's programs, all from scripts/setup.sh's packages.
PROGRAMS = ["munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "srun"]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class Skip(Exception):
    """Slurm cannot run on this machine; the message says why."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(what, fn, timeout):
    """fn()'s first truthy result, polled every 0.2 s; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({path}: {e})"


def decode_address(hex_address):
    """/proc/net/tcp's little-endian hex address as text (IPv4, or IPv6 in hex)."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def model_hash(run_dir):
    """SHA-256 of the latest checkpoint's float32 bytes, as bench/fingerprints.sh prints it."""
    db = sqlite3.connect(f"file:{run_dir}/run.db?mode=ro", uri=True)
    try:
        row = db.execute("SELECT round, model FROM checkpoints ORDER BY round DESC LIMIT 1")
        epoch, model = row.fetchone()
    finally:
        db.close()
    return epoch, hashlib.sha256(model).hexdigest()


class Cluster:
    """munged, slurmctld and slurmd on 127.0.0.1, everything under `root`."""

    def __init__(self, root):
        self.root = root
        self.procs = {}
        self.conf = os.path.join(root, "slurm.conf")
        for d in ("munge", "state", "spool", "log", "run"):
            os.makedirs(os.path.join(root, d), mode=0o711, exist_ok=True)
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.uts = self.uts_prefix()

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def uts_prefix(self):
        """unshare --uts with the host name "localhost", or nothing where this
        host's name already resolves to a loopback address."""
        probe = subprocess.run(["unshare", "--uts", "sh", "-c", "hostname localhost && hostname"],
                               capture_output=True, text=True, timeout=10)
        if probe.returncode == 0 and probe.stdout.strip() == "localhost":
            return ["unshare", "--uts", "sh", "-c", 'hostname localhost && exec "$@"', "sh"]
        try:
            address = socket.gethostbyname(socket.gethostname())
        except OSError as e:
            address = str(e)
        if address.startswith("127."):
            return []
        raise Skip("cannot give Slurm a loopback host name: unshare --uts: "
                   f"{(probe.stderr or probe.stdout).strip()}; and {socket.gethostname()} "
                   f"resolves to {address}, where Slurm would listen")

    def write_config(self):
        munge_key = self.path("munge", "munge.key")
        with open(munge_key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(munge_key, 0o600)
        lines = [
            "ClusterName=cohorttest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.path('munge', 'munge.socket')}",
            # Bind to what the host name ("localhost") resolves to, not to any address.
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MailProg=/bin/true",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool')}",
            f"SlurmctldPidFile={self.path('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={self.path('run', 'slurmd.pid')}",
            f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self.path('log', 'slurmd.log')}",
            "NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=10 State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def spawn(self, name, argv):
        out = open(self.path("log", name + ".out"), "w")
        self.procs[name] = subprocess.Popen(self.uts + argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env)
        out.close()

    def died(self, name, log):
        """Skip naming the daemon's own last lines when it has exited."""
        code = self.procs[name].poll()
        if code is not None:
            raise Skip(f"{name} exited with status {code} at start:\n"
                       f"{tail(self.path('log', name + '.out'))}{tail(log) if log else ''}")

    def start(self):
        self.write_config()
        self.spawn("munged", ["munged", "--foreground", "--force",
                              f"--socket={self.path('munge', 'munge.socket')}",
                              f"--key-file={self.path('munge', 'munge.key')}",
                              f"--pid-file={self.path('munge', 'munged.pid')}",
                              f"--log-file={self.path('log', 'munged.log')}",
                              f"--seed-file={self.path('munge', 'munged.seed')}"])
        self.wait_up("munged", self.path("log", "munged.log"), self.munge_answers)
        self.spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        self.wait_up("slurmctld", self.path("log", "slurmctld.log"), self.controller_answers)
        self.spawn("slurmd", ["slurmd", "-D", "-f", self.conf, "-N", "localhost"])
        self.wait_up("slurmd", self.path("log", "slurmd.log"), self.node_idle)

    def wait_up(self, name, log, ready, timeout=30):
        deadline = time.monotonic() + timeout
        while not ready():
            self.died(name, log)
            if time.monotonic() > deadline:
                raise Skip(f"{name} did not come up within {timeout} s:\n{tail(log)}")
            time.sleep(0.1)

    def run(self, *argv, timeout=20):
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def munge_answers(self):
        sock = self.path("munge", "munge.socket")
        return os.path.exists(sock) and self.run("munge", "-S", sock, "-n").returncode == 0

    def controller_answers(self):
        return "UP" in self.run("scontrol", "ping").stdout

    def node_idle(self):
        out = self.run("scontrol", "show", "node", "localhost", "-o").stdout
        return "State=IDLE" in out

    def submit(self, script, output, env, tasks=2):
        """The job's id; `env` goes to the job (sbatch exports the environment).
        More tasks than the node's 2 CPUs share them (--overcommit)."""
        overcommit = ["--overcommit"] if tasks > 2 else []
        out = subprocess.run(["sbatch", "--parsable", f"--ntasks={tasks}", *overcommit,
                              "--time=3", f"--output={output}", f"--chdir={self.root}", script],
                             capture_output=True, text=True, env=dict(self.env, **env),
                             timeout=20)
        if out.returncode != 0:
            raise AssertionError(f"sbatch {script}: {out.stdout}{out.stderr}")
        return out.stdout.strip().split(";")[0]

    def job_state(self, job):
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState"), fields.get("ExitCode")

    def wait_job(self, job, timeout=120):
        """The job's final (state, exit code), and what listened while it ran."""
        heard = set()

        def done():
            heard.update(self.listeners())
            state, code = self.job_state(job)
            return (state, code) if state in TERMINAL else None
        return poll(f"job {job}", done, timeout), heard

    def ours(self):
        """Pids of the processes whose environment names this cluster's slurm.conf:
        the daemons, slurmstepd, srun and the job's tasks (each started by us)."""
        needle = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(pid))
            except OSError:
                continue
        return [p for p in pids if p != os.getpid()]

    def listeners(self):
        """{(program, address:port)} of every TCP socket listening, or UDP socket
        bound, in a process of this cluster (the daemons, srun, slurmstepd and
        its PMIx server, the ranks)."""
        owner = {}
        for pid in self.ours():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        owner[link[8:-1]] = comm
            except OSError:
                continue  # It exited meanwhile.
        found = set()
        for table, listening in (("tcp", "0A"), ("tcp6", "0A"), ("udp", None), ("udp6", None)):
            try:
                with open(f"/proc/net/{table}") as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if len(cols) < 10 or cols[9] not in owner:
                    continue
                address, port = cols[1].split(":")
                if (listening and cols[3] != listening) or int(port, 16) == 0:
                    continue
                found.add((owner[cols[9]], f"{decode_address(address)}:{int(port, 16)}"))
        return found

    def stop(self):
        """Cancels what still runs, stops the daemons, then kills any process
        of this cluster left behind; each step bounded."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--user=root", timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None:
                continue
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for pid in self.ours():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class SlurmTest:
    def __init__(self, cohort, root):
        self.cohort = cohort
        self.root = root
        self.cluster = None

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def cohort_run(self, *args, env=None, timeout=120):
        out = subprocess.run([self.cohort, *args], capture_output=True, text=True, env=env,
                             timeout=timeout)
        if out.returncode != 0:
            raise AssertionError(f"cohort {' '.join(args)}: {out.stdout}{out.stderr}")
        return out.stdout + out.stderr

    def prepare(self):
        """One shard of a sixth of Fashion-MNIST, the example config in exact
        mode for one epoch, and a key per rank."""
        d = FMNIST
        self.cohort_run("partition", "--format", "idx",
                        "--train-images", f"{d}/train-images-idx3-ubyte.gz",
                        "--train-labels", f"{d}/train-labels-idx1-ubyte.gz",
                        "--test-images", f"{d}/t10k-images-idx3-ubyte.gz",
                        "--test-labels", f"{d}/t10k-labels-idx1-ubyte.gz",
                        "--clients", "6", "--out", self.path("shards"))
        with open(EXAMPLE) as f:
            text = f.read()
        for old, new in [("runs/dp/shards/client-000.shard", self.path("shards/client-000.shard")),
                         ("runs/dp/shards/test.shard", self.path("shards/test.shard")),
                         ("exact: false", "exact: true"), ("epochs: 3", "epochs: 1")]:
            assert old in text, f"{EXAMPLE} no longer holds {old!r}"
            text = text.replace(old, new)
        self.config = self.path("run.textproto")
        with open(self.config, "w") as f:
            f.write(text)
        for k in range(2):
            self.cohort_run("keygen", "--out", self.path("keys"), "--name", f"rank-{k}")

    def launch(self):
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        start = time.monotonic()
        self.cohort_run("launch", "--nproc", "2", "--config", self.config, "--run-dir",
                        self.path("launch"), env=env)
        print(f"cohort launch --nproc 2: {time.monotonic() - start:.1f} s")
        return model_hash(self.path("launch"))

    def run_job(self, name, script, extra_env, tasks=2):
        """(state, exit code, output, what listened) of the job, once it ended."""
        env = {"COHORT": self.cohort, "CONFIG": self.config, "RUN_DIR": self.path(name)}
        env.update(extra_env)
        output = self.path(name + ".out")
        job = self.cluster.submit(script, output, env, tasks)
        (state, code), heard = self.cluster.wait_job(job)
        with open(output, errors="replace") as f:
            return job, state, code, f.read(), heard

    def sbatch(self, name, script, extra_env, unless=None, tasks=2):
        """The output of the job, which must complete (or fail saying `unless`),
        listening on 127.0.0.1 only."""
        start = time.monotonic()
        job, state, code, out, heard = self.run_job(name, script, extra_env, tasks)
        print(f"{name}: job {job} {state} (exit {code}) in {time.monotonic() - start:.1f} s; "
              f"listening: {', '.join(sorted(f'{p} {a}' for p, a in heard))}")
        outside = sorted(a for a in heard if not a[1].startswith("127.0.0.1:"))
        assert not outside, f"{name}: listening beyond 127.0.0.1: {outside}"
        if state != "COMPLETED" and not (unless and unless in out):
            raise AssertionError(f"{os.path.basename(script)}: job {job} {state}, exit {code}:\n"
                                 f"{out[-4000:]}\nslurmd.log:\n"
                                 f"{tail(self.cluster.path('log', 'slurmd.log'))}")
        return out

    def check_refusals(self):
        """A job without a rank's key, or without its config, fails before any
        rank starts, saying what is missing."""
        os.makedirs(self.path("no-keys"))
        _, state, code, out, _ = self.run_job("nokeys", SBATCH_TCP, {"KEYS": self.path("no-keys")})
        assert state == "FAILED" and code == "2:0", (state, code, out)
        want = (f"data_parallel.sbatch: KEYS={self.path('no-keys')} has no rank-0.key: one key "
                f"per task, ranks 0 to 1: cohort keygen --out {self.path('no-keys')} --name rank-0")
        assert want in out, out
        missing = self.path("missing.textproto")
        _, state, code, out, _ = self.run_job("noconfig", SBATCH_MPI, {"CONFIG": missing})
        assert state == "FAILED" and code == "2:0", (state, code, out)
        want = f"data_parallel_mpi.sbatch: CONFIG={missing}: no such file (set CONFIG"
        assert want in out, out
        _, state, code, out, _ = self.run_job("nosimconfig", SBATCH_SIM, {"CONFIG": missing})
        assert state == "FAILED" and code == "2:0", (state, code, out)
        assert f"simulate_mpi.sbatch: CONFIG={missing}: no such file (set CONFIG" in out, out
        print("refused: a job without rank-0.key, and two without their config")

    def check_tcp(self, reference):
        out = self.sbatch("tcp", SBATCH_TCP, {"KEYS": self.path("keys"),
                                              "MASTER_PORT": str(free_port())})
        # The ranks are Slurm's tasks, meeting at the first node of its node list.
        assert "rank 1 of 2 ready (cpu (OpenBLAS), tcp, ZeroMQ CURVE: authenticated and " \
            "encrypted)" in out, out
        assert "epoch   1/1  workers 2" in out, out
        got = model_hash(self.path("tcp"))
        print(f"model after epoch {got[0]}: launch {reference[1]}\n"
              f"                         srun    {got[1]}")
        assert got == reference, f"srun (tcp) trained {got}, cohort launch {reference}"

    def check_mpi(self, reference):
        plugins = self.cluster.run("srun", "--mpi=list")
        if "pmix" not in plugins.stdout + plugins.stderr:
            raise AssertionError("srun --mpi=list names no pmix plugin (Debian's slurm-wlm-"
                                 f"basic-plugins has it):\n{plugins.stdout}{plugins.stderr}")
        unavailable = "this cohort was built without MPI"
        out = self.sbatch("mpi", SBATCH_MPI, OMPI_ENV, unless=unavailable)
        if unavailable in out:
            print(f"mpi: not tested: {unavailable}")
            return False
        assert "rank 1 of 2 ready (cpu (OpenBLAS), MPI)" in out, out
        got = model_hash(self.path("mpi"))
        print(f"model after epoch {got[0]}: launch {reference[1]}\n"
              f"                         srun --mpi=pmix {got[1]}")
        assert got == reference, f"srun --mpi=pmix trained {got}, cohort launch {reference}"
        return True

    def check_simulate_mpi(self):
        """simulate_mpi.sbatch as a 3-task job: ranks 1 and 2 host the clients
        and the model is the one process's, bit for bit."""
        config = self.path("simulate.textproto")
        with open(config, "w") as f:
            f.write(SIMULATION)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        start = time.monotonic()
        self.cohort_run("simulate", "--config", config, "--run-dir", self.path("sim-one"),
                        env=env)
        print(f"cohort simulate: {time.monotonic() - start:.1f} s")
        reference = model_hash(self.path("sim-one"))
        unavailable = "this cohort was built without MPI"
        out = self.sbatch("sim-mpi", SBATCH_SIM, dict(OMPI_ENV, CONFIG=config),
                          unless=unavailable, tasks=3)
        if unavailable in out:
            print(f"simulate: not tested: {unavailable}")
            return False
        for want in ("rank 1 of 3: 1 executors on cpu for 1000 clients",
                     "rank 2 of 3: 1 executors on cpu for 1000 clients",
                     "simulating 1000 clients (2 executors on 2 hosting ranks)"):
            assert want in out, f"{want!r} not in the job's output:\n{out[-4000:]}"
        got = model_hash(self.path("sim-mpi"))
        print(f"model after round {got[0]}: cohort simulate {reference[1]}\n"
              f"                         srun --mpi=pmix -n 3 {got[1]}")
        assert got == reference, f"srun --mpi=pmix simulate: {got}, one process: {reference}"
        return True

    def main(self):
        missing = [p for p in PROGRAMS if shutil.which(p) is None]
        if missing:
            raise AssertionError(f"{', '.join(missing)} not installed: run scripts/setup.sh "
                                 "(it installs Debian's slurm-wlm and munge)")
        if os.geteuid() != 0:
            raise Skip("slurmd runs jobs as their user only as root; this test is not root")
        self.prepare()
        reference = self.launch()
        print(f"cohort launch --nproc 2: model after epoch {reference[0]} {reference[1]}")
        self.cluster = Cluster(self.path("slurm"))
        start = time.monotonic()
        try:
            self.cluster.start()
            print(f"slurm up in {time.monotonic() - start:.1f} s")
            self.check_refusals()
            self.check_tcp(reference)
            mpi = self.check_mpi(reference)
            sim = self.check_simulate_mpi()
        finally:
            self.cluster.stop()
        left = self.cluster.ours()
        assert not left, f"processes of the test's Slurm still running: {left}"
        print("OK: srun" + (" and srun --mpi=pmix" if mpi else "") +
              " trained what cohort launch --nproc 2 trains, bit for bit" +
              ("; srun --mpi=pmix -n 3 cohort simulate ended with one process's model, bit for bit"
               if sim else ""))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: slurm_test.py COHORT_BINARY")
    root = tempfile.mkdtemp(prefix="cohort-slurm-")
    os.chmod(root, 0o711)  # munged wants the socket's directories searchable by all.
    test = SlurmTest(os.path.abspath(sys.argv[1]), root)
    try:
        test.main()
    except Skip as e:
        print(f"SKIP: Slurm cannot run here: {e}")
        sys.exit(SKIP)
    finally:
        if os.environ.get("COHORT_KEEP_TEST_DIRS"):
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
