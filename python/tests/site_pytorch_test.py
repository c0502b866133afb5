"""A site from PyTorch: one federated client (rank 0, cohort.Client) whose
fit trains on two DistributedDataParallel ranks over the `cohort` backend
(examples/python/site_pytorch.py), in a run with a real coordinator on
127.0.0.1 and another Python client."""

import os
import re
import signal
import sqlite3
import sys
import unittest

from harness import Run

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.path.join(HERE, "..", "..", "examples", "python", "site_pytorch.py")
ROUNDS = 3
SITE_SAMPLES = 480  # 240 on each of the two ranks.
OTHER_SAMPLES = 160
# What every rank prints after each round.
ROUND_LINE = re.compile(r"site rank (\d+)/(\d+) round (\d+): trained (\d+) of the site's (\d+) "
                        r"samples, loss ([0-9.]+), accuracy [0-9.]+, model ([0-9a-f]{16})")


def start_site(run, name, timeout_s=30):
    """A site of two ranks: one process, rank 0, which starts rank 1 (--ranks 2)."""
    return run.spawn([sys.executable, SITE, "site", "--ranks", "2", "--coordinator", run.endpoint,
                      "--insecure", "--plain", "--name", name, "--samples", str(SITE_SAMPLES),
                      "--hidden", "8", "--timeout", str(timeout_s)], f"{name}.log")


def start_ranks(run, name, world=2, timeout_s=30):
    """The site's ranks started one by one, meeting through a file."""
    return [run.spawn([sys.executable, SITE, "site", "--rank", str(r), "--world-size", str(world),
                       "--init-method", f"file://{run.path(name + '.store')}",
                       "--coordinator", run.endpoint, "--insecure", "--plain", "--name", name,
                       "--samples", str(SITE_SAMPLES), "--hidden", "8",
                       "--timeout", str(timeout_s)], f"{name}-rank{r}.log")
            for r in range(world)]


def round_lines(process, rank):
    """{round: (world, rank's samples, site's samples, loss, checksum)} of `rank`."""
    out = {}
    for m in ROUND_LINE.finditer(process.output()):
        who, world, r, mine, site, loss, digest = m.groups()
        if int(who) == rank:
            out[int(r)] = (int(world), int(mine), int(site), float(loss), digest)
    return out


def client_rows(run, client):
    """{round: (status, reason, num_samples)} from the coordinator's record."""
    db = sqlite3.connect(f"file:{run.path('run/run.db')}?mode=ro", uri=True)
    try:
        return {r: (s, why, n) for r, s, why, n in db.execute(
            "SELECT round, status, reason, num_samples FROM round_clients WHERE client = ?",
            (client,))}
    finally:
        db.close()


