"""The Kubernetes recipes, validated offline (issue 35, item 5 and acceptance 4).

No cluster is contacted: kubectl runs only as `kubectl kustomize`.

- deploy/kubernetes and each of its bases build, and every object they make
  validates against Kubernetes' own OpenAPI schemas (v1.31) and Kubeflow's
  CRD schemas (PyTorchJob kubeflow.org/v1, MPIJob kubeflow.org/v2beta1),
  vendored under tests/data/kubernetes-schemas/ (README.md there), made
  strict as `kubectl apply --validate=strict` is: an unknown field is an
  error. A broken object is rejected (the check can fail).
- `cohort provision --format kubernetes` on a coordinator and three sites:
  every overlay builds and validates; the Secrets hold the kits' keys; the
  pods run non-root with read-only root filesystems; provisioning again
  writes the same bytes; a bad --format is refused naming the flag.
- The pods are then played on 127.0.0.1 as a kubelet would run them: the
  Secrets and ConfigMaps materialised as files (the kubelet's ..data
  layout, the Secret's modes), the init containers run, the mount paths
  mapped to folders, $(VAR) expanded. The provisioned coordinator and three
  clients finish a SecAgg+ run; the PyTorchJob's two ranks, given exactly
  the variables Kubeflow's training operator sets, finish a data-parallel
  run, and those variables are the ones `cohort worker` reads.

  /usr/bin/python3 tests/integration/kubernetes_test.py build/cli/cohort

Needs kubectl and Debian's python3-yaml and python3-jsonschema
(scripts/setup.sh installs them). Synchronisation is on printed lines and
process exits, each with a bounded deadline.
"""

import base64
import copy
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SCHEMAS = os.path.join(ROOT, "tests", "data", "kubernetes-schemas")
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
from harness import Process, Run, cohort_bin  # noqa: E402

try:
    import jsonschema
    import yaml
except ImportError as e:  # A missing package is a failure, not a skip.
    raise SystemExit(f"kubernetes_test: {e}: scripts/setup.sh installs python3-jsonschema and "
                     "python3-yaml")

