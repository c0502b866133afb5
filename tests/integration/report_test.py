"""`cohort report` as a user sees it (issue 33, acceptance 1 and the report's
part of acceptance 5).

  /usr/bin/python3 tests/integration/report_test.py COHORT_BIN browser|bad_input

browser: makes a real federated run (a coordinator and cohort client
processes on 127.0.0.1, port 0), a simulated one of 100 rounds (cohort
simulate) and a data-parallel one (cohort launch, two workers); writes the
report of each and of all three overlaid; renders each page in headless
Chromium (Debian's `chromium`) and checks, in the DOM after rendering, that
every plot has one mark per figure in the store (read here with sqlite3,
read-only, not through Cohort), that the page fetched nothing over the
network, that the 100-round page weighs under 1 MB and that the
screenshot is a real PNG.

bad_input: a corrupt and a truncated run.db, directories of other kinds,
a store without a run and an unwritable -o: each a clear error naming the
directory, a non-zero exit, no output file, and the run directory
unchanged.

Synchronisation is on events (a line a process prints, its exit); every
wait is bounded. Chromium reaches nothing: its proxy is a closed port on
127.0.0.1 and its resolver answers every name with NOTFOUND. Its net log
still shows every request tried: the browser's own service calls
(component updater, account check) carry no User-Agent, a page's do, and a
control page with an outside image shows that the check catches one.
"""

import html.parser
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
import harness  # noqa: E402  (python/tests/harness.py: Process, bounded line waits)

COHORT = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
os.environ["COHORT_BIN"] = COHORT
CLIENTS = 4
SIM_ROUNDS = 100
SIM_CLIENTS = 10


