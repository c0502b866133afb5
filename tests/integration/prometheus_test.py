"""Metrics in a real Prometheus (issue 33, acceptance 2).

Debian's `prometheus` on 127.0.0.1 scrapes a coordinator and two of its
five clients (--metrics-addr 127.0.0.1:0, the ports they print) during a
3-round SecAgg+ run over CURVE in which one client drops out at the masked
input of round 2 (five clients survive one dropout); afterwards the series
read back through Prometheus's HTTP query API match `cohort status --json`
(and `--clients --csv` for the clients' samples).

  /usr/bin/python3 tests/integration/prometheus_test.py build/cli/cohort

Synchronisation is on events (a printed line, a target's health, a
process's exit, a query's answer), each with a bounded deadline; never a
sleep.
"""

import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from harness import Run, cohort_bin  # noqa: E402

ROUNDS = 3
CLIENTS = ["client-000", "client-001", "client-002", "client-003", "client-004"]
SCRAPED_CLIENTS = CLIENTS[:2]
# The last client goes silent from this stage of this round on.
DROPOUT = ("masked_input", 2)


def prometheus_binary():
    path = shutil.which("prometheus") or ("/usr/bin/prometheus"
                                          if os.path.exists("/usr/bin/prometheus") else None)
    if path is None:
        raise AssertionError("prometheus is not installed: run scripts/setup.sh (it installs "
                             "Debian's prometheus package)")
    return path


def free_port():
    """A port the system just gave out on 127.0.0.1 (Prometheus takes no port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(what, fn, timeout=60):
    """fn()'s first truthy result, retried on each failure; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
            last = got
        except OSError as e:  # Not listening yet, or a reset connection.
            last = e
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


