"""A native Cohort model (mlp, logreg, lenet5, a layer list) as PyTorch's.

    model = cohort.run_model.load_run("runs/demo")        # the last round
    model = cohort.run_model.load_run("runs/demo", round=5)
    x, y = cohort.run_model.load_shard("runs/demo/shards/test.shard",
                                       model.cohort_input_shape)
    accuracy = (model(x).argmax(1) == y).float().mean()

The model is the ``torch.nn.Sequential`` of the run's layers in order, with
the trained weights in PyTorch's layouts (conv filters [out, in, kh, kw],
the linear layer after a flatten reading (C, H, W) order), so
``state_dict()`` keys are "0.weight", "0.bias", ... A run directory is read
only, also while its coordinator runs.
"""

import os

import numpy as np
import torch

from cohort._client import model as _model

__all__ = ["load_run", "load_shard", "sequential"]

_CLASSES = {
    "Linear": lambda m: torch.nn.Linear(m["in_features"], m["out_features"]),
    "Conv2d": lambda m: torch.nn.Conv2d(m["in_channels"], m["out_channels"],
                                        kernel_size=m["kernel_size"],
                                        stride=m["stride"],
                                        padding=m["padding"]),
    "MaxPool2d": lambda m: torch.nn.MaxPool2d(kernel_size=m["kernel_size"],
                                              stride=m["stride"]),
    "ReLU": lambda m: torch.nn.ReLU(),
    "Flatten": lambda m: torch.nn.Flatten(),
}


def sequential(described):
    """The nn.Sequential of a dict from cohort._client.model (read_run, to_torch),
    its state_dict loaded (strict) and in eval mode.

    The arrays' memory is shared, not copied: the parameters are views of
    the buffer _model filled.
    """
    model = torch.nn.Sequential(*[_CLASSES[m["class"]](m)
                                  for m in described["modules"]])
    state = {name: torch.from_numpy(array)
             for name, array in described["state_dict"]}
    model.load_state_dict(state, strict=True)
    model.eval()
    # One sample's shape as the first module takes it: (C, H, W) or
    # (features,).
    model.cohort_input_shape = tuple(described["input_shape"])
    model.cohort_num_classes = described["num_classes"]
    return model


def load_run(run_dir, round=None):
    """The trained model of the run in ``run_dir`` at ``round`` (default:
    the last committed round) as a ``torch.nn.Sequential`` in eval mode.

    Also sets ``cohort_round`` (the round read), ``cohort_input_shape`` and
    ``cohort_num_classes`` on it.

    Raises FileNotFoundError (no such directory, no run.db in it),
    LookupError (no committed round yet, a round past the last committed
    one, a round whose model was not kept), ValueError (not a run store, a
    model the clients bring, which Cohort holds no layer list for).
    """
    if round is not None and (isinstance(round, bool)
                              or not isinstance(round, (int, np.integer))):
        raise TypeError(f"load_run: round must be an int or None, "
                        f"got {type(round).__name__}")
    described = _model.read_run(os.fspath(run_dir),
                                None if round is None else int(round))
    model = sequential(described)
    model.cohort_round = described["round"]
    return model


def load_shard(path, input_shape=None):
    """A shard file (``cohort partition``'s output) as (features, labels)
    tensors; features shaped [n, *input_shape] when given, else [n, F]."""
    x, y, _ = _model.read_shard(os.fspath(path))
    x = torch.from_numpy(x)
    if input_shape is not None:
        x = x.reshape(x.shape[0], *input_shape)
    return x, torch.from_numpy(y).long()
