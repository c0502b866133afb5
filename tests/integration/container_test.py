"""The container image (issue 35, item 3 and acceptance 7).

deploy/container/Containerfile is built with Podman on a Debian 12 base
that mmdebstrap makes from this machine's own apt sources (no image
registry is needed). In the image: `make demo`'s federated run (a
coordinator and 10 clients on Fashion-MNIST, SecAgg+ over CURVE) runs on
loopback only (--network none), as the unprivileged user `cohort`, into
the volume; a fresh container on the same volume then reads the committed
rounds back with `cohort status`, the same values the run printed.

  /usr/bin/python3 tests/integration/container_test.py build/cli/cohort

The image build runs scripts/setup.sh and compiles `cohort` (many
minutes on 2 cores). Podman's storage lives in COHORT_CONTAINER_CACHE
(default /var/tmp/cohort-container-test): the base image is made once per
apt sources file, and an image is tagged with a hash of the Containerfile,
the build context and the base, so a re-run on unchanged sources reuses
it; a changed source tree reuses the set-up layer and only recompiles.

When this machine runs no container at all (the runtime's own error), the
test says why and exits 77 (skipped). A missing podman or mmdebstrap is a
failure naming `scripts/setup.sh container`, which installs them.

Synchronisation is on process exits, each with a bounded deadline.
"""

import fnmatch
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
CONTAINERFILE = os.path.join(SOURCE, "deploy", "container", "Containerfile")
IGNOREFILE = CONTAINERFILE + ".dockerignore"
CACHE = os.environ.get("COHORT_CONTAINER_CACHE", "/var/tmp/cohort-container-test")
# Podman's state of running containers: in /run (gone at a reboot) as root,
# one per storage folder.
RUNROOT = ("/run/cohort-container-test-" + hashlib.sha256(CACHE.encode()).hexdigest()[:8]
           if os.geteuid() == 0 else os.path.join(CACHE, "runroot"))
BASE_TAG = "localhost/cohort-base:debian12"
IMAGE_REPO = "localhost/cohort-test"
CLIENTS = 10
ROUNDS = 10
BUILD_TIMEOUT = 3000
# Podman as root asks for 1048576 open files and 4194304 processes, which a
# host without CAP_SYS_RESOURCE refuses ("setrlimit RLIMIT_NOFILE: Operation
# not permitted"); a run of 11 processes needs far less than these.
NOFILE = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
ULIMITS = ["--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", "nproc=4096:4096"]
ROUND_LINE = re.compile(r"^round +(\d+)/(\d+) +clients (\d+)/(\d+) +dropped (\d+) +"
                        r"train_loss ([\d.]+) +test_acc ([\d.]+) +test_loss ([\d.]+)")


def need(program):
    path = shutil.which(program) or next(
        (p for p in (f"/usr/bin/{program}", f"/usr/sbin/{program}") if os.path.exists(p)), None)
    if path is None:
        raise AssertionError(f"{program} is not installed: run scripts/setup.sh container (it installs "
                             f"Debian's {program} package)")
    return path


