"""The `cohort` backend for torch.distributed.

    import cohort.distributed  # registers the backend
    torch.distributed.init_process_group("cohort", ...)

Collectives run over Cohort's: shared memory between the ranks of one host,
TCP between hosts (authenticated with Cohort's keys). all_reduce, reduce,
reduce_scatter (SUM, PRODUCT, MIN, MAX; AVG on floating point; BAND, BOR,
BXOR on integers; float32, bfloat16, float16, int32, int64), broadcast, all_gather, gather,
scatter, all_to_all and barrier, on dense CPU tensors; anything else (send
and recv included) raises an error naming what it was given. Every collective has finished when it
returns, or raised: a rank that died or did not arrive within
init_process_group's timeout is an error on every other rank, never a hang.

The ranks meet through the store torch hands the backend (what torchrun or
init_method set up): rank 0 publishes where the others find it. Environment:

  COHORT_TRANSPORT   auto (default: shared memory when every rank is on this
                     host, tcp otherwise), shm or tcp
  COHORT_HOST        the address the other hosts reach this rank at (tcp;
                     default 127.0.0.1)
  COHORT_IDENTITY, COHORT_ALLOW, COHORT_MASTER_KEY
                     this rank's key file, the allowlist directory and rank
                     0's public key (tcp between hosts: all three), or
  COHORT_INSECURE=1  tcp without authentication (a trusted network only)
"""
import os
import shutil
import socket
import tempfile
from datetime import timedelta

import torch.distributed as dist

from cohort.distributed import _c10d

__all__ = ["BACKEND", "ProcessGroupCohort", "create_process_group"]

BACKEND = "cohort"
ProcessGroupCohort = _c10d.ProcessGroupCohort

_KEY = "cohort/"


def _env(name, default=""):
    return os.environ.get(name, default)


def _free_port(host):
    # The port the rendezvous binds next: free now (a race with another
    # process taking it in between fails the join with the address named).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _choose_master(store, size, transport, host):
    """Rank 0: where the group meets, and over which transport."""
    hosts = {store.get(f"{_KEY}host/{r}").decode() for r in range(size)}
    if transport == "auto":
        transport = "shm" if len(hosts) == 1 else "tcp"
    if transport == "shm":
        if len(hosts) > 1:
            raise RuntimeError(f"cohort process group: COHORT_TRANSPORT=shm, but the ranks run "
                               f"on {len(hosts)} hosts ({', '.join(sorted(hosts))})")
        # Short (Unix socket paths end at ~107 bytes) and private to this group.
        folder = tempfile.mkdtemp(prefix="cohort-pg-", dir="/tmp")
        return f"ipc://{folder}/m", "shm", folder
    if host in ("127.0.0.1", "localhost") and len(hosts) > 1:
        # The other hosts would dial their own loopback and wait out the
        # whole timeout.
        raise RuntimeError(f"cohort process group: the ranks run on {len(hosts)} hosts "
                           f"({', '.join(sorted(hosts))}), and rank 0 would be reached at "
                           f"{host}, which only its own host can: set COHORT_HOST to the "
                           f"address the other hosts reach rank 0 at")
    return f"tcp://{host}:{_free_port(host)}", "tcp", None


def _config(rank, size, timeout):
    config = _c10d.GroupConfig()
    config.rank, config.size = rank, size
    config.host = _env("COHORT_HOST", "127.0.0.1")
    config.identity_file = _env("COHORT_IDENTITY")
    config.allow_dir = _env("COHORT_ALLOW")
    config.master_key_file = _env("COHORT_MASTER_KEY")
    config.insecure = _env("COHORT_INSECURE") == "1"
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    config.timeout_ms = max(1, int(seconds * 1000))
    return config


def create_process_group(store, rank, size, timeout):
    """The backend's creator (torch.distributed calls it from
    init_process_group and new_group)."""
    config = _config(rank, size, timeout)
    transport = _env("COHORT_TRANSPORT", "auto")
    if transport not in ("auto", "shm", "tcp"):
        raise ValueError(f"cohort process group: COHORT_TRANSPORT={transport!r}: expected "
                         f"auto, shm or tcp")
    store.set(f"{_KEY}host/{rank}", socket.gethostname())
    folder = None
    if rank == 0:
        try:
            master, transport, folder = _choose_master(store, size, transport, config.host)
        except RuntimeError as e:
            # Every rank raises it at once, rather than waiting for a master.
            store.set(f"{_KEY}master", f"error {e}")
            raise
        store.set(f"{_KEY}master", f"{transport} {master}")
    transport, master = store.get(f"{_KEY}master").decode().split(" ", 1)
    if transport == "error":
        raise RuntimeError(master)
    if transport == "tcp" and not config.identity_file and not config.insecure:
        raise RuntimeError(
            "cohort process group: ranks on several hosts meet over tcp, which authenticates "
            "them: set COHORT_IDENTITY, COHORT_ALLOW and COHORT_MASTER_KEY (or COHORT_INSECURE=1 "
            "on a trusted network)")
    config.master, config.transport = master, transport
    try:
        return _c10d.create(config)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, create_process_group)
