"""The `cohort` torch.distributed backend's collectives, at 2 to 4 ranks on
this host: every dtype's result under every reduce op, what it refuses (by
name), and that a rank
that dies or stalls is an error on every other rank within the timeout."""
import functools
import os
import signal
import time
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist

from dist_ranks import run_ranks, values

LARGE = 100_000  # Above the ring threshold (64 KiB of float32).
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)
INTS = (torch.int32, torch.int64)
OPS = {"product": (dist.ReduceOp.PRODUCT, torch.prod), "min": (dist.ReduceOp.MIN, torch.amin),
       "max": (dist.ReduceOp.MAX, torch.amax)}
BITWISE = {"band": (dist.ReduceOp.BAND, torch.bitwise_and),
           "bor": (dist.ReduceOp.BOR, torch.bitwise_or),
           "bxor": (dist.ReduceOp.BXOR, torch.bitwise_xor)}


def _small(rank, dtype):
    # Small integers: every partial sum is exact even in bfloat16.
    return (torch.arange(1000) % 7 + rank).to(dtype)


def _tiny(rank, dtype):
    # At most 5: a product over 4 ranks (180 at most) is exact in every dtype.
    return (torch.arange(1000) % 3 + rank + (rank == 0)).to(dtype)


def _bits(rank, dtype):
    return ((torch.arange(1000) * 37 + rank * 101) % 1024 - 300).to(dtype)


def _large(rank):
    return torch.randn(LARGE, generator=torch.Generator().manual_seed(rank))


def _reductions(rank, world):
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64):
        t = _small(rank, dtype)
        dist.all_reduce(t)
        out[f"sum {dtype}"] = (str(t.dtype), t.double().tolist())
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = _small(rank, dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out[f"avg {dtype}"] = (str(t.dtype), t.double().tolist())
    for dtype in DTYPES:
        for name, (op, _) in OPS.items():
            t = _tiny(rank, dtype)
            dist.all_reduce(t, op=op)
            out[f"{name} {dtype}"] = (str(t.dtype), t.double().tolist())
    for dtype in INTS:
        for name, (op, _) in BITWISE.items():
            t = _bits(rank, dtype)
            dist.all_reduce(t, op=op)
            out[f"{name} {dtype}"] = (str(t.dtype), t.tolist())
    t = torch.tensor([float("nan") if rank == 0 else 1.0, -0.0 if rank == 0 else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["max nan"] = t.view(torch.int32).tolist()
    t = torch.full((4,), 100_003 + rank, dtype=torch.int32)  # The product wraps.
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    out["product wraps"] = t.tolist()
    t = _large(rank)
    dist.all_reduce(t)
    out["large"] = t.numpy().tobytes()
    t = _large(rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["large max"] = t.numpy().tobytes()
    t = torch.full((6, 4), float(rank)).t()  # Not contiguous.
    dist.all_reduce(t)
    out["strided"] = t.tolist()
    return out


def _moves(rank, world):
    out = {}
    t = torch.full((5,), float(rank), dtype=torch.float64)
    dist.broadcast(t, src=world - 1)
    out["broadcast"] = t.tolist()
    t = torch.full((3 << 20,), rank, dtype=torch.uint8)  # Several segments.
    dist.broadcast(t, src=1)
    out["broadcast large"] = int(t.sum()) == (3 << 20)
    gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), 10 + rank, dtype=torch.int64))
    out["allgather"] = [g.tolist() for g in gathered]
    # Outputs of another shape with the input's count: each takes its own.
    shaped = [torch.zeros(6) for _ in range(world)]
    dist.all_gather(shaped, torch.full((2, 3), float(rank)))
    out["allgather reshaped"] = [g.tolist() for g in shaped]
    flat = torch.zeros(world * 2, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), dtype=torch.bfloat16))
    out["allgather into tensor"] = flat.tolist()
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    out["objects"] = objects
    dist.barrier()
    return out