def apt_sources():
    """This machine's Debian apt sources: the base image uses the same mirror."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        if os.path.exists(path):
            return path
    raise AssertionError("no /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list: "
                         "the base image takes its Debian mirror from there")


class Podman:
    """podman with the test's own storage; `runtime` is None for podman's default."""

    def __init__(self, runtime=None):
        self.binary = need("podman")
        self.runtime = runtime

    def argv(self, *args):
        extra = ["--runtime", self.runtime] if self.runtime else []
        return [self.binary, "--root", os.path.join(CACHE, "storage"),
                "--runroot", RUNROOT, *extra, *args]

    def run(self, *args, timeout=300, check=True):
        """podman's exit status, stdout and stderr; fails on a non-zero status if `check`."""
        # Buildah keeps build cache mounts (the Containerfile's ccache) in TMPDIR.
        os.makedirs(os.path.join(CACHE, "tmp"), exist_ok=True)
        env = dict(os.environ, TMPDIR=os.path.join(CACHE, "tmp"))
        p = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                           env=env)
        if check and p.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {p.returncode}:\n"
                                 f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
        return p

    def exists(self, image):
        return self.run("image", "exists", image, check=False).returncode == 0

    def image_id(self, image):
        return self.run("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()


def make_base(podman):
    """BASE_TAG from mmdebstrap's minbase Debian 12, made once per sources file."""
    sources = apt_sources()
    with open(sources, "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    tag = f"{BASE_TAG}-{key}"
    if podman.exists(tag):
        return tag
    os.makedirs(CACHE, exist_ok=True)
    tarball = os.path.join(CACHE, "base.tar")
    started = time.monotonic()
    p = subprocess.run([need("mmdebstrap"), "--variant=minbase", "--quiet", "bookworm", tarball,
                        sources], capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise AssertionError(f"mmdebstrap bookworm from {sources} exited {p.returncode}:\n"
                             f"{p.stderr[-3000:]}")
    podman.run("import", tarball, tag, timeout=600)
    os.remove(tarball)
    print(f"base image {tag}: mmdebstrap + import {time.monotonic() - started:.0f} s",
          flush=True)
    return tag


def working_runtime(base):
    """A Podman whose runtime starts a container here, or None and each runtime's error."""
    errors = []
    for runtime in (None, "runc"):
        podman = Podman(runtime)
        p = podman.run("run", "--rm", "--network", "none", *ULIMITS, base, "true",
                       check=False, timeout=120)
        if p.returncode == 0:
            return podman, errors
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        errors.append(f"{runtime or 'default runtime'}: {lines[-1] if lines else p.returncode}")
    return None, errors


def ignore_patterns():
    """The .dockerignore's patterns: (those of the top folder, those at any depth)."""
    top, anywhere = [], []
    with open(IGNOREFILE) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                if line.startswith("**/"):
                    anywhere.append(line[3:])
                else:
                    top.append(line)
    return top, anywhere


def context_digest(base_id):
    """SHA-256 over the base image's id and every file of the build context
    that the .dockerignore keeps (the Containerfile among them): names and bytes."""
    top, anywhere = ignore_patterns()
    h = hashlib.sha256(base_id.encode())
    for dirpath, dirs, files in os.walk(SOURCE):
        at_top = os.path.samefile(dirpath, SOURCE)
        keep = lambda name: not any(fnmatch.fnmatch(name, p)
                                    for p in anywhere + (top if at_top else []))
        dirs[:] = sorted(filter(keep, dirs))
        for name in sorted(filter(keep, files)):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, SOURCE).encode() + b"\0")
            if os.path.islink(path):
                h.update(os.readlink(path).encode())
            else:
                with open(path, "rb") as fh:
                    h.update(fh.read())
            h.update(b"\0")
    return h.hexdigest()[:16]


def build_image(podman, base):
    """The image of this source tree: reused when one with its digest exists."""
    tag = f"{IMAGE_REPO}:{context_digest(podman.image_id(base))}"
    if podman.exists(tag):
        print(f"reusing {tag} (built from the same Containerfile, sources and base)", flush=True)
        return tag
    build = ["build", "-f", CONTAINERFILE, "--ignorefile", IGNOREFILE,
             "--build-arg", f"BASE={base}", *ULIMITS]
    started = time.monotonic()
    # The set-up stage gets a name of its own, so that pruning keeps it.
    podman.run(*build, "--target", "deps", "-t", f"{IMAGE_REPO}-deps", SOURCE,
               timeout=BUILD_TIMEOUT)
    deps_done = time.monotonic()
    out = podman.run(*build, "-t", tag, SOURCE, timeout=BUILD_TIMEOUT).stdout
    hits = re.search(r"^\s*Hits:.*$", out, re.M)
    print(f"built {tag}: set-up stage {deps_done - started:.0f} s, the rest "
          f"{time.monotonic() - deps_done:.0f} s (ccache {hits[0].strip() if hits else '?'})",
          flush=True)
    # Older images of this test and the build stages of earlier builds go.
    listed = podman.run("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO).stdout
    for old in {i for i in listed.split() if i.startswith(IMAGE_REPO + ":")} - {tag}:
        podman.run("rmi", old, check=False)
    podman.run("image", "prune", "--force", check=False)
    return tag


class ContainerTest(unittest.TestCase):
    podman = None
    base = None

    @classmethod
    def setUpClass(cls):
        cls.image = build_image(cls.podman, cls.base)
        cls.volume = f"cohort-test-{os.getpid()}"
        cls.podman.run("volume", "create", cls.volume)

    @classmethod
    def tearDownClass(cls):
        cls.podman.run("volume", "rm", "--force", cls.volume, check=False)

    def in_container(self, *args, entrypoint=None, env=(), timeout=300):
        """A fresh container of the image on the volume, loopback only."""
        flags = ["--rm", "--network", "none", *ULIMITS, "-v", f"{self.volume}:/var/lib/cohort"]
        if entrypoint:
            flags += ["--entrypoint", entrypoint]
        for e in env:
            flags += ["-e", e]
        return self.podman.run("run", *flags, self.image, *args, timeout=timeout)

    def test_the_image_runs_cohort_as_an_unprivileged_user_on_a_volume(self):
        config = json.loads(self.podman.run("image", "inspect", "--format", "{{json .Config}}",
                                            self.image).stdout)
        self.assertEqual(config["Entrypoint"], ["cohort"])
        self.assertEqual(config["User"], "cohort")
        self.assertIn("/var/lib/cohort", config["Volumes"])
        self.assertEqual(self.in_container("-u", "-n", entrypoint="id").stdout.split(),
                         ["cohort"])
        host = subprocess.run([os.environ["COHORT_BIN"], "--version"],
                              capture_output=True, text=True, check=True).stdout
        self.assertEqual(self.in_container("--version").stdout, host)
        # Build-only parts are not in it.
        for tool in ("g++", "meson", "ninja", "protoc"):
            p = self.podman.run("run", "--rm", "--network", "none", *ULIMITS, "--entrypoint",
                                "sh", self.image, "-c", f"command -v {tool}", check=False)
            self.assertNotEqual(p.returncode, 0, f"{tool} is in the image: {p.stdout}")

    def test_the_demo_runs_inside_and_its_run_outlives_the_container(self):
        started = time.monotonic()
        demo = self.in_container(entrypoint="cohort-demo", timeout=600,
                                 env=[f"CLIENTS={CLIENTS}", f"ROUNDS={ROUNDS}"])
        print(f"demo in the container: {time.monotonic() - started:.0f} s", flush=True)
        print("\n".join(l for l in demo.stdout.splitlines() if l.startswith(("round", "=="))),
              flush=True)
        self.assertIn("== done; the run is in /var/lib/cohort/demo", demo.stdout)
        printed = [ROUND_LINE.match(l) for l in demo.stdout.splitlines()]
        printed = [m for m in printed if m]
        self.assertEqual([(int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in printed],
                         [(r, ROUNDS, CLIENTS, CLIENTS) for r in range(1, ROUNDS + 1)],
                         demo.stdout)
        self.assertGreater(float(printed[-1][7]), 0.6, "final test accuracy")

        # A fresh container on the same volume: the committed rounds are there.
        status = self.in_container("status", "--run-dir", "demo", "--json")
        rounds = [json.loads(l) for l in status.stdout.splitlines() if l.startswith("{")]
        self.assertEqual([r["round"] for r in rounds], list(range(1, ROUNDS + 1)))
        self.assertEqual({r["outcome"] for r in rounds}, {"committed"})
        for r, m in zip(rounds, printed):
            self.assertEqual("%.4f" % r["test_accuracy"], m[7], f"round {r['round']}")
            self.assertEqual("%.4f" % r["train_loss"], m[6], f"round {r['round']}")
        table = self.in_container("status", "--run-dir", "demo").stdout
        self.assertRegex(table, r"\n +%d secagg\+ +%d/%d +0 " % (ROUNDS, CLIENTS, CLIENTS))
        listing = self.in_container("-c", "ls -ln /var/lib/cohort/demo/run.db",
                                    entrypoint="sh").stdout.split()
        self.assertEqual(listing[2], "10001", "run.db's owner")


def main():
    if len(sys.argv) > 1:
        os.environ["COHORT_BIN"] = os.path.abspath(sys.argv.pop(1))
    if "COHORT_BIN" not in os.environ:
        sys.exit("usage: container_test.py COHORT_BINARY")
    need("mmdebstrap")
    base = make_base(Podman())
    podman, errors = working_runtime(base)
    if podman is None:
        print("SKIP: podman runs no container on this machine:\n  " + "\n  ".join(errors),
              flush=True)
        sys.exit(77)
    print(f"runtime: {podman.runtime or 'podman default'}", flush=True)
    ContainerTest.podman, ContainerTest.base = podman, base
    unittest.main()


if __name__ == "__main__":
    main()