def cohort(*args, timeout=120, check=True):
    out = subprocess.run([COHORT, *args], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    if check and out.returncode != 0:
        raise AssertionError(f"cohort {' '.join(args)} exited {out.returncode}:\n"
                             f"{out.stdout}{out.stderr}")
    return out


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class Workspace:
    """A temporary directory with shards and the three runs."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="cohort-report-")

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def close(self):
        if os.environ.get("COHORT_KEEP_TEST_DIRS"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def partition(self, name="shards", clients=CLIENTS):
        # Dirichlet(0.5): the clients' sample counts differ, as the report shows.
        cohort("partition", "--format", "synthetic", "--samples", "1200", "--test-samples", "400",
               "--features", "20", "--classes", "4", "--clients", str(clients), "--scheme",
               "dirichlet:0.5", "--seed", "3", "--out", self.path(name))

    def federated_config(self, name, rounds, aggregation, extra="", clients=CLIENTS):
        path = self.path(name)
        min_clients = min(clients, max(4, clients // 2))
        write(path, "seed: 5\n"
                    f"data {{ test_shard: \"{self.path('shards', 'test.shard')}\" }}\n"
                    "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
                    "train { batch_size: 16 learning_rate: 0.05 }\n"
                    "net { heartbeat_s: 0.5 }\n"
                    f"rounds {{ num_rounds: {rounds} min_clients: {min_clients} "
                    f"start_clients: {clients} {extra} }}\n"
                    f"secagg {{ aggregation: {aggregation} }}\n")
        return path

    def federated_run(self):
        """Plain FedAvg with federated evaluation: a coordinator and CLIENTS clients."""
        config = self.federated_config("fed.textproto", 3, "PLAIN", "federated_eval_every: 1")
        procs = []
        try:
            coord = harness.Process([COHORT, "coordinator", "--config", config, "--run-dir",
                                     self.path("fed"), "--bind", "tcp://127.0.0.1:0",
                                     "--insecure"], self.path("coordinator.log"))
            procs.append(coord)
            line = coord.wait_for_line("coordinator listening on ", timeout=30)
            assert line, "coordinator did not start:\n" + coord.output()
            endpoint = line.rsplit(" ", 1)[1]
            for k in range(CLIENTS):
                shard = self.path("shards", f"client-{k:03d}.shard")
                procs.append(harness.Process(
                    [COHORT, "client", "--coordinator", endpoint, "--data", shard, "--test-data",
                     self.path("shards", "test.shard"), "--insecure"]
                    # Two of them share their label counts (opt-in).
                    + (["--share-label-counts"] if k < 2 else []),
                    self.path(f"client-{k}.log")))
            assert coord.wait(timeout=90) == 0, coord.output()
        finally:
            for p in procs:
                p.close()

    def simulated_run(self):
        """SecAgg+ with 20 % of the clients dropping out at stages drawn from the seed."""
        self.partition("shards10", SIM_CLIENTS)
        config = self.federated_config("sim.textproto", SIM_ROUNDS, "SECAGG_PLUS",
                                       clients=SIM_CLIENTS)
        cohort("simulate", "--config", config, "--run-dir", self.path("sim"), "--shards",
               self.path("shards10"), "--dropout", "0.2", timeout=120)

    def data_parallel_run(self):
        path = self.path("dp.textproto")
        write(path, "seed: 7\nmode: DATA_PARALLEL\n"
                    f"data {{ train_shard: \"{self.path('shards', 'client-000.shard')}\" "
                    f"test_shard: \"{self.path('shards', 'test.shard')}\" }}\n"
                    "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 8 }\n"
                    "train { batch_size: 16 learning_rate: 0.05 }\n"
                    "data_parallel { epochs: 3 timeout_s: 10 }\n")
        cohort("launch", "--nproc", "2", "--config", path, "--run-dir", self.path("dp"),
               timeout=120)


# --- The store, read independently of Cohort's code -------------------------------------

def open_ro(run_dir):
    # immutable: the runs are over, and a plain read-only open of a WAL
    # database would leave -wal and -shm files in the run directory.
    db = sqlite3.connect(f"file:{os.path.join(run_dir, 'run.db')}?mode=ro&immutable=1", uri=True)
    db.row_factory = sqlite3.Row
    return db


def table_rows(db, table):
    """Every row of `table` as dicts; [] when the store has no such table."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                      (table,)).fetchone():
        return []
    return [dict(r) for r in db.execute(f"SELECT * FROM {table}")]


def category(client):
    """The dropouts chart's series of a client row (the issue's rule, written out)."""
    if client["stage"]:
        return "stage:" + client["stage"]
    return "completed" if client["status"] == "ok" else "status:" + client["status"]


def add(expected, key, n=1):
    expected[key] = expected.get(key, 0) + n


def expected_round_marks(rounds, clients, expected, run):
    by_round = {}
    for c in clients:
        by_round.setdefault(c["round"], []).append(c)
    for r in rounds:
        if r["test_accuracy"] >= 0:
            add(expected, ("accuracy", "test_accuracy", run))
        if r["test_loss"] >= 0:
            add(expected, ("loss", "test_loss", run))
        if r["federated_eval_samples"] > 0:
            add(expected, ("accuracy", "federated_eval_accuracy", run))
            add(expected, ("loss", "federated_eval_loss", run))
        committed = r["outcome"] == "committed"
        if committed:
            add(expected, ("loss", "train_loss", run))
        if committed and r["aggregation"] == "plain" and any(
                c["status"] == "ok" and c["num_samples"] > 0 for c in by_round.get(r["round"], [])):
            add(expected, ("accuracy", "train_accuracy", run))
        for series in ("selected", "participants", "dropped"):
            add(expected, ("participation", series, run))
        add(expected, ("round-time", "seconds", run))
        if r["clock_seconds"] > 0:
            add(expected, ("round-time", "clock_seconds", run))
        if r["coordinator_seconds"] > 0:
            add(expected, ("round-time", "coordinator_seconds", run))
        for cat in {category(c) for c in by_round.get(r["round"], [])}:
            add(expected, ("dropouts", cat, run))


def expected_client_marks(clients, expected, run):
    samples, upload, download = {}, {}, {}
    for c in clients:
        samples[c["client"]] = max(samples.get(c["client"], 0), c["num_samples"])
        upload[c["client"]] = upload.get(c["client"], 0) + c.get("upload_bytes", 0)
        download[c["client"]] = download.get(c["client"], 0) + c.get("download_bytes", 0)
    add(expected, ("client-samples", "samples", run), sum(1 for v in samples.values() if v > 0))
    add(expected, ("client-bytes", "upload", run), sum(1 for v in upload.values() if v > 0))
    add(expected, ("client-bytes", "download", run), sum(1 for v in download.values() if v > 0))
    # Label skew: each client's latest shared label counts, a mark per
    # label it has samples of.
    labels = {}
    for c in sorted(clients, key=lambda c: c["round"]):
        if c.get("label_counts"):
            labels[c["client"]] = [int(v) for v in c["label_counts"].split(",")]
    for counts in labels.values():
        for label, n in enumerate(counts):
            if n > 0:
                add(expected, ("label-skew", f"label:{label}", run))


def expected_timing_marks(stages, ranks, expected, run):
    seconds = {}  # (round, stage): its seconds in that round.
    for s in stages:
        seconds[(s["round"], s["stage"])] = seconds.get((s["round"], s["stage"]), 0) + s["seconds"]
    for (_, stage), total in seconds.items():
        add(expected, ("stage-time", stage, run), 1 if total > 0 else 0)
    rounds_with_stages = len({s["round"] for s in stages})
    add(expected, ("bytes", "bytes_in", run), rounds_with_stages)
    add(expected, ("bytes", "bytes_out", run), rounds_with_stages)
    totals = {}
    for k in ranks:
        if k["seconds"] > 0:
            add(expected, ("rank-throughput", f"rank-{k['rank']}", run))
        t = totals.setdefault(k["rank"], [0.0, 0.0, 0.0])
        t[0] += k["compute_seconds"]
        t[1] += k["comm_seconds"]
        t[2] += k["seconds"]
    for compute, comm, seconds in totals.values():
        add(expected, ("rank-time", "compute", run), 1 if compute > 0 else 0)
        add(expected, ("rank-time", "comm", run), 1 if comm > 0 else 0)
        add(expected, ("rank-time", "other", run), 1 if seconds - compute - comm > 0 else 0)


def expected_marks(run_dirs):
    """(plot, series, run) -> marks, from the stores alone."""
    expected = {}
    for run, run_dir in enumerate(run_dirs):
        db = open_ro(run_dir)
        rounds = table_rows(db, "rounds")
        clients = table_rows(db, "round_clients")
        expected_round_marks(rounds, clients, expected, run)
        expected_client_marks(clients, expected, run)
        expected_timing_marks(table_rows(db, "round_stages"), table_rows(db, "round_ranks"),
                              expected, run)
        db.close()
    return {k: v for k, v in expected.items() if v > 0}


# --- The rendered page --------------------------------------------------------------------

class MarkCounter(html.parser.HTMLParser):
    """Counts the <circle> and <rect> children of each <g class="series"> by
    (data-plot of its figure, data-series, data-run); notes the charts that say
    they have no data, and every src/href."""

    def __init__(self):
        super().__init__()
        self.marks, self.plots, self.nodata, self.links = {}, [], [], []
        self.plot, self.series = None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for name in ("src", "href", "xlink:href"):
            if name in a:
                self.links.append(a[name])
        if tag == "figure" and "data-plot" in a:
            self.plot = a["data-plot"]
            self.plots.append(self.plot)
            if "nodata" in a.get("class", ""):
                self.nodata.append(self.plot)
        elif tag == "g" and "series" in a.get("class", "").split():
            self.series = (self.plot, a["data-series"], int(a["data-run"]))
            self.marks.setdefault(self.series, 0)
        elif tag in ("circle", "rect") and self.series:
            self.marks[self.series] += 1

    def handle_endtag(self, tag):
        if tag == "g":
            self.series = None
        elif tag == "figure":
            self.plot = None


def chromium_bin():
    path = shutil.which("chromium")
    if not path:
        raise AssertionError("chromium is not installed: run scripts/setup.sh (it installs "
                             "Debian's chromium, which this test renders the report in)")
    return path


def render(page, out_dir, tag):
    """Renders `page` in headless Chromium: (DOM after rendering, screenshot path,
    the page's own network requests as URLs)."""
    profile = os.path.join(out_dir, f"chromium-{tag}")
    netlog = os.path.join(out_dir, f"{tag}.netlog.json")
    shot = os.path.join(out_dir, f"{tag}.png")
    argv = [chromium_bin(), "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={profile}", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-extensions",
            "--disable-default-apps", "--no-pings",
            # Nothing can leave the machine, whatever the page or the browser asks for.
            "--proxy-server=http://127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--log-net-log={netlog}", f"--screenshot={shot}", "--window-size=1280,4000",
            "--dump-dom", "file://" + os.path.abspath(page)]
    env = dict(os.environ, HOME=out_dir)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"chromium exited {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout, shot, page_requests(netlog)


def page_requests(netlog):
    """The URLs of the network requests the page made. Chromium's own service calls
    (component updater, account check) come from the browser process and carry no
    User-Agent header; every request of a page's renderer does."""
    with open(netlog) as f:
        log = json.load(f)
    types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = []
    for e in log["events"]:
        if types.get(e["type"]) != "CORS_REQUEST" or "params" not in e:
            continue
        headers = e["params"].get("request_headers", {}).get("headers", [])
        if any(h.lower().startswith("user-agent:") for h in headers):
            urls.append(e["params"].get("url", "?"))
    return urls


def check_png(shot):
    with open(shot, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{shot}: not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 4000), f"{shot}: {width}x{height}"
    assert len(data) > 50_000, f"{shot}: {len(data)} bytes, an empty page?"
    return len(data)


def check_page(page, run_dirs, out_dir, tag):
    with open(page) as f:
        text = f.read()
    for bad in ("http://", "https://", "<script", "@import", "url("):
        assert bad not in text, f"{page} contains {bad!r}"
    dom, shot, requests = render(page, out_dir, tag)
    counter = MarkCounter()
    counter.feed(dom)
    assert not requests, f"{tag}: the page requested {requests}"
    assert not [l for l in counter.links if not l.startswith("#")], counter.links
    expected = expected_marks(run_dirs)
    drawn = {k: v for k, v in counter.marks.items() if v > 0}
    only_drawn = {k: v for k, v in drawn.items() if expected.get(k) != v}
    only_stored = {k: v for k, v in expected.items() if drawn.get(k) != v}
    assert drawn == expected, (f"{tag}: marks drawn != the store's figures\n"
                               f"drawn: {only_drawn}\nstored: {only_stored}")
    # A chart without marks must say so in words.
    for plot in set(counter.plots):
        if not any(k[0] == plot for k in drawn):
            assert plot in counter.nodata, f"{tag}: {plot} draws nothing and says nothing"
    size = check_png(shot)
    print(f"{tag}: {len(text)} bytes, {sum(drawn.values())} marks in {len(drawn)} series, "
          f"all as stored; screenshot {size} bytes; nodata: {sorted(set(counter.nodata))}")
    per_plot = {}
    for (plot, series, run), n in sorted(drawn.items()):
        per_plot.setdefault(plot, []).append(f"{series}@{run}={n}")
    for plot, series in per_plot.items():
        print(f"  {plot}: {' '.join(series)}")
    return drawn, len(text)


# What `cohort report` changed in a run directory (it must change nothing):
# collected, so that the other checks still run, and asserted at the end.
CHANGED = []


def changes(run_dir, before):
    after = snapshot(run_dir)
    out = [f"{p} {'changed' if p in after else 'removed'}"
           for p in before if before[p] != after.get(p)]
    out += [f"{p} created" for p in after if p not in before]
    CHANGED.extend(out)


def snapshot(run_dir):
    """Every file's bytes and mtime below `run_dir`."""
    out = {}
    for root, _, files in os.walk(run_dir):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[p] = (f.read(), os.stat(p).st_mtime_ns)
    return out


def report(ws, run_dirs, name):
    out = ws.path(name)
    before = {d: snapshot(d) for d in run_dirs}
    args = ["report", "-o", out]
    for d in run_dirs:
        args += ["--run-dir", d]
    printed = cohort(*args).stdout
    assert printed.startswith(f"wrote {out}: {len(run_dirs)} run"), printed
    for d in run_dirs:
        changes(d, before[d])
    return out


def detector_sees_a_fetch(ws):
    """The network check can fail: a page with an outside image is caught."""
    control = ws.path("control.html")
    write(control, "<!DOCTYPE html><html><body><img src=\"http://example.invalid/a.png\">"
                   "</body></html>")
    _, _, requests = render(control, ws.dir, "control")
    assert requests == ["http://example.invalid/a.png"], requests


def test_browser():
    chromium_bin()  # Before any run: a missing browser fails at once, saying what to do.
    ws = Workspace()
    try:
        start = time.monotonic()
        ws.partition()
        ws.federated_run()
        ws.simulated_run()
        ws.data_parallel_run()
        print(f"runs made in {time.monotonic() - start:.1f} s")
        detector_sees_a_fetch(ws)
        fed, sim, dp = ws.path("fed"), ws.path("sim"), ws.path("dp")
        drawn, _ = check_page(report(ws, [fed], "fed.html"), [fed], ws.dir, "federated")
        assert drawn[("accuracy", "federated_eval_accuracy", 0)] == 3, drawn
        assert drawn[("accuracy", "train_accuracy", 0)] == 3, drawn
        drawn, size = check_page(report(ws, [sim], "sim.html"), [sim], ws.dir, "simulated")
        assert size < 1_000_000, f"the {SIM_ROUNDS}-round page weighs {size} bytes"
        assert any(k[0] == "dropouts" and k[1].startswith("stage:") for k in drawn), drawn
        assert drawn[("loss", "train_loss", 0)] > 0, drawn
        drawn, _ = check_page(report(ws, [dp], "dp.html"), [dp], ws.dir, "data-parallel")
        assert drawn[("participation", "participants", 0)] == 3, drawn
        drawn, _ = check_page(report(ws, [fed, sim, dp], "all.html"), [fed, sim, dp], ws.dir,
                              "overlaid")
        assert {k[2] for k in drawn if k[0] == "accuracy"} == {0, 1, 2}, drawn
        with open(ws.path("all.html")) as f:
            text = f.read()
        # The configs' differences, field by field.
        assert "<td>rounds.num_rounds</td><td>3</td>" \
               f"<td>{SIM_ROUNDS}</td>" in text, "no config diff row"
        print(f"browser test: {time.monotonic() - start:.1f} s")
    finally:
        ws.close()


def refused(ws, run_dir, want, out=None):
    """`cohort report --run-dir run_dir` fails saying `want` about run_dir, writes
    no file and changes nothing in run_dir."""
    default_out = ws.path("out", "bad.html")
    out = out or default_out
    before = snapshot(run_dir) if os.path.isdir(run_dir) else None
    res = cohort("report", "--run-dir", run_dir, "-o", out, check=False)
    assert res.returncode != 0, f"{run_dir}: exit 0\n{res.stdout}"
    # An error about the output names the output; one about a run, the run's directory.
    assert (out != default_out or run_dir in res.stderr) and want in res.stderr, \
        f"{run_dir}: {res.stderr!r}"
    assert not os.listdir(ws.path("out")), f"{run_dir}: left {os.listdir(ws.path('out'))}"
    if before is not None:
        changes(run_dir, before)
    print(f"refused: {res.stderr.strip().splitlines()[-1]}")


def damaged_copies(ws, good):
    """Copies of a good run directory whose run.db is garbled, cut or empty of runs."""
    size = os.path.getsize(os.path.join(good, "run.db"))
    for name in ("garbled", "cut", "middle", "norun"):
        shutil.copytree(good, ws.path(name))
    with open(ws.path("garbled", "run.db"), "r+b") as f:
        f.write(b"\xde\xad" * 512)  # The header, among others.
    os.truncate(ws.path("cut", "run.db"), size // 2)
    with open(ws.path("middle", "run.db"), "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 8192))  # Every page but the first and the last.
    db = sqlite3.connect(ws.path("norun", "run.db"))
    db.execute("DELETE FROM runs")
    db.commit()
    db.close()


def test_bad_input():
    ws = Workspace()
    try:
        ws.partition()
        config = ws.federated_config("sim.textproto", 2, "PLAIN")
        cohort("simulate", "--config", config, "--run-dir", ws.path("good"), "--shards",
               ws.path("shards"))
        cohort("keygen", "--out", ws.path("keys"), "--name", "client-000")
        os.makedirs(ws.path("out"))
        damaged_copies(ws, ws.path("good"))
        refused(ws, ws.path("garbled"), "run.db: not a Cohort run store (not an SQLite database)")
        refused(ws, ws.path("cut"), "run.db: the run store is damaged (")
        refused(ws, ws.path("middle"), "run.db: the run store is damaged (")
        refused(ws, ws.path("norun"), "holds no run yet")
        refused(ws, ws.path("shards"), "no run database (run.db) in this directory; it holds "
                f"{CLIENTS + 1} shard files: a `cohort partition` output, not a run directory")
        refused(ws, ws.path("keys"), "key files: a keys or allowlist directory")
        refused(ws, ws.dir, "run directories below it")
        refused(ws, ws.path("nowhere"), "no such run directory")
        refused(ws, ws.path("sim.textproto"), "not a directory")
        # One bad directory among good ones: still no page.
        res = cohort("report", "--run-dir", ws.path("good"), "--run-dir", ws.path("cut"), "-o",
                     ws.path("out", "two.html"), check=False)
        assert res.returncode != 0 and not os.listdir(ws.path("out")), res.stderr
        # Where the page cannot go.
        refused(ws, ws.path("good"), "cannot write " + ws.path("none", "r.html"),
                out=ws.path("none", "r.html"))
        refused(ws, ws.path("good"), "a report never writes into a run's own files",
                out=ws.path("good", "run.db"))
        refused(ws, ws.path("good"), "is a directory", out=ws.path("out"))
        report(ws, [ws.path("good")], "good.html")  # And the good one reads, unchanged.
    finally:
        ws.close()


def main():
    if not COHORT or len(sys.argv) < 3:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    {"browser": test_browser, "bad_input": test_bad_input}[sys.argv[2]]()
    assert not CHANGED, "cohort report changed files in run directories:\n  " + "\n  ".join(CHANGED)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