def _outcomes(attempts):
    """Each call's error as the user sees it ("no error" if none), then an
    all-reduce: the group goes on after a refusal."""
    out = {}
    for name, call in attempts.items():
        try:
            call()
            out[name] = "no error"
        except Exception as e:  # noqa: B902
            out[name] = f"{type(e).__name__}: {e}"
    t = torch.ones(4)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    return out


def _refusals(rank, world):
    attempts = {
        "float64": lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64)),
        "premul": lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)),
        "band float": lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),
        "sparse": lambda: dist.all_reduce(torch.eye(3).to_sparse()),
        "avg int": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64),
                                           op=dist.ReduceOp.AVG),
        "two tensors": lambda: dist.distributed_c10d._get_default_group().allreduce(
            [torch.ones(2), torch.ones(2)]).wait(),
    }
    return _outcomes(attempts)


def _rooted(rank, world):
    """reduce, reduce_scatter, gather and scatter, rooted at the last rank."""
    root = world - 1
    out = {}
    for dtype in DTYPES:
        t = _tiny(rank, dtype)
        dist.reduce(t, dst=root, op=dist.ReduceOp.MIN)  # The root's values are the largest.
        out[f"reduce min {dtype}"] = t.double().tolist()
    t = _large(rank)
    dist.reduce(t, dst=root)
    out["reduce large"] = t.numpy().tobytes()
    t = torch.full((3,), float(rank + 1))
    dist.reduce(t, dst=root, op=dist.ReduceOp.AVG)
    out["reduce avg"] = t.tolist()
    parts = [torch.full((2, 3), rank * 10 + p, dtype=torch.int64) for p in range(world)]
    mine = torch.zeros(2, 3, dtype=torch.int64)
    dist.reduce_scatter(mine, parts)
    out["reduce_scatter"] = mine.tolist()
    whole = _large(rank)[: world * 1000].clone()
    kept = whole.clone()
    mine = torch.zeros(1000)
    dist.reduce_scatter_tensor(mine, whole, op=dist.ReduceOp.MIN)
    out["reduce_scatter tensor min"] = mine.numpy().tobytes()
    out["reduce_scatter input kept"] = torch.equal(whole, kept)
    gathered = ([torch.zeros(8, dtype=torch.bfloat16)[::2] for _ in range(world)]  # Strided.
                if rank == root else None)
    dist.gather(torch.arange(4, dtype=torch.bfloat16) / 2 + rank, gathered, dst=root)
    out["gather"] = [g.tolist() for g in gathered] if gathered else None
    objects = [None] * world if rank == root else None
    dist.gather_object({"rank": rank, "squares": [rank * rank]}, objects, dst=root)
    out["gather_object"] = objects
    given = torch.full((2, 2), -1.0).t()  # Not contiguous.
    dist.scatter(given, [torch.arange(4.0).reshape(2, 2) + 100 * r for r in range(world)]
                 if rank == root else None, src=root)
    out["scatter"] = given.tolist()
    objects = [None]
    dist.scatter_object_list(objects, [f"for rank {r}" for r in range(world)]
                             if rank == root else None, src=root)
    out["scatter_object_list"] = objects[0]
    return out


def _rooted_refusals(rank, world):
    """Calls every rank refuses alike, so the group goes on after them."""
    attempts = {
        "reduce root": lambda: dist.reduce(torch.ones(3), dst=world + 3),
        "reduce float64": lambda: dist.reduce(torch.ones(3, dtype=torch.float64), dst=0),
        "reduce_scatter parts": lambda: dist.reduce_scatter(
            torch.zeros(2), [torch.ones(2)] * (world + 1)),
        "reduce_scatter size": lambda: dist.reduce_scatter_tensor(torch.zeros(2),
                                                                  torch.ones(2 * world + 1)),
        "reduce_scatter band float": lambda: dist.reduce_scatter(
            torch.zeros(2), [torch.ones(2)] * world, op=dist.ReduceOp.BAND),
        "allgather sizes": lambda: dist.all_gather([torch.zeros(2)] * world, torch.ones(3)),
        "all_to_all rows": lambda: dist.all_to_all_single(torch.zeros(world),
                                                          torch.ones(world + 1)),
        "all_to_all splits": lambda: dist.all_to_all_single(
            torch.zeros(world), torch.ones(world), input_split_sizes=[world + 1] + [0] * (world - 1)),
        "all_to_all negative": lambda: dist.all_to_all_single(
            torch.zeros(world), torch.ones(world), input_split_sizes=[-1, world + 1]),
        "all_to_all split count": lambda: dist.all_to_all_single(
            torch.zeros(world), torch.ones(world), output_split_sizes=[world]),
        "all_to_all splits short": lambda: dist.all_to_all_single(
            torch.zeros(world), torch.ones(world), output_split_sizes=[1] + [0] * (world - 1)),
    }
    return _outcomes(attempts)