SITES = ["site-1", "site-2", "site-3"]
CORE_KINDS = {
    ("apps/v1", "Deployment"): "io.k8s.api.apps.v1.Deployment",
    ("apps/v1", "StatefulSet"): "io.k8s.api.apps.v1.StatefulSet",
    ("v1", "Service"): "io.k8s.api.core.v1.Service",
    ("v1", "Secret"): "io.k8s.api.core.v1.Secret",
    ("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap",
    ("networking.k8s.io/v1", "NetworkPolicy"): "io.k8s.api.networking.v1.NetworkPolicy",
}
CRDS = {("kubeflow.org/v1", "PyTorchJob"): "pytorchjob-v1.json",
        ("kubeflow.org/v2beta1", "MPIJob"): "mpijob-v2beta1.json"}


def strict(node):
    """`node` with every object schema that lists its properties closed to
    others (what --validate=strict checks), except where the schema keeps
    unknown fields on purpose."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: strict(v) for k, v in node.items()}
    if "properties" in node and "additionalProperties" not in node and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        node["additionalProperties"] = False
    return node


class Validator:
    def __init__(self):
        with open(os.path.join(SCHEMAS, "kubernetes-v1.31.json")) as f:
            self.core = strict(json.load(f))
        self.crds = {}
        for key, name in CRDS.items():
            with open(os.path.join(SCHEMAS, name)) as f:
                self.crds[key] = strict(json.load(f))

    def errors(self, obj):
        """The schema errors of one object, as 'path: message' lines."""
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key in CORE_KINDS:
            schema = dict(self.core, **{"$ref": "#/components/schemas/" + CORE_KINDS[key]})
        elif key in self.crds:
            schema = self.crds[key]
        else:
            return [f"{key}: no schema for this kind"]
        validator = jsonschema.Draft7Validator(schema)
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:300]}"
                for e in validator.iter_errors(obj)]


def kustomize(path):
    """The objects `kubectl kustomize PATH` makes."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise AssertionError("kubectl not found: scripts/setup.sh installs it (Debian's "
                             "kubernetes-client)")
    out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path}:\n{out.stderr}")
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def find(objects, kind, prefix=""):
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(prefix)]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} named {prefix}*: "
                             f"{[o['metadata']['name'] for o in objects]}")
    return found[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def containers_of(pod):
    return pod.get("initContainers", []) + pod["containers"]


class Pod:
    """One pod of a pod template, played on this host: its volumes as
    folders under `root`, its containers as processes. `claims` maps a
    PersistentVolumeClaim's name to the folder that plays it."""

    def __init__(self, run, name, template, objects, claims):
        self.run, self.name, self.spec = run, name, template["spec"]
        self.root = run.path(name)
        os.makedirs(self.root)
        self.volumes = {v["name"]: self._volume(v, objects, claims)
                        for v in self.spec.get("volumes", [])}
        for claim, folder in claims.items():  # volumeClaimTemplates: by name.
            os.makedirs(folder, exist_ok=True)
            self.volumes.setdefault(claim, folder)
        self.bin = run.path("bin")
        if not os.path.exists(self.bin):
            os.makedirs(self.bin)
            os.symlink(os.path.abspath(cohort_bin()), os.path.join(self.bin, "cohort"))

    def _volume(self, v, objects, claims):
        path = os.path.join(self.root, "volumes", v["name"])
        if "emptyDir" in v:
            os.makedirs(path)
        elif "persistentVolumeClaim" in v:
            return claims[v["persistentVolumeClaim"]["claimName"]]
        elif "secret" in v or "configMap" in v:
            source = v.get("secret") or v.get("configMap")
            kind = "Secret" if "secret" in v else "ConfigMap"
            name = source.get("secretName", source.get("name"))
            obj = find(objects, kind, name)
            self._atomic_writer(path, obj, source.get("defaultMode", 0o644), kind == "Secret")
        else:
            raise AssertionError(f"{self.name}: volume {v['name']}: no way to play {v}")
        return path

    @staticmethod
    def _atomic_writer(path, obj, mode, secret):
        """The kubelet's layout: the files in a timestamped folder, ..data
        pointing at it, and each key a link through ..data."""
        stamp = os.path.join(path, "..2026_01_01_00_00_00.000000001")
        os.makedirs(stamp)
        for key, value in obj.get("data", {}).items():
            data = base64.b64decode(value) if secret else value.encode()
            with open(os.path.join(stamp, key), "wb") as f:
                f.write(data)
            os.chmod(os.path.join(stamp, key), mode)
        os.symlink(os.path.basename(stamp), os.path.join(path, "..data"))
        for key in obj.get("data", {}):
            os.symlink(os.path.join("..data", key), os.path.join(path, key))

    def env(self, container, operator_env):
        env = {"PATH": self.bin + ":/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        for e in container.get("env", []):
            if "valueFrom" in e:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                assert field == "status.podIP", f"{self.name}: {field}"
                env[e["name"]] = "127.0.0.1"
            else:
                env[e["name"]] = e["value"]
        env.update(operator_env)
        return env

    def argv(self, container, env, rewrite):
        """command + args with $(VAR) expanded as the kubelet does, each mount
        path replaced by its folder, and `rewrite`'s words replaced."""
        words = container.get("command", []) + container.get("args", [])
        words = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                        lambda m: env.get(m.group(1), m.group(0)), w) for w in words]
        mounts = {m["mountPath"]: self.volumes[m["name"]]
                  for m in container.get("volumeMounts", [])}
        # One pass, longest path first, each where a path starts.
        pattern = re.compile(r"(?<![\w./-])(" + "|".join(
            re.escape(m) for m in sorted(mounts, key=len, reverse=True)) + ")")
        out = []
        for w in words:
            for old, new in rewrite.items():
                w = w.replace(old, new)
            out.append(pattern.sub(lambda m: mounts[m.group(1)], w) if mounts else w)
        return out

    def start(self, operator_env=None, rewrite=None):
        """Runs the init containers to completion, then starts the main one."""
        for c in self.spec.get("initContainers", []):
            env = self.env(c, {})
            out = subprocess.run(self.argv(c, env, rewrite or {}), env=env, capture_output=True,
                                 text=True, timeout=30)
            assert out.returncode == 0, f"{self.name}: init {c['name']}: {out.stderr}"
        (c,) = self.spec["containers"]
        env = self.env(c, operator_env or {})
        p = Process(self.argv(c, env, rewrite or {}), self.run.path(self.name + ".log"), env=env)
        self.run.processes.append(p)
        return p


class KubernetesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.validator = Validator()

    def setUp(self):
        self.run_ = Run("kubernetes")
        self.addCleanup(self.run_.close)

    def assertValid(self, objects, where):
        for obj in objects:
            errors = self.validator.errors(obj)
            self.assertEqual(errors, [], f"{where}: {obj['kind']} {obj['metadata']['name']}")

    def assertHardened(self, objects, where):
        for obj in objects:
            pods = []
            if obj["kind"] in ("Deployment", "StatefulSet"):
                pods = [obj["spec"]["template"]["spec"]]
            elif obj["kind"] == "PyTorchJob":
                pods = [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
            for pod in pods:
                self.assertTrue(pod["securityContext"]["runAsNonRoot"], where)
                self.assertNotEqual(pod["securityContext"]["runAsUser"], 0, where)
                for c in containers_of(pod):
                    self.assertFalse(c["securityContext"]["allowPrivilegeEscalation"], where)
                    self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"], where)
                    self.assertEqual(c["securityContext"]["capabilities"]["drop"], ["ALL"])
                for v in pod.get("volumes", []):
                    if "secret" in v:
                        self.assertIn(v["secret"]["defaultMode"], (0o400, 0o444), where)
                for c in containers_of(pod):
                    for m in c.get("volumeMounts", []):
                        volume = [v for v in pod["volumes"] if v["name"] == m["name"]]
                        if volume and "secret" in volume[0]:
                            self.assertTrue(m.get("readOnly"), f"{where}: {m}")

    # --- deploy/kubernetes as it is ---------------------------------------

    def test_deploy_recipes_build_and_validate(self):
        objects = kustomize(DEPLOY)
        self.assertEqual(sorted((o["kind"], o["metadata"]["name"]) for o in objects), [
            ("Deployment", "cohort-client"), ("MPIJob", "cohort-dp-mpi"),
            ("NetworkPolicy", "cohort-client"), ("NetworkPolicy", "cohort-coordinator"),
            ("PyTorchJob", "cohort-dp"), ("Service", "cohort-coordinator"),
            ("StatefulSet", "cohort-coordinator")])
        self.assertValid(objects, "deploy/kubernetes")
        self.assertHardened(objects, "deploy/kubernetes")
        for base in ("coordinator", "client", "pytorchjob", "mpijob"):
            self.assertValid(kustomize(os.path.join(DEPLOY, "base", base)), base)
        coordinator = find(objects, "StatefulSet")
        claim = coordinator["spec"]["volumeClaimTemplates"][0]
        self.assertEqual(claim["metadata"]["name"], "run")
        self.assertEqual(coordinator["spec"]["template"]["spec"]["containers"][0]["args"][3:5],
                         ["--run-dir", "/var/lib/cohort/run"])
        mpi = find(objects, "MPIJob")
        launcher = mpi["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        self.assertEqual(launcher["args"][-2:], ["--transport", "mpi"])

    def test_a_broken_object_is_rejected(self):
        """The negative controls: the validator can fail, naming the field."""
        objects = kustomize(DEPLOY)
        deployment = copy.deepcopy(find(objects, "Deployment"))
        deployment["spec"]["replica"] = 1
        self.assertIn("spec: Additional properties are not allowed ('replica' was unexpected)",
                      self.validator.errors(deployment))
        service = copy.deepcopy(find(objects, "Service"))
        service["spec"]["ports"][0]["port"] = "7000"
        self.assertIn("spec.ports.0.port: '7000' is not of type 'integer'",
                      self.validator.errors(service))
        job = copy.deepcopy(find(objects, "PyTorchJob"))
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
            "volumeMount"] = []
        self.assertIn("spec.pytorchReplicaSpecs.Worker.template.spec.containers.0: Additional "
                      "properties are not allowed ('volumeMount' was unexpected)",
                      self.validator.errors(job))
        mpi = copy.deepcopy(find(objects, "MPIJob"))
        del mpi["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"]
        self.assertIn("spec.mpiReplicaSpecs.Worker.template.spec.containers.0: 'name' is a "
                      "required property", self.validator.errors(mpi))

    # --- cohort provision --format kubernetes -----------------------------

    def provision_federation(self, port):
        run = self.run_
        run.cohort("partition", "--format", "synthetic", "--samples", "600", "--test-samples",
                   "100", "--features", "20", "--classes", "4", "--clients", "3", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        with open(run.path("run.textproto"), "w") as f:
            f.write("name: \"k8s\"\nseed: 5\n"
                    "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
                    "train { batch_size: 16 learning_rate: 0.05 local_epochs: 1 }\n"
                    "net { heartbeat_s: 0.5 }\n"
                    "rounds { num_rounds: 2 min_clients: 3 start_clients: 3 "
                    "round_deadline_s: 30 }\n"
                    "secagg { aggregation: SECAGG_PLUS corrupt_fraction: 0 stage_timeout_s: 5 }\n"
                    f"data {{ test_shard: \"{run.path('shards/test.shard')}\" }}\n")
        with open(run.path("project.textproto"), "w") as f:
            f.write("name: \"k8s\"\ncoordinator { host: \"127.0.0.1\" bind: \"127.0.0.1\" "
                    f"port: {port} config_file: \"run.textproto\" }}\n")
            for i, s in enumerate(SITES):
                f.write(f"site {{ name: \"{s}\" data: \"/srv/cohort/client-00{i}.shard\" }}\n")
            f.write("client_args: \"--corrupt-fraction\"\nclient_args: \"0\"\n")
        return self.provision("--project", run.path("project.textproto"), "--format",
                              "kubernetes")

    def provision(self, *args):
        out = subprocess.run([cohort_bin(), "provision", "--out", self.run_.path("kits"), *args],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out

    def test_provisioned_overlays_validate_and_hold_the_kits_keys(self):
        out = self.provision_federation(7000)
        k8s = self.run_.path("kits/kubernetes")
        self.assertIn(k8s + "/ (Kubernetes: kubectl apply -k", out.stdout)
        for name in ["coordinator"] + SITES:
            objects = kustomize(os.path.join(k8s, name))
            self.assertValid(objects, name)
            self.assertHardened(objects, name)
        everyone = kustomize(k8s)
        self.assertValid(everyone, "kubernetes/")
        names = sorted((o["kind"], o["metadata"]["name"]) for o in everyone)
        for s in SITES:
            for kind, name in [("Deployment", "cohort-client-"), ("NetworkPolicy", "cohort-client-"),
                               ("Secret", "cohort-client-identity-"),
                               ("Secret", "cohort-coordinator-key-"), ("Secret", "cohort-peers-")]:
                self.assertIn((kind, name + s), names)
        # The coordinator takes the clients on its port and Prometheus on
        # the metrics port, and opens nothing; a client opens only the
        # coordinator's port and DNS, and takes nothing.
        policy = find(everyone, "NetworkPolicy", "cohort-coordinator")["spec"]
        self.assertEqual(policy["policyTypes"], ["Ingress", "Egress"])
        self.assertEqual(policy.get("egress", []), [])
        self.assertEqual([(r["from"][0]["podSelector"]["matchLabels"], r["ports"])
                          for r in policy["ingress"]],
                         [({"app.kubernetes.io/name": "cohort",
                            "app.kubernetes.io/component": "client"},
                           [{"protocol": "TCP", "port": 7000}]),
                          ({"app.kubernetes.io/name": "prometheus"},
                           [{"protocol": "TCP", "port": 9464}])])
        for s in SITES:
            policy = find(everyone, "NetworkPolicy", "cohort-client-" + s)["spec"]
            self.assertEqual(policy["podSelector"]["matchLabels"]["app.kubernetes.io/instance"], s)
            self.assertEqual(policy.get("ingress", []), [])
            self.assertEqual(sorted((p["protocol"], p["port"]) for r in policy["egress"]
                                    for p in r["ports"]),
                             [("TCP", 53), ("TCP", 7000), ("UDP", 53)])
            self.assertNotIn("to", policy["egress"][0])
        # The Secrets hold the kits' files byte for byte; a site's holds
        # only its own private key.
        kits = self.run_.path("kits")
        site = kustomize(os.path.join(k8s, "site-2"))
        identity = find(site, "Secret", "cohort-client-identity")
        with open(os.path.join(kits, "site-2", "site-2.key"), "rb") as f:
            self.assertEqual(base64.b64decode(identity["data"]["site-2.key"]), f.read())
        keys = [k for s in site if s["kind"] == "Secret" for k in s["data"]]
        self.assertEqual(sorted(k for k in keys if k.endswith(".key")), ["site-2.key"])
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(k8s, "site-2", "secrets.yaml")).st_mode),
                         0o600)
        allow = find(kustomize(os.path.join(k8s, "coordinator")), "Secret", "cohort-allow")
        self.assertEqual(sorted(allow["data"]), [s + ".pub" for s in SITES])
        # The same kits, the same bytes; and no key in what provision printed.
        before = snapshot(k8s)
        again = self.provision("--project", self.run_.path("project.textproto"))
        self.assertEqual(snapshot(k8s), before)
        self.assertNotIn(identity["data"]["site-2.key"], out.stdout + again.stdout + again.stderr)

    def test_a_bad_format_is_refused_naming_the_flag(self):
        self.provision_federation(7000)
        out = subprocess.run([cohort_bin(), "provision", "--out", self.run_.path("kits2"),
                              "--project", self.run_.path("project.textproto"), "--format",
                              "helm"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--format helm: not a format (kits, kubernetes)", out.stderr)
        self.assertFalse(os.path.exists(self.run_.path("kits2")))

    def test_the_provisioned_pods_run_a_federation(self):
        port = free_port()
        self.provision_federation(port)
        run = self.run_
        objects = kustomize(run.path("kits/kubernetes"))
        coordinator = Pod(run, "coordinator", find(objects, "StatefulSet")["spec"]["template"],
                          objects, {"run": run.path("coordinator-run")})
        # The test plays the Service too: the container listens on the port
        # the clients dial. Metrics on any free port of 127.0.0.1.
        rewrite = {"tcp://127.0.0.1:7000": f"tcp://127.0.0.1:{port}",
                   "0.0.0.0:9464": "127.0.0.1:0"}
        coord = coordinator.start(rewrite=rewrite)
        clients = []
        for s in SITES:
            deployment = find(objects, "Deployment", "cohort-client-" + s)
            pod = Pod(run, s, deployment["spec"]["template"], objects,
                      {"cohort-data-" + s: run.path("shards")})
            identity = os.path.join(pod.volumes["identity"], s + ".key")
            clients.append(pod.start())
            self.assertEqual(stat.S_IMODE(os.stat(identity).st_mode), 0o600)
        line = coord.wait_for_line("round   2/2", 120)
        self.assertIsNotNone(line, coord.output() + "".join(c.output() for c in clients))
        self.assertIn("clients 3/3", line)
        status = run.cohort("status", "--run-dir", run.path("coordinator-run/run"))
        self.assertRegex(status, r"(?m)^\s+1 secagg\+\s+3/3 .*\n\s+2 secagg\+\s+3/3 ")
        for p in clients + [coord]:
            p.signal(signal.SIGTERM)
            p.wait(60)

    # --- the data-parallel jobs -------------------------------------------

    def test_pytorchjob_ranks_finish_with_the_operators_variables(self):
        run = self.run_
        job = find(kustomize(os.path.join(DEPLOY, "base", "pytorchjob")), "PyTorchJob")
        run.cohort("partition", "--format", "synthetic", "--samples", "300", "--test-samples",
                   "60", "--features", "20", "--classes", "4", "--clients", "1", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        for r in range(2):
            run.cohort("keygen", "--out", run.path("keys"), "--name", f"rank-{r}")
        keys = {}
        for f in sorted(os.listdir(run.path("keys"))):
            with open(os.path.join(run.path("keys"), f), "rb") as fh:
                keys[f] = base64.b64encode(fh.read()).decode()
        config = ("seed: 7\nmode: DATA_PARALLEL\n"
                  f"data {{ train_shard: \"{run.path('shards/client-000.shard')}\" }}\n"
                  "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
                  "train { batch_size: 8 learning_rate: 0.05 }\n"
                  "data_parallel { epochs: 2 timeout_s: 20 }\n")
        # What a user applies beside the job.
        objects = [job, {"kind": "Secret", "metadata": {"name": "cohort-dp-keys"}, "data": keys},
                   {"kind": "ConfigMap", "metadata": {"name": "cohort-dp-config"},
                    "data": {"config.textproto": config}}]
        specs = job["spec"]["pytorchReplicaSpecs"]
        world = sum(s["replicas"] for s in specs.values())
        self.assertEqual(world, 2)
        port = free_port()
        ranks = []
        for kind, index, rank in (("Master", 0, 0), ("Worker", 0, 1)):
            template = specs[kind]["template"]
            (c,) = template["spec"]["containers"]
            self.assertEqual(c["name"], "pytorch")
            self.assertEqual([p["name"] for p in c["ports"]], ["pytorchjob-port"])
            # Kubeflow training operator v1.9.0, pkg/controller.v1/pytorch/
            # envvar.go and master.go: MASTER_ADDR is the Master's service
            # name (here a name that resolves to 127.0.0.1), MASTER_PORT the
            # pytorchjob-port (here a free one).
            operator_env = {"PYTHONUNBUFFERED": "1", "MASTER_PORT": str(port),
                            "PET_MASTER_PORT": str(port), "MASTER_ADDR": "localhost",
                            "PET_MASTER_ADDR": "localhost", "WORLD_SIZE": str(world),
                            "RANK": str(rank), "PET_NODE_RANK": str(rank),
                            "PET_NNODES": str(world)}
            claims = {"cohort-dp-run": run.path("dp-run")}
            pod = Pod(run, f"{kind.lower()}-{index}", template, objects, claims)
            ranks.append(pod.start(operator_env))
        for r, p in enumerate(ranks):
            self.assertEqual(p.wait(120), 0, p.output())
            self.assertTrue(any(f"[rank {r}]" in line for line in p.lines), p.output())
        rows = [json.loads(line) for line in
                run.cohort("status", "--run-dir", run.path("dp-run/run"), "--json").splitlines()
                if line.startswith("{")]
        self.assertEqual([row["round"] for row in rows], [1, 2])
        # What the operator sets and `cohort worker` reads: rank, world size
        # and rendezvous come from these, and nothing else is needed.
        with open(os.path.join(ROOT, "worker", "worker.cc")) as f:
            read = set(re.findall(r'"([A-Z][A-Z0-9_]+)"', f.read()))
        self.assertTrue({"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= read, read)
        self.assertEqual(sorted(set(operator_env) & read),
                         ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"])

    def test_mpijob_launchers_command_runs_under_mpirun(self):
        """The MPIJob's launcher command, run by this host's mpirun: the
        ranks take OMPI_COMM_WORLD_RANK and _SIZE from it and finish."""
        mpirun = os.environ.get("COHORT_MPIRUN")
        if not mpirun:
            self.skipTest("this build has no MPI transport, or there is no mpirun")
        run = self.run_
        job = find(kustomize(os.path.join(DEPLOY, "base", "mpijob")), "MPIJob")
        specs = job["spec"]["mpiReplicaSpecs"]
        (launcher,) = specs["Launcher"]["template"]["spec"]["containers"]
        worker = specs["Worker"]["template"]
        run.cohort("partition", "--format", "synthetic", "--samples", "300", "--test-samples",
                   "60", "--features", "20", "--classes", "4", "--clients", "1", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        config = ("seed: 7\nmode: DATA_PARALLEL\n"
                  f"data {{ train_shard: \"{run.path('shards/client-000.shard')}\" }}\n"
                  "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
                  "train { batch_size: 8 learning_rate: 0.05 }\n"
                  "data_parallel { epochs: 2 timeout_s: 20 }\n")
        objects = [job, {"kind": "ConfigMap", "metadata": {"name": "cohort-dp-config"},
                         "data": {"config.textproto": config}}]
        # The ranks run in the worker pods: their mounts give the paths.
        pod = Pod(run, "mpi-worker", worker, objects, {"cohort-dp-run": run.path("mpi-run")})
        (ranks_container,) = worker["spec"]["containers"]
        env = pod.env(launcher, {})
        argv = pod.argv(dict(launcher, volumeMounts=ranks_container["volumeMounts"]), env, {})
        self.assertEqual(argv[0], "mpirun")
        self.assertEqual(int(argv[argv.index("-np") + 1]),
                         specs["Worker"]["replicas"] * job["spec"]["slotsPerWorker"])
        # Open MPI on this host only: shared memory, its channel on loopback.
        local = [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
                 "--mca", "oob_tcp_if_include", "lo"]
        if "ASAN_OPTIONS" in os.environ:
            # Open MPI leaks at MPI_Finalize (in components it has unloaded):
            # under `make test-asan`, no leak check for the ranks, as in
            # simulate_mpi_test.cc.
            local += ["-x", "ASAN_OPTIONS=detect_leaks=0:halt_on_error=1"]
        p = Process(local + argv[1:], run.path("mpirun.log"), env=env)
        run.processes.append(p)
        self.assertEqual(p.wait(120), 0, p.output())
        self.assertIn("rank 1 of 2 ready", p.output())
        rows = [json.loads(line) for line in
                run.cohort("status", "--run-dir", run.path("mpi-run/run"), "--json").splitlines()
                if line.startswith("{")]
        self.assertEqual([row["round"] for row in rows], [1, 2])


def snapshot(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, f), root)] = fh.read()
    return out


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