class Prometheus:
    """Debian's prometheus on 127.0.0.1, config and storage in `run`'s directory."""

    def __init__(self, run, jobs):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = run.path("prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "  evaluation_interval: 1s\nscrape_configs:\n")
            for job, targets in jobs.items():
                f.write(f"  - job_name: {job}\n    static_configs:\n"
                        f"      - targets: {json.dumps(targets)}\n")
        self.process = run.spawn(
            [prometheus_binary(), f"--config.file={config}",
             f"--storage.tsdb.path={run.path('prometheus-data')}",
             f"--web.listen-address=127.0.0.1:{self.port}"], "prometheus.log")
        if self.process.wait_for_line("Server is ready to receive web requests", 60) is None:
            raise AssertionError("prometheus did not start:\n" + self.process.output())

    def get(self, path, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise AssertionError(f"{url}: {body}")
        return body["data"]

    def query(self, expr):
        """[(labels, value)] of an instant query's vector."""
        return [(s["metric"], float(s["value"][1]))
                for s in self.get("/api/v1/query", query=expr)["result"]]

    def last(self, selector, instance):
        """The last scraped values of `selector`'s series from `instance`,
        summed (None when there is none). A target that has exited is marked
        stale, so an instant query of `selector` alone finds nothing once
        the processes are gone."""
        values = [v for labels, v in self.query(f"last_over_time({selector}[10m])")
                  if labels.get("instance") == instance]
        return sum(values) if values else None

    def targets_up(self, instances):
        active = self.get("/api/v1/targets")["activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in active}
        return all(health.get(i) == "up" for i in instances)


def metrics_address(process):
    line = process.wait_for_line("metrics on http://")
    if line is None:
        raise AssertionError("no \"metrics on\" line:\n" + process.output())
    url = line.split("metrics on ", 1)[1].strip()
    return urllib.parse.urlparse(url).netloc


class PrometheusTest(unittest.TestCase):
    def setUp(self):
        self.run_ = Run("prometheus")
        self.addCleanup(self.run_.close)

    def start_cluster(self):
        run = self.run_
        run.cohort("partition", "--format", "synthetic", "--samples", "600", "--test-samples",
                   "100", "--features", "20", "--classes", "4", "--clients", str(len(CLIENTS)),
                   "--scheme", "iid", "--seed", "3", "--out", run.path("shards"))
        run.keygen(["coordinator"] + CLIENTS, allow=CLIENTS)
        config = run.write_config(ROUNDS, "min_clients: 3 start_clients: 5 round_deadline_s: 4",
                                  "secagg { stage_timeout_s: 1.5 }")
        run.start_coordinator(config, curve=True, extra=("--metrics-addr", "127.0.0.1:0"))
        self.coordinator_addr = metrics_address(run.coordinator)
        self.clients = {}
        self.client_addrs = {}
        # Two clients with metrics: the run waits for the others.
        for name in SCRAPED_CLIENTS:
            self.clients[name] = self.start_client(name, "--metrics-addr", "127.0.0.1:0")
            self.client_addrs[name] = metrics_address(self.clients[name])

    def start_client(self, name, *extra):
        run = self.run_
        return run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
                          run.path(f"shards/{name}.shard"), "--identity",
                          run.path(f"keys/{name}.key"), "--coordinator-key",
                          run.path("keys/coordinator.pub"), *extra], f"{name}.log")

    def status_rounds(self):
        out = self.run_.cohort("status", "--run-dir", self.run_.path("run"), "--json")
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def status_client_rows(self):
        out = self.run_.cohort("status", "--run-dir", self.run_.path("run"), "--clients", "--csv")
        return list(csv.DictReader(io.StringIO(out)))

    def test_a_secure_runs_series_in_prometheus_match_cohort_status(self):
        self.start_cluster()
        prom = Prometheus(self.run_, {"coordinator": [self.coordinator_addr],
                                      "clients": list(self.client_addrs.values())})
        every = [self.coordinator_addr] + list(self.client_addrs.values())
        # Scraped while the run waits for its other clients: the series are
        # there from before the first round.
        poll("prometheus scraping the coordinator and two clients",
             lambda: prom.targets_up(every))
        poll("round 0 in prometheus", lambda: prom.last(
            'cohort_rounds_total{outcome="committed"}', self.coordinator_addr) == 0)
        for name in CLIENTS[2:-1]:
            self.clients[name] = self.start_client(name)
        self.clients[CLIENTS[-1]] = self.start_client(
            CLIENTS[-1], "--fault-stop-before", "%s:%d" % DROPOUT)
        # Each finished process serves until a scrape has read its final
        # values (--metrics-linger-s), then exits.
        self.assertEqual(self.run_.coordinator.wait(90), 0, self.run_.coordinator.output())
        for name, c in self.clients.items():
            self.assertEqual(c.wait(60), 0, name + ":\n" + c.output())
        self.assertIn("metrics: the final values were scraped", self.run_.coordinator.output())

        rounds = self.status_rounds()
        self.assertEqual(len(rounds), ROUNDS, rounds)
        self.assertTrue(all(r["aggregation"] == "secagg+" for r in rounds), rounds)
        committed = sum(r["outcome"] == "committed" for r in rounds)
        self.assertEqual(committed, ROUNDS)
        stage, round_ = DROPOUT
        self.assertEqual(rounds[round_ - 1]["dropped_by_stage"][stage], [CLIENTS[-1]], rounds)

        def coordinator(selector):
            return prom.last(selector, self.coordinator_addr)

        # The last scrape's samples may take a moment to be queryable.
        poll("the final round in prometheus",
             lambda: coordinator("cohort_last_round") == rounds[-1]["round"])
        self.assertEqual(coordinator('cohort_rounds_total{outcome="committed"}'), committed)
        self.assertEqual(coordinator('cohort_rounds_total{outcome="aborted"}'),
                         sum(r["outcome"] == "aborted" for r in rounds))
        self.assertEqual(coordinator("cohort_round_participants"), rounds[-1]["participants"])
        self.assertEqual(coordinator("cohort_round_selected"), rounds[-1]["selected"])
        self.assertEqual(coordinator("cohort_updates_aggregated_total"),
                         sum(r["participants"] for r in rounds))
        self.assertEqual(coordinator("cohort_dropouts_total"),
                         sum(r["dropped"] for r in rounds))
        for stage in rounds[0]["dropped_by_stage"]:
            self.assertEqual(coordinator(f'cohort_dropouts_total{{stage="{stage}"}}'),
                             sum(len(r["dropped_by_stage"][stage]) for r in rounds), stage)
        self.assertEqual(coordinator("cohort_misbehaviour_total"),
                         sum(len(r["misbehaving"]) for r in rounds))
        self.assertEqual(coordinator("cohort_round_duration_seconds_count"), ROUNDS)
        self.assertAlmostEqual(coordinator("cohort_round_duration_seconds_sum"),
                               sum(r["seconds"] for r in rounds), delta=1e-3)
        self.check_bytes(coordinator, rounds)
        self.check_clients(prom)

    def check_bytes(self, coordinator, rounds):
        """The coordinator's byte counters and stage histograms against the
        stages `cohort status --json` shows."""
        received = coordinator("cohort_received_bytes_total")
        sent = coordinator("cohort_sent_bytes_total")
        self.assertEqual(received, sum(s["bytes_in"] for r in rounds for s in r["stages"]))
        self.assertEqual(sent, sum(s["bytes_out"] for r in rounds for s in r["stages"]))
        self.assertGreater(received, 0)
        for stage in ("commit_seed", "masked_input", "unmasking", "aggregate"):
            seconds = [s["seconds"] for r in rounds for s in r["stages"] if s["stage"] == stage]
            self.assertEqual(len(seconds), ROUNDS, stage)
            self.assertEqual(
                coordinator(f'cohort_stage_duration_seconds_count{{stage="{stage}"}}'), ROUNDS)
            self.assertAlmostEqual(
                coordinator(f'cohort_stage_duration_seconds_sum{{stage="{stage}"}}'),
                sum(seconds), delta=1e-3)

    def check_clients(self, prom):
        rows = self.status_client_rows()
        for name, addr in self.client_addrs.items():
            mine = [r for r in rows if r["client"] == name]
            self.assertEqual(len(mine), ROUNDS, rows)
            self.assertTrue(all(r["status"] == "ok" for r in mine), mine)

            def client(selector):
                return prom.last(selector, addr)

            poll(f"{name}'s last round in prometheus",
                 lambda: client("cohort_last_trained_round") == ROUNDS)
            self.assertEqual(client("cohort_rounds_trained_total"), ROUNDS)
            # One local epoch a round over the shard the store counts.
            self.assertEqual(client("cohort_trained_samples_total"),
                             sum(int(r["num_samples"]) for r in mine))
            self.assertEqual(client("cohort_train_duration_seconds_count"), ROUNDS)
            self.assertGreater(client("cohort_samples_per_second"), 0)
            # On the socket, with framing and the traffic between rounds: at
            # least what the coordinator counted of it in the rounds.
            self.assertGreaterEqual(client("cohort_sent_bytes_total"),
                                    sum(int(r["upload_bytes"]) for r in mine))
            self.assertGreaterEqual(client("cohort_received_bytes_total"),
                                    sum(int(r["download_bytes"]) for r in mine))
            self.assertGreater(sum(int(r["upload_bytes"]) for r in mine), 0)


def scrape(url):
    """The text exposition at `url` as {series: value}."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    return values


class WorkerMetricsTest(unittest.TestCase):
    """`cohort worker --metrics-addr`: each rank of a data-parallel run serves
    its own epochs, steps and samples, and after the run waits for a scrape
    of its final values."""

    def test_each_rank_serves_its_share_of_the_run(self):
        run = Run("worker-metrics")
        self.addCleanup(run.close)
        run.cohort("partition", "--format", "synthetic", "--samples", "300", "--test-samples",
                   "60", "--features", "20", "--classes", "4", "--clients", "1", "--scheme",
                   "iid", "--seed", "3", "--out", run.path("shards"))
        epochs, batch, world = 2, 8, 2
        config = run.path("dp.textproto")
        with open(config, "w") as f:
            f.write(f"""seed: 7\nmode: DATA_PARALLEL
data {{ train_shard: "{run.path('shards/client-000.shard')}" }}
model {{ arch: "mlp" input_dim: 20 num_classes: 4 hidden: 8 }}
train {{ batch_size: {batch} learning_rate: 0.05 }}
data_parallel {{ epochs: {epochs} timeout_s: 10 }}
""")
        ranks = [run.spawn([cohort_bin(), "worker", "--config", config, "--run-dir",
                            run.path("run"), "--rank", str(r), "--world-size", str(world),
                            "--master", "ipc://" + run.path("meet"), "--metrics-addr",
                            "127.0.0.1:0"], f"rank-{r}.log") for r in range(world)]
        urls = [metrics_address(p) for p in ranks]
        finals = []
        for p, addr in zip(ranks, urls):
            self.assertIsNotNone(p.wait_for_line("run over; serving", 120), p.output())
            finals.append(scrape(f"http://{addr}/metrics"))
        for p in ranks:
            self.assertEqual(p.wait(30), 0, p.output())
        # 300 samples: global batches of 16, so 19 steps an epoch (the last
        # of 12), split between the ranks.
        steps = -(-300 // (batch * world))
        out = run.cohort("status", "--run-dir", run.path("run"), "--json")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        self.assertEqual([r["round"] for r in rows], list(range(1, epochs + 1)))
        for r, values in enumerate(finals):
            self.assertEqual(values["cohort_epochs_total"], epochs, r)
            self.assertEqual(values["cohort_last_epoch"], epochs, r)
            self.assertEqual(values["cohort_steps_total"], epochs * steps, r)
            self.assertEqual(values["cohort_epoch_duration_seconds_count"], epochs, r)
            self.assertGreater(values["cohort_samples_per_second"], 0, r)
        self.assertEqual(sum(v["cohort_trained_samples_total"] for v in finals), epochs * 300)
        # Compute and communication seconds: what the store holds per rank.
        for r, values in enumerate(finals):
            stored = [row["ranks"][r] for row in rows]
            self.assertAlmostEqual(values["cohort_compute_seconds_total"],
                                   sum(s["compute_seconds"] for s in stored), delta=1e-4)
            self.assertAlmostEqual(values["cohort_communication_seconds_total"],
                                   sum(s["comm_seconds"] for s in stored), delta=1e-4)
            self.assertGreater(values["cohort_communication_seconds_total"], 0)


class MetricsAddrErrorTest(unittest.TestCase):
    """A bad --metrics-addr stops each daemon at start-up, before it does
    anything else, with an error naming the flag and the value."""

    def setUp(self):
        self.run_ = Run("metrics-addr")
        self.addCleanup(self.run_.close)
        self.config = self.run_.write_config(1)

    def fails(self, *args):
        out = subprocess.run([cohort_bin(), *args], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertNotIn("metrics on", out.stdout)
        return out.stderr

    def test_the_coordinator_refuses_an_address_without_a_port_before_opening_its_run(self):
        run_dir = self.run_.path("run")
        err = self.fails("coordinator", "--config", self.config, "--run-dir", run_dir, "--bind",
                         "tcp://127.0.0.1:0", "--insecure", "--metrics-addr", "127.0.0.1")
        self.assertIn("coordinator: INVALID_ARGUMENT: --metrics-addr 127.0.0.1: no port; "
                      "expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any free port)", err)
        self.assertFalse(os.path.exists(run_dir), "the run directory was created")

    def test_a_client_refuses_a_port_in_use_before_connecting(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            addr = "127.0.0.1:%d" % taken.getsockname()[1]
            err = self.fails("client", "--coordinator", "tcp://127.0.0.1:1", "--data",
                             self.run_.path("no-such.shard"), "--insecure", "--metrics-addr",
                             addr)
        self.assertIn(f"client: UNAVAILABLE: --metrics-addr {addr}: cannot listen there: "
                      "Address already in use", err)
        # Stopped before reading its shard.
        self.assertNotIn("no-such.shard", err)

    def test_a_worker_refuses_a_host_name(self):
        err = self.fails("worker", "--config", self.config, "--run-dir", self.run_.path("run"),
                         "--rank", "0", "--world-size", "1", "--master", "tcp://127.0.0.1:1",
                         "--metrics-addr", "metrics.example:9464")
        self.assertIn("worker: INVALID_ARGUMENT: --metrics-addr metrics.example:9464: the host "
                      "\"metrics.example\" is not an IPv4 address (or localhost)", err)
        self.assertFalse(os.path.exists(self.run_.path("run")))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["COHORT_BIN"] = os.path.abspath(sys.argv.pop(1))
    unittest.main()