def _exchanges(rank, world):
    """all_to_all_single with equal and uneven splits, and all_to_all."""
    out = {}
    mine = torch.zeros(world * 4, dtype=torch.int64)[::2]  # Not contiguous.
    dist.all_to_all_single(mine, torch.arange(world * 2) + rank * 100)
    out["equal"] = mine.tolist()
    # Rank r sends j + 1 rows of 3 to rank j.
    rows = [rank * 1000 + j * 10 + k for j in range(world) for k in range(j + 1)]
    given = torch.tensor(rows, dtype=torch.float32).repeat(3, 1).t()  # Not contiguous.
    mine = torch.zeros((rank + 1) * world, 3)
    dist.all_to_all_single(mine, given, output_split_sizes=[rank + 1] * world,
                           input_split_sizes=[j + 1 for j in range(world)])
    out["uneven"] = mine[:, 0].tolist()
    out["uneven rows alike"] = bool((mine == mine[:, :1]).all())
    parts = [torch.full((j + 1,), rank * 10 + j, dtype=torch.bfloat16) for j in range(world)]
    mine = [torch.zeros(2 * (rank + 1), dtype=torch.bfloat16)[::2] for _ in range(world)]
    dist.all_to_all(mine, parts)
    out["list"] = [m.tolist() for m in mine]
    return out


def _exchange_mismatch(rank, world):
    """Rank 0 expects two rows from rank 1, which sends it one."""
    splits = [1, 1] if rank == 1 else [1, 2]
    try:
        dist.all_to_all_single(torch.zeros(sum(splits)), torch.ones(2),
                               output_split_sizes=splits, input_split_sizes=[1, 1])
        result = "no error"
    except ValueError as e:
        result = str(e)
    t = torch.ones(4)
    dist.all_reduce(t)
    return result, t.tolist()


def _empties(rank, world):
    """Every new collective on tensors of no elements."""
    out = {}
    t = torch.zeros(0)
    dist.reduce(t, dst=0)
    dist.reduce_scatter(torch.zeros(0), [torch.zeros(0)] * world)
    dist.reduce_scatter_tensor(torch.zeros(0), torch.zeros(0))
    dist.gather(torch.zeros(0), [torch.zeros(0)] * world if rank == 0 else None, dst=0)
    dist.scatter(torch.zeros(0), [torch.zeros(0)] * world if rank == 0 else None, src=0)
    dist.all_to_all_single(torch.zeros(0), torch.zeros(0))
    t = torch.ones(2)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    return out


