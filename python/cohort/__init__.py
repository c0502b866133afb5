"""Cohort from Python: a federated client around your own training loop,
DDP over Cohort's collectives, and models that round-trip to PyTorch.

Everything that touches the network or a secret (the client's protocol,
CURVE, SecAgg+ masking, the collectives) runs in C++; the model and the
training loop are yours.

    client = cohort.Client(coordinator="tcp://host:7000", identity="me.key",
                           coordinator_key="coordinator.pub", num_samples=len(data))
    client.run(fit)   # fit(params, task) -> (params, num_samples, metrics)

See cohort.Client and cohort.torch (get_flat, set_flat, fit_loop,
save_initial).
"""

from cohort._client import Client, Task  # noqa: F401
