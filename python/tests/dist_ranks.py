"""Runs a function on N ranks of a torch.distributed group, each a forked
process on this host, meeting through a FileStore in a fresh folder (no
port). Shared by the cohort-backend tests."""
import multiprocessing
import os
import queue
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import cohort.distributed  # noqa: F401  (registers the backend)

torch.set_num_threads(1)


def _rank_main(fn, rank, world, backend, store_path, timeout_s, results):
    try:
        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        out = fn(rank, world)
        results.put((rank, "ok", out))
    except BaseException as e:  # noqa: B902  every failure goes back to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        results.close()
        results.join_thread()
        # No destroy_process_group: a failed group must not wait at exit.
        os._exit(0)


def run_ranks(fn, world, backend="cohort", timeout_s=30, wait_s=120):
    """{rank: ("ok", value) or ("error", text)}; a rank that neither returns
    nor fails within wait_s is ("hung", None) (and killed)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="cohort-test-") as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=_rank_main,
                             args=(fn, r, world, backend, store, timeout_s, results))
                 for r in range(world)]
        for p in procs:
            p.start()
        out = {}
        deadline = time.monotonic() + wait_s
        while len(out) < world and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.5)
                out[rank] = (status, value)
            except queue.Empty:
                # is_alive() reaps a rank that died: a zombie would still
                # look alive to its peers.
                alive = [p.is_alive() for p in procs]
                if not any(alive) and results.empty():
                    break
        for r, p in enumerate(procs):
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            hung = p.is_alive()
            if hung:
                p.kill()
                p.join()
            out.setdefault(r, ("hung", None) if hung else ("died", p.exitcode))
    return out


def values(results, test):
    """The ranks' values, failing `test` with every rank's error text."""
    bad = {r: v for r, v in results.items() if v[0] != "ok"}
    if bad:
        test.fail("\n".join(f"rank {r}: {v[0]}: {v[1]}" for r, v in sorted(bad.items())))
    return [results[r][1] for r in sorted(results)]