def _root_refuses(rank, world):
    """Arguments only some ranks get wrong: every rank raises at once."""
    out = {}
    attempts = {
        # The root's list is one short; the others cannot know.
        "scatter short": lambda: dist.scatter(
            torch.zeros(2), [torch.ones(2)] * (world - 1) if rank == 0 else None, src=0),
        # Rank 1's part is int32, of the root's byte size.
        "gather dtype": lambda: dist.gather(
            torch.zeros(2, dtype=torch.int32 if rank == 1 else torch.float32),
            [torch.zeros(2)] * world if rank == 0 else None, dst=0),
        # Each rank names itself the root (and so passes a list).
        "gather root": lambda: dist.gather(torch.zeros(2), [torch.zeros(2)] * world, dst=rank),
        # Rank 1's output is expanded: a write-back into it would fail halfway.
        "scatter expanded": lambda: dist.scatter(
            torch.zeros(1).expand(2) if rank == 1 else torch.zeros(2),
            [torch.ones(2)] * world if rank == 0 else None, src=0),
        # Rank 1's split sizes do not add up.
        "all_to_all splits": lambda: dist.all_to_all_single(
            torch.zeros(2), torch.ones(2), input_split_sizes=[1, 1 + rank]),
        "all_to_all dtype": lambda: dist.all_to_all_single(
            torch.zeros(2, dtype=torch.int32 if rank == 1 else torch.float32),
            torch.ones(2, dtype=torch.int32 if rank == 1 else torch.float32)),
        # Rank 0 expects two rows from rank 1, which sends nothing at all.
        "all_to_all nothing": lambda: dist.all_to_all_single(
            torch.zeros(4 if rank == 0 else 0), torch.ones(2 if rank == 0 else 0),
            output_split_sizes=[2, 2] if rank == 0 else [0, 0],
            input_split_sizes=[2, 0] if rank == 0 else [0, 0]),
    }
    for name, call in attempts.items():
        start = time.monotonic()
        try:
            call()
            out[name] = "no error"
        except Exception as e:  # noqa: B902
            out[name] = (f"{type(e).__name__}: {e}", time.monotonic() - start)
    t = torch.ones(2)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    return out


# torch.float32's ScalarType (6) plus one, as the agreement step carries a dtype.
FLOAT32_CODE = 7


def _forged_sums(rank, world):
    """Rank 1 stands in for a rank that forges the agreement's sum: where
    rank 0 runs an alltoall or a gather, rank 1 all-reduces int64s of the
    agreement's shape, with values that no rank checking its own arguments
    sends. Rank 0 refuses each, naming the value, and the group goes on."""
    forged = {
        # Rows of (refused, dtype + 1, bytes to rank 0, bytes to rank 1).
        "alltoall over 2^48": [0, 0, 0, 0, 0, FLOAT32_CODE, 2**48 + 1, 4],
        "alltoall negative": [0, 0, 0, 0, 0, FLOAT32_CODE, 4, -4],
        # Slots of (refused, root, dtype + 1, bytes), added to rank 0's own.
        "gather root": [0, 5, 0, 0, 0, 5, FLOAT32_CODE, 8],
        "gather negative root": [0, -1, 0, 0, 0, -1, FLOAT32_CODE, 8],
    }

    def attempt(name, sums):
        if rank == 1:
            return lambda: dist.all_reduce(torch.tensor(sums, dtype=torch.int64))
        if name.startswith("alltoall"):
            return lambda: dist.all_to_all_single(torch.zeros(2), torch.ones(2))
        return lambda: dist.gather(torch.zeros(2), [torch.zeros(2)] * world, dst=0)

    return _outcomes({name: attempt(name, sums) for name, sums in forged.items()})


def _killed(victim):
    def run(rank, world):
        t = torch.ones(8)
        dist.all_reduce(t)
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(LARGE))
            return "no error"
        except RuntimeError as e:
            return (str(e), time.monotonic() - start)
    return run


def _stalled(victim):
    def run(rank, world):
        store = dist.distributed_c10d._get_default_store()
        dist.barrier()
        if rank == victim:
            # Alive but absent: skips the collective, waiting until every
            # other rank has given up on it.
            store.wait([f"gave up {r}" for r in range(world) if r != victim],
                       timedelta(seconds=60))
            return "stalled"
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(16))
            result = "no error"
        except RuntimeError as e:
            result = (str(e), time.monotonic() - start)
        store.set(f"gave up {rank}", "1")
        return result
    return run


def _description(rank, world):
    t = torch.full((LARGE,), float(rank))
    dist.all_reduce(t)
    return (dist.distributed_c10d._get_default_group().description, t[0].item(),
            dist.get_backend())


