"""PyTorch helpers for cohort.Client: a model as one flat float32 vector.

The flat vector is every floating-point entry of ``model.state_dict()``
(parameters AND buffers, e.g. BatchNorm's running statistics; not integer
counters such as num_batches_tracked), in state_dict order, each tensor
flattened in its own (row-major) order. ``save_initial`` writes the
same tensors, with their names, as the ``.npz`` the coordinator reads with
``--initial-model``.
"""

import math
import os

import numpy as np
import torch


def _entries(model):
    """The state_dict's floating-point tensors, in order (name, tensor).

    Integer buffers (BatchNorm's num_batches_tracked) are not trained and do
    not travel: averaging a counter means nothing.
    """
    return [(k, v) for k, v in model.state_dict(keep_vars=True).items()
            if torch.is_floating_point(v)]


def num_params(model):
    """The length of get_flat(model)."""
    return sum(v.numel() for _, v in _entries(model))


def get_flat(model, out=None):
    """The model's parameters and float buffers as one float32 NumPy vector.

    ``out`` (optional): a float32 vector of num_params(model) values to fill,
    e.g. the array fit received, instead of a new one.
    """
    n = num_params(model)
    if out is None:
        out = np.empty(n, dtype=np.float32)
    elif out.dtype != np.float32 or out.size != n:
        raise ValueError(f"get_flat: out has {out.size} {out.dtype} values; "
                         f"the model has {n} float32")
    elif not out.flags.writeable or not out.flags.c_contiguous:
        # A read-only array (what evaluate receives: the round's model) would
        # be written anyway through torch; a non-contiguous one would be
        # filled through a copy and come back unchanged.
        raise ValueError("get_flat: out must be a writable, C-contiguous array "
                         f"(writeable={out.flags.writeable}, "
                         f"c_contiguous={out.flags.c_contiguous})")
    flat = torch.from_numpy(out.reshape(-1))  # Shares out's memory.
    offset = 0
    with torch.no_grad():
        for _, v in _entries(model):
            k = v.numel()
            flat[offset:offset + k].copy_(v.detach().reshape(-1))
            offset += k
    return out


def set_flat(model, params):
    """Loads a flat vector (as from get_flat) into the model, in place."""
    params = np.asarray(params, dtype=np.float32).reshape(-1)
    n = num_params(model)
    if params.size != n:
        raise ValueError(f"set_flat: got {params.size} values; the model has {n}")
    flat = torch.from_numpy(params)  # No copy for a float32 array.
    offset = 0
    with torch.no_grad():
        for _, v in _entries(model):
            k = v.numel()
            v.copy_(flat[offset:offset + k].view_as(v))
            offset += k


def fit_loop(model, loader, optimizer, epochs, loss_fn=None, mu=0.0):
    """Trains ``model`` for ``epochs`` over ``loader`` (inputs, targets).

    ``mu`` (optional): FedProx's proximal term (Li et al. 2020), the task's
    ``task.proximal_mu``. With mu > 0 each step's loss gets
    (mu / 2) * ||w - w_start||^2 over ``model.parameters()``, w_start the
    parameters as this call found them (the round's global model once fit
    has loaded it), so the gradient gets + mu * (w - w_start) as in Cohort's
    own engine. The reported loss stays the data loss. mu must be finite
    and >= 0 (ValueError otherwise); 0 trains exactly as without it.

    Returns (num_samples, metrics): the samples of one epoch (logged; the weight
    the coordinator uses is ``Client(num_samples=...)``) and {"loss": mean loss, "accuracy": of the predictions
    made while training} over every epoch, as Cohort's engine reports them,
    and "steps", the optimizer steps taken (FedNova's tau, which a task
    with ``task.fednova`` needs).
    """
    mu = float(mu)
    if not math.isfinite(mu) or mu < 0:
        raise ValueError(f"fit_loop: mu (train.proximal_mu) must be finite and >= 0, got {mu}")
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    anchor = None
    if mu > 0:
        params = [p for p in model.parameters() if p.requires_grad]
        anchor = [p.detach().clone() for p in params]
    model.train()
    total_loss, correct, seen, per_epoch, steps = 0.0, 0, 0, 0, 0
    for _ in range(max(1, int(epochs))):
        per_epoch = 0
        for x, y in loader:
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            objective = loss
            if anchor is not None:
                prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
                objective = loss + (mu / 2) * prox
            objective.backward()
            optimizer.step()
            steps += 1
            total_loss += loss.item() * len(y)
            correct += (out.argmax(dim=1) == y).sum().item()
            seen += len(y)
            per_epoch += len(y)
    metrics = {"loss": total_loss / max(seen, 1), "accuracy": correct / max(seen, 1),
               "steps": steps}
    return per_epoch, metrics


def save_initial(model, path):
    """Writes the model's state_dict as the coordinator's --initial-model.

    A plain uncompressed ``np.savez``: one float32 array per floating-point
    state_dict entry, named as in the state_dict, in state_dict order (the
    order of get_flat). Integer buffers are left out, as get_flat leaves them.
    """
    arrays = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in _entries(model)}
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_run(run_dir, round=None):
    """A run of one of Cohort's own models (mlp, lenet5, a layer list) as a
    torch.nn.Sequential under PyTorch's names and layouts: the last committed
    round, or `round`. See cohort.run_model.load_run."""
    from cohort.run_model import load_run as _load_run
    return _load_run(run_dir, round=round)


def load_flat(model, run_dir, round=None):
    """Loads a run's model at `round` (default: the last committed) into
    `model` with set_flat: the way back for a model the clients bring
    (model.external), whose flat vector is get_flat's. Returns the round."""
    from cohort import _client
    read = _client.model.read_flat(os.fspath(run_dir), round)
    set_flat(model, read["flat"])
    return read["round"]