class SiteTest(unittest.TestCase):
    def test_a_site_of_two_ddp_ranks_is_one_client(self):
        run = Run("site")
        self.addCleanup(run.close)
        config = run.write_config(ROUNDS, "min_clients: 2 start_clients: 2 round_deadline_s: 60",
                                  extra="secagg { aggregation: PLAIN }")
        run.start_coordinator(config)
        site = start_site(run, "site")
        other = run.start_python_client("other", "--plain", "--samples", str(OTHER_SAMPLES))

        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        self.assertEqual(site.wait(30), 0, site.output())
        self.assertEqual(other.wait(30), 0, other.output())
        out = site.output()
        self.assertIn("site rank 0/2: run finished", out)
        self.assertIn("site rank 1/2: stopped", out)  # Told to stop by rank 0 ...
        self.assertIn("site rank 1/2: exited 0", out)  # ... and gone, exit code 0.

        # Both ranks trained every round, each on its half of the site's
        # data, and DDP kept their models identical (the same bits).
        lines = [round_lines(site, 0), round_lines(site, 1)]
        for rank, got in enumerate(lines):
            self.assertEqual(sorted(got), list(range(1, ROUNDS + 1)), f"rank {rank}: {out}")
            for r, (world, mine, total, _, _) in got.items():
                self.assertEqual(world, 2, (r, got[r]))
                self.assertEqual(mine, SITE_SAMPLES // 2, (r, got[r]))
                self.assertEqual(total, SITE_SAMPLES, (r, got[r]))
        for r in range(1, ROUNDS + 1):
            self.assertEqual(lines[0][r][4], lines[1][r][4], f"round {r}: the ranks' models")
            self.assertEqual(lines[0][r][3], lines[1][r][3], f"round {r}: the site's loss")
        self.assertEqual(len({lines[0][r][4] for r in lines[0]}), ROUNDS, "a new model each round")
        self.assertLess(lines[0][ROUNDS][3], lines[0][1][3], "the site's loss falls")

        # The coordinator saw one client for the site, weighted by all of
        # its samples, in every round.
        rounds = run.rounds()
        self.assertEqual(sorted(rounds), list(range(1, ROUNDS + 1)))
        for row in rounds.values():
            self.assertEqual(row["outcome"], "committed", row)
            self.assertEqual(row["participants"], 2, row)
            self.assertEqual(row["dropped_clients"], [], row)
        site_rows, other_rows = client_rows(run, "site"), client_rows(run, "other")
        for r in range(1, ROUNDS + 1):
            self.assertEqual(site_rows[r][0], "ok", site_rows[r])
            self.assertEqual(site_rows[r][2], SITE_SAMPLES, site_rows[r])
            self.assertEqual(other_rows[r][2], OTHER_SAMPLES, other_rows[r])

    def test_a_killed_rank_takes_its_site_out_of_the_run(self):
        run = Run("site-kill")
        self.addCleanup(run.close)
        config = run.write_config(ROUNDS, "min_clients: 2 start_clients: 3 round_deadline_s: 60",
                                  extra="secagg { aggregation: PLAIN }")
        run.start_coordinator(config)
        site = start_site(run, "site")
        others = [run.start_python_client(n, "--plain", "--samples", str(OTHER_SAMPLES))
                  for n in ("other-a", "other-b")]
        started = site.wait_for_line("site rank 1/2: ", timeout=90)
        self.assertIsNotNone(started, site.output())
        pid = int(re.search(r"\(pid (\d+)\)", started).group(1))
        self.assertIsNotNone(site.wait_for_line("site rank 1/2 round 1: trained", timeout=90),
                             site.output())
        # SIGKILL after round 1 (rank 0 reaps it): round 2's fit meets a dead rank.
        os.kill(pid, signal.SIGKILL)

        # Rank 0's fit fails in the next round (2, unless rank 1 was quicker
        # than this test) naming the dead rank; the process group cannot be
        # used again, so rank 0 leaves the run and exits 1.
        self.assertEqual(site.wait(60), 1, site.output())
        out = site.output()
        failed = re.search(r"site rank 0: round (\d+): site training failed: .*"
                           r"rank 1 is gone \(its process exited\); the site's process group "
                           r"cannot be used again: leaving the run", out)
        self.assertIsNotNone(failed, out)
        dead = int(failed.group(1))
        self.assertIn(dead, (2, 3), out)
        self.assertIn(f"site rank 0: left the run after round {dead}: ", out)
        self.assertNotIn("run finished", out)

        # The run goes on without the site.
        self.assertEqual(run.coordinator.wait(120), 0, run.coordinator.output())
        for o in others:
            self.assertEqual(o.wait(30), 0, o.output())
        rounds = run.rounds()
        self.assertEqual(sorted(rounds), list(range(1, ROUNDS + 1)))
        site = client_rows(run, "site")
        for r, row in rounds.items():
            self.assertEqual(row["outcome"], "committed", row)
            self.assertEqual(row["participants"], 3 if r < dead else 2, row)
        self.assertIn("site", rounds[dead]["dropped_clients"], rounds[dead])
        for r in range(1, dead):
            self.assertEqual(site[r][0], "ok", site[r])
        # Its fit ended the round for it, and the coordinator records why
        # (the SystemExit's message); its Goodbye may land in the next
        # round, which the site is then no part of either.
        self.assertRegex(site[dead][1], r"^left: training failed: fit exited: SystemExit: round "
                                        rf"{dead}: site training failed: .*rank 1 is gone")
        for r in range(dead + 1, ROUNDS + 1):
            self.assertNotEqual(site.get(r, ("absent",))[0], "ok", site.get(r))

    def test_a_rank_that_loses_rank_0_exits(self):
        run = Run("site-orphan")
        self.addCleanup(run.close)
        # Two clients to start: the site waits for its first round.
        config = run.write_config(1, "min_clients: 2 start_clients: 2 round_deadline_s: 60",
                                  extra="secagg { aggregation: PLAIN }")
        run.start_coordinator(config)
        rank0, rank1 = start_ranks(run, "site", timeout_s=600)
        for rank in (rank0, rank1):
            self.assertIsNotNone(rank.wait_for_line("of the site's 480 samples", timeout=60),
                                 rank.output())
        rank0.kill()  # SIGKILL (and reaped) while rank 1 waits for the next round.
        # At once, not after the group's 600 s timeout.
        self.assertEqual(rank1.wait(30), 1, rank1.output())
        self.assertIn("site rank 1: lost the site's process group", rank1.output())
        self.assertIn("rank 0 is gone (its process exited)", rank1.output())


if __name__ == "__main__":
    os.environ["COHORT_BIN"] = sys.argv.pop(1)
    unittest.main()