class CollectivesTest(unittest.TestCase):
    def test_allreduce_every_dtype(self):
        for world in (2, 3, 4):
            got = values(run_ranks(_reductions, world), self)
            ranks = range(world)
            for dtype in DTYPES:
                want = sum(_small(r, torch.float64) for r in ranks).tolist()
                for g in got:
                    self.assertEqual(g[f"sum {dtype}"], (str(dtype), want), (world, dtype))
                for name, (_, reduce) in OPS.items():
                    want = reduce(torch.stack([_tiny(r, torch.float64) for r in ranks]), 0)
                    for g in got:
                        self.assertEqual(g[f"{name} {dtype}"], (str(dtype), want.tolist()),
                                         (world, name, dtype))
            for dtype in INTS:
                for name, (_, reduce) in BITWISE.items():
                    want = functools.reduce(reduce, [_bits(r, dtype) for r in ranks]).tolist()
                    for g in got:
                        self.assertEqual(g[f"{name} {dtype}"], (str(dtype), want),
                                         (world, name, dtype))
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                want = torch.tensor(got[0][f"sum {dtype}"][1], dtype=dtype) / world
                for g in got:
                    self.assertEqual(g[f"avg {dtype}"], (str(dtype), want.double().tolist()))
            want = sum(_large(r).double() for r in ranks)
            mine = torch.frombuffer(bytearray(got[0]["large"]), dtype=torch.float32)
            self.assertTrue(torch.allclose(mine.double(), want, rtol=1e-5, atol=1e-5))
            want = torch.stack([_large(r) for r in ranks]).amax(0).numpy().tobytes()
            for g in got:
                self.assertEqual(g["large"], got[0]["large"], "bit-identical on every rank")
                self.assertEqual(g["large max"], want)
                # One quiet NaN (0x7fc00000) wins; +0 over -0.
                self.assertEqual(g["max nan"], [0x7fc00000, 0], "NaN wins; +0 over -0")
                self.assertEqual(
                    g["product wraps"],
                    functools.reduce(torch.mul, [torch.full((4,), 100_003 + r, dtype=torch.int32)
                                                 for r in ranks]).tolist())
                self.assertEqual(g["strided"], [[float(sum(ranks))] * 6] * 4)

    def test_broadcast_allgather_barrier(self):
        for world in (2, 4):
            for g in values(run_ranks(_moves, world), self):
                self.assertEqual(g["broadcast"], [float(world - 1)] * 5)
                self.assertTrue(g["broadcast large"])
                self.assertEqual(g["allgather"], [[10 + r] * 3 for r in range(world)])
                self.assertEqual(g["allgather reshaped"], [[float(r)] * 6 for r in range(world)])
                self.assertEqual(g["allgather into tensor"],
                                 [float(r) for r in range(world) for _ in range(2)])
                self.assertEqual(g["objects"], [{"rank": r} for r in range(world)])

    def test_unsupported_dtype_and_op_are_named(self):
        for g in values(run_ranks(_refusals, 2), self):
            self.assertRegex(g["float64"], r"^TypeError: .*allreduce does not support dtype "
                                           r"torch\.float64")
            self.assertRegex(g["premul"], r"^NotImplementedError: .*reduce op PREMUL_SUM \(SUM, "
                                          r"AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR\)")
            self.assertRegex(g["band float"], r"^TypeError: .*allreduce BAND does not support "
                                              r"dtype torch\.float32 \(integers only\)")
            self.assertRegex(g["sparse"], r"NotImplementedError: .*sparse tensors")
            self.assertRegex(g["avg int"], r"TypeError: .*AVG does not support dtype torch\.int64")
            self.assertRegex(g["two tensors"], r"ValueError: .*allreduce takes one tensor a call, "
                                               r"not 2 \(a list of several is the deprecated "
                                               r"multi-GPU form, not built\)")
            self.assertEqual(g["after"], [2.0] * 4)

    def test_reduce_reduce_scatter_gather_scatter(self):
        for world in (2, 3, 4):
            got = values(run_ranks(_rooted, world), self)
            ranks, root = range(world), world - 1
            for rank, g in enumerate(got):
                for dtype in DTYPES:
                    want = (torch.stack([_tiny(r, torch.float64) for r in ranks]).amin(0)
                            if rank == root else _tiny(rank, torch.float64))
                    self.assertEqual(g[f"reduce min {dtype}"], want.tolist(), (world, dtype))
                if rank == root:
                    want = sum(_large(r).double() for r in ranks)
                    mine = torch.frombuffer(bytearray(g["reduce large"]), dtype=torch.float32)
                    self.assertTrue(torch.allclose(mine.double(), want, rtol=1e-5, atol=1e-5))
                    self.assertEqual(g["reduce avg"], [(world + 1) / 2] * 3)
                    self.assertEqual(g["gather"], [[k / 2 + r for k in range(4)] for r in ranks])
                    self.assertEqual(g["gather_object"],
                                     [{"rank": r, "squares": [r * r]} for r in ranks])
                else:
                    self.assertEqual(g["reduce large"], _large(rank).numpy().tobytes(),
                                     "a rank but the root keeps its tensor")
                    self.assertEqual(g["reduce avg"], [float(rank + 1)] * 3)
                    self.assertIsNone(g["gather"])
                self.assertEqual(g["reduce_scatter"],
                                 [[sum(r * 10 + rank for r in ranks)] * 3] * 2)
                want = torch.stack([_large(r)[: world * 1000] for r in ranks]).amin(0)
                self.assertEqual(g["reduce_scatter tensor min"],
                                 want[rank * 1000:(rank + 1) * 1000].numpy().tobytes())
                self.assertTrue(g["reduce_scatter input kept"])
                self.assertEqual(g["scatter"], [[100.0 * rank, 100.0 * rank + 1],
                                                [100.0 * rank + 2, 100.0 * rank + 3]])
                self.assertEqual(g["scatter_object_list"], f"for rank {rank}")

    def test_rooted_refusals_are_named(self):
        want = {
            "reduce root": r"ValueError: .*reduce with root rank 5 in a group of 2",
            "reduce float64": r"^TypeError: .*reduce does not support dtype torch\.float64",
            "reduce_scatter parts": r"ValueError: .*reduce_scatter has 3 input tensors for a "
                                    r"group of 2",
            "reduce_scatter size": r"ValueError: .*reduce_scatter from a tensor needs a "
                                   r"torch\.float32 input of 4 elements, not torch\.float32\[5\]",
            "reduce_scatter band float": r"TypeError: .*reduce_scatter BAND does not support "
                                         r"dtype torch\.float32 \(integers only\)",
            "allgather sizes": r"ValueError: .*allgather output torch\.float32\[2\] differs "
                               r"from this rank's torch\.float32\[3\]",
            "all_to_all rows": r"ValueError: .*alltoall input of 3 rows does not split into 2 "
                               r"equal parts",
            "all_to_all splits": r"ValueError: .*alltoall input split sizes add up to 3 rows, "
                                 r"the tensor has 2",
            "all_to_all negative": r"ValueError: .*alltoall input split size -1 is negative",
            "all_to_all splits short": r"ValueError: .*alltoall output split sizes add up to 1 "
                                       r"rows, the tensor has 2",
            "all_to_all split count": r"ValueError: .*alltoall has 1 output split sizes for a "
                                      r"group of 2",
        }
        for g in values(run_ranks(_rooted_refusals, 2), self):
            self.assertEqual(set(g) - {"after"}, set(want))
            for name, pattern in want.items():
                self.assertRegex(g[name], pattern, name)
            self.assertEqual(g["after"], [2.0] * 4)

    def test_all_to_all(self):
        for world in (2, 3, 4):
            for rank, g in enumerate(values(run_ranks(_exchanges, world), self)):
                self.assertEqual(g["equal"], [r * 100 + rank * 2 + k
                                              for r in range(world) for k in range(2)])
                self.assertEqual(g["uneven"], [float(r * 1000 + rank * 10 + k)
                                               for r in range(world) for k in range(rank + 1)])
                self.assertTrue(g["uneven rows alike"])
                self.assertEqual(g["list"], [[float(r * 10 + rank)] * (rank + 1)
                                             for r in range(world)])
        got = values(run_ranks(_exchange_mismatch, 2), self)
        self.assertRegex(got[0][0], r"cohort process group \(rank 0\): alltoall: rank 1 sent this "
                                    r"rank 4 bytes, where its part holds 8")
        self.assertEqual(got[1][0], "no error")
        self.assertEqual([g[1] for g in got], [[2.0] * 4] * 2, "the group goes on")

    def test_empty_tensors(self):
        for g in values(run_ranks(_empties, 3), self):
            self.assertEqual(g["after"], [3.0] * 2)

    def test_rooted_arguments_one_rank_gets_wrong_fail_every_rank_at_once(self):
        got = values(run_ranks(_root_refuses, 2, timeout_s=60), self)
        for rank, g in enumerate(got):
            for name in ("scatter short", "gather dtype", "gather root", "scatter expanded",
                         "all_to_all splits", "all_to_all dtype"):
                self.assertLess(g[name][1], 30, "not a wait for the timeout")
            # The rank that got its arguments wrong names what; the other
            # names that rank.
            culprits = {
                "scatter short": (0, "scatter", r"scatter has 1 input tensors for a group of 2"),
                "scatter expanded": (1, "scatter", r"scatter cannot write into a tensor whose "
                                                   r"elements share memory \(expanded\)"),
                "all_to_all splits": (1, "alltoall", r"alltoall input split sizes add up to 3 "
                                                     r"rows, the tensor has 2"),
            }
            for name, (culprit, what, why) in culprits.items():
                want = (r"^ValueError: .*" + why if rank == culprit else
                        rf"^ValueError: cohort process group \(rank {rank}\): {what} refused: "
                        rf"rank {culprit} refused its arguments")
                self.assertRegex(g[name][0], want, name)
            # Every rank names the rank that differs.
            for name, why in (
                    ("gather dtype", r"gather refused: rank 1 passed a torch\.int32 part of 8 "
                                     r"bytes, the root a torch\.float32 part of 8 bytes"),
                    ("gather root", r"gather refused: rank 1 passed root 1, rank 0 root 0 "
                                    r"\(every rank must pass the same root\)"),
                    ("all_to_all dtype", r"alltoall refused: rank 1 passed torch\.int32, rank 0 "
                                         r"torch\.float32 \(every rank must pass one dtype\)")):
                self.assertRegex(g[name][0], r"^ValueError: .*" + why, name)
            if rank == 0:
                self.assertRegex(g["all_to_all nothing"][0], r"^ValueError: .*alltoall: rank 1 "
                                                             r"sent this rank 0 bytes, where its "
                                                             r"part holds 8")
            else:
                self.assertEqual(g["all_to_all nothing"], "no error")
            self.assertEqual(g["after"], [2.0] * 2, "the group goes on")

    def test_a_forged_agreement_is_refused_before_any_copy(self):
        # The byte counts and the root are checked after the sum, so a rank
        # that adds to the others' rows cannot make them allocate, read or
        # write out of bounds.
        got = values(run_ranks(_forged_sums, 2), self)
        prefix = r"^ValueError: cohort process group \(rank 0\): "
        for name, why in (
                ("alltoall over 2^48", r"alltoall: rank 1 would send rank 0 281474976710657 bytes "
                                       r"\(0 to 2\^48\)"),
                ("alltoall negative", r"alltoall: rank 1 would send rank 1 -4 bytes"),
                ("gather root", r"gather refused: the agreed root 5 is not a rank of 2"),
                ("gather negative root", r"gather refused: the agreed root -1 is not a rank of 2")):
            self.assertRegex(got[0][name], prefix + why, name)
            self.assertEqual(got[1][name], "no error", name)
        self.assertEqual([g["after"] for g in got], [[2.0] * 4] * 2, "the group goes on")

    def test_killed_rank_is_an_error_on_every_other_rank(self):
        timeout_s = 8
        for world, victim in ((2, 1), (4, 2)):
            out = run_ranks(_killed(victim), world, timeout_s=timeout_s, wait_s=60)
            self.assertEqual(out[victim], ("died", -signal.SIGKILL))
            for r in range(world):
                if r == victim:
                    continue
                status, value = out[r]
                self.assertEqual(status, "ok", value)
                self.assertIsInstance(value, tuple, f"rank {r}: {value}")
                message, elapsed = value
                self.assertIn(f"cohort process group (rank {r}): allreduce failed", message)
                self.assertIn(f"rank {victim}", message)
                self.assertLess(elapsed, timeout_s)

    def test_stalled_rank_times_out_naming_it(self):
        timeout_s = 3
        out = run_ranks(_stalled(1), 3, timeout_s=timeout_s, wait_s=60)
        self.assertEqual(out[1], ("ok", "stalled"))
        for r in (0, 2):
            status, value = out[r]
            self.assertEqual(status, "ok", value)
            message, elapsed = value
            self.assertIn("DEADLINE_EXCEEDED", message.upper().replace(" ", "_"))
            self.assertIn("rank 1", message)
            self.assertLess(elapsed, timeout_s)

    def test_tcp_transport(self):
        saved = dict(os.environ)
        os.environ.update({"COHORT_TRANSPORT": "tcp", "COHORT_INSECURE": "1"})
        try:
            got = values(run_ranks(_description, 3), self)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assertEqual(got, [("tcp: plaintext, not authenticated", 3.0, "cohort")] * 3)
        got = values(run_ranks(_description, 2), self)
        self.assertEqual(got, [("shared memory", 1.0, "cohort")] * 2)

    def test_tcp_without_keys_is_refused(self):
        saved = dict(os.environ)
        os.environ.update({"COHORT_TRANSPORT": "tcp"})
        os.environ.pop("COHORT_INSECURE", None)
        try:
            out = run_ranks(_description, 2, wait_s=30)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        for r in (0, 1):
            self.assertEqual(out[r][0], "error")
            self.assertIn("set COHORT_IDENTITY, COHORT_ALLOW and COHORT_MASTER_KEY", out[r][1])


