"""DistributedDataParallel unchanged over the `cohort` backend: the same
script with backend gloo and cohort, at 2 and 4 ranks, one epoch; the
models agree to float rounding (the backends add in different orders), and
every cohort rank ends with the same bits."""
import unittest

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_ranks import run_ranks, values

SAMPLES, FEATURES, CLASSES, GLOBAL_BATCH = 768, 24, 5, 48


def _data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    w = torch.randn(FEATURES, CLASSES, generator=gen)
    return x, (x @ w).argmax(dim=1)


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))


def train_one_epoch(rank, world):
    """The DDP script: nothing in it names the backend."""
    x, y = _data()
    model = _model()
    if rank != 0:
        with torch.no_grad():  # DDP's first broadcast (from rank 0) undoes this.
            for p in model.parameters():
                p.add_(1.0)
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with torch.no_grad():
        first = F.cross_entropy(model.module.eval()(x), y).item()
    model.module.train()
    for i in range(0, SAMPLES, GLOBAL_BATCH):
        lo = i + GLOBAL_BATCH * rank // world
        hi = i + GLOBAL_BATCH * (rank + 1) // world
        loss = F.cross_entropy(model(x[lo:hi]), y[lo:hi])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = F.cross_entropy(model.module.eval()(x), y).item()
    # The parameters: the buffers (BatchNorm's running statistics) are
    # each rank's own after its last batch.
    state = torch.cat([t.detach().reshape(-1).double() for t in model.module.parameters()])
    return state.numpy().tobytes(), first, last, dist.get_backend()


class DdpTest(unittest.TestCase):
    def test_gloo_and_cohort_agree(self):
        for world in (2, 4):
            finals = {}
            for backend in ("gloo", "cohort"):
                got = values(run_ranks(train_one_epoch, world, backend=backend), self)
                for state, first, last, name in got:
                    self.assertEqual(name, backend)
                    if backend == "cohort":  # (gloo's ranks may differ in the last bit)
                        self.assertEqual(state, got[0][0], "cohort: every rank the same bits")
                    self.assertLess(last, first * 0.8, f"{backend}: the loss on all the data falls")
                finals[backend] = torch.frombuffer(bytearray(got[0][0]), dtype=torch.float64)
            diff = (finals["gloo"] - finals["cohort"]).abs().max().item()
            scale = finals["gloo"].abs().max().item()
            self.assertLess(diff, 1e-5 * scale, f"world {world}: gloo and cohort differ by {diff}")
            self.assertGreater(scale, 0.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
