"""Issue 33, item 1: lineage and timings in the store, read back from run.db
with Python's own sqlite3 and hashlib (not through Cohort's code), after
real runs on 127.0.0.1: a SecAgg+ federated run of native clients, and a
data-parallel run of two `cohort launch` ranks.

  lineage_test.py COHORT_BINARY
"""

import hashlib
import json
import os
import sqlite3
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Run, cohort_bin  # noqa: E402

SECURE_STAGES = ["commit_seed", "advertise_keys", "share_keys", "check_shares",
                 "confirm_checked", "masked_input", "consistency", "unmasking"]


def read_store(path):
    """Every row of the tables the run wrote, as dicts, opened read-only."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    tables = {}
    for table in ("runs", "rounds", "round_clients", "round_stages", "round_ranks"):
        tables[table] = [dict(r) for r in db.execute(f"SELECT * FROM {table}")]
    db.close()
    return tables


def shard_label_counts(path):
    """Samples per class of a shard file, read from its layout
    (datasets/shard.h: num_samples at 16, num_classes at 28, int32 labels
    from 48)."""
    with open(path, "rb") as f:
        data = f.read()
    n, = struct.unpack_from("<Q", data, 16)
    classes, = struct.unpack_from("<I", data, 28)
    counts = [0] * classes
    for label in struct.unpack_from(f"<{n}i", data, 48):
        counts[label] += 1
    return counts


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class LineageTest(unittest.TestCase):
    def test_a_secure_run_stores_its_lineage_stage_timings_and_traffic(self):
        run = Run("lineage-fl")
        self.addCleanup(run.close)
        names = [f"n{k}" for k in range(4)]
        run.keygen(["coordinator"] + names, allow=names)
        run.cohort("partition", "--format", "synthetic", "--samples", "400", "--test-samples",
                   "100", "--features", "20", "--classes", "4", "--clients", "4", "--scheme",
                   "iid", "--seed", "1", "--out", run.path("shards"))
        test = run.path("shards/test.shard")
        config = run.write_config(2, "min_clients: 4 start_clients: 4 round_deadline_s: 60",
                                  extra=f'data {{ test_shard: "{test}" }} '
                                        'secagg { aggregation: SECAGG_PLUS }')
        run.start_coordinator(config, curve=True)
        shards = {name: run.path(f"shards/client-00{k}.shard") for k, name in enumerate(names)}
        # n0 and n1 share their label counts (opt-in); n2 and n3 do not.
        clients = [run.spawn([cohort_bin(), "client", "--coordinator", run.endpoint, "--data",
                              shards[name], "--identity", run.path(f"keys/{name}.key"),
                              "--coordinator-key", run.path("keys/coordinator.pub")]
                             + (["--share-label-counts"] if name in ("n0", "n1") else []),
                             f"{name}.log") for name in names]
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for c in clients:
            self.assertEqual(c.wait(30), 0, c.output())

        db = read_store(run.path("run/run.db"))
        info = db["runs"][0]
        self.assertEqual(info["config_sha256"],
                         hashlib.sha256(info["config"].encode()).hexdigest())
        self.assertEqual(info["world_size"], 4)
        self.assertEqual(info["devices"], "cpu")
        # Each client's rows carry the digest of the shard it trained on.
        for row in db["round_clients"]:
            self.assertEqual(row["data_sha256"], sha256_file(shards[row["client"]]), row)
            shared = ",".join(map(str, shard_label_counts(shards[row["client"]])))
            self.assertEqual(row["label_counts"],
                             shared if row["client"] in ("n0", "n1") else "", row)
        model_bytes = 204 * 4  # The mlp 20-8-4's parameters, as float32.
        rounds = {r["round"]: r for r in db["rounds"]}
        for rnd in (1, 2):
            stages = sorted((s for s in db["round_stages"] if s["round"] == rnd),
                            key=lambda s: s["position"])
            self.assertEqual([s["stage"] for s in stages], SECURE_STAGES + ["aggregate"])
            # The protocol stages split the round's clock time between them.
            self.assertAlmostEqual(sum(s["seconds"] for s in stages[:-1]),
                                   rounds[rnd]["clock_seconds"], delta=2e-3)
            self.assertTrue(all(s["seconds"] >= 0 for s in stages))
            masked = stages[SECURE_STAGES.index("masked_input")]
            self.assertGreaterEqual(masked["bytes_in"], 4 * model_bytes)
            # Every byte came from, or went to, one of the four clients.
            rows = [c for c in db["round_clients"] if c["round"] == rnd]
            self.assertEqual(len(rows), 4)
            self.assertEqual(sum(c["upload_bytes"] for c in rows),
                             sum(s["bytes_in"] for s in stages))
            self.assertEqual(sum(c["download_bytes"] for c in rows),
                             sum(s["bytes_out"] for s in stages))
            for c in rows:
                self.assertGreater(c["upload_bytes"], model_bytes, c)
                self.assertGreater(c["download_bytes"], model_bytes, c)  # Its task's model.
        # `cohort status` shows the lineage, and --json the stages and bytes.
        self.assertIn(f"config sha256 {info['config_sha256']}  world size 4  devices cpu",
                      run.status())
        status = run.rounds()
        self.assertEqual([s["stage"] for s in status[1]["stages"]],
                         SECURE_STAGES + ["aggregate"])
        self.assertEqual(status[1]["bytes_in"],
                         sum(s["bytes_in"] for s in db["round_stages"] if s["round"] == 1))

    def test_a_data_parallel_run_stores_every_ranks_share_of_each_epoch(self):
        run = Run("lineage-dp")
        self.addCleanup(run.close)
        run.cohort("partition", "--format", "synthetic", "--samples", "300", "--test-samples",
                   "60", "--features", "20", "--classes", "4", "--clients", "1", "--seed", "2",
                   "--out", run.path("shards"))
        config = run.path("dp.textproto")
        with open(config, "w") as f:
            f.write('seed: 3\nmode: DATA_PARALLEL\n'
                    f'data {{ train_shard: "{run.path("shards/client-000.shard")}" '
                    f'test_shard: "{run.path("shards/test.shard")}" }}\n'
                    'model { arch: "mlp" input_dim: 20 num_classes: 4 hidden: 8 }\n'
                    'train { batch_size: 10 learning_rate: 0.05 }\n'
                    'data_parallel { epochs: 2 timeout_s: 30 }\n')
        launch = run.spawn([cohort_bin(), "launch", "--nproc", "2", "--config", config,
                            "--run-dir", run.path("run")], "launch.log")
        self.assertEqual(launch.wait(120), 0, launch.output())
        db = read_store(run.path("run/run.db"))
        info = db["runs"][0]
        self.assertEqual(info["world_size"], 2)
        self.assertEqual(info["devices"], "cpu (OpenBLAS); cpu (OpenBLAS)")
        self.assertEqual(info["config_sha256"],
                         hashlib.sha256(info["config"].encode()).hexdigest())
        for epoch in (1, 2):
            ranks = sorted((r for r in db["round_ranks"] if r["round"] == epoch),
                           key=lambda r: r["rank"])
            self.assertEqual([r["rank"] for r in ranks], [0, 1])
            # Global batches of 20 over 300 samples: 15 steps, each rank half of each.
            self.assertEqual([r["steps"] for r in ranks], [15, 15])
            self.assertEqual([r["samples"] for r in ranks], [150, 150])
            for r in ranks:
                self.assertEqual(r["device"], "cpu (OpenBLAS)")
                self.assertGreater(r["comm_seconds"], 0)
                self.assertGreater(r["compute_seconds"], 0)
                self.assertAlmostEqual(r["compute_seconds"] + r["comm_seconds"], r["seconds"],
                                       delta=2e-6)
        status = run.rounds()
        self.assertEqual([r["samples"] for r in status[2]["ranks"]], [150, 150])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