class _Store:
    """torch's store as create_process_group uses it: set and get."""
    def __init__(self, hosts):
        self.kv = {f"cohort/host/{r}": h.encode() for r, h in enumerate(hosts)}

    def set(self, key, value):
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.kv[key]


class MeetingTest(unittest.TestCase):
    # Ranks on two hosts with COHORT_HOST unset: rank 0 would publish the
    # loopback address, which the other host's ranks would dial in vain
    # until the timeout. Refused at once, on every rank, naming COHORT_HOST.
    def test_several_hosts_without_cohort_host_are_refused_at_once_on_every_rank(self):
        import cohort.distributed as cd
        import socket
        store = _Store(["(rank 0 sets its own)", "node-b"])
        hosts = ", ".join(sorted([socket.gethostname(), "node-b"]))
        saved = dict(os.environ)
        try:
            os.environ.pop("COHORT_HOST", None)
            os.environ["COHORT_INSECURE"] = "1"
            with self.assertRaises(RuntimeError) as e:
                cd.create_process_group(store, 0, 2, timedelta(seconds=5))
            self.assertEqual(str(e.exception),
                             f"cohort process group: the ranks run on 2 hosts ({hosts}), and "
                             "rank 0 would be reached at 127.0.0.1, which only its own host can: "
                             "set COHORT_HOST to the address the other hosts reach rank 0 at")
            with self.assertRaises(RuntimeError) as other:
                cd.create_process_group(store, 1, 2, timedelta(seconds=5))
            self.assertEqual(str(other.exception), str(e.exception))
        finally:
            os.environ.clear()
            os.environ.update(saved)


if __name__ == "__main__":
    unittest.main(verbosity=2)
