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



# Loaded on first use, so `import cohort` stays cheap. cohort._client is the
# one extension that links Cohort's protobuf files (the client and
# cohort.run_model's `model` submodule): two that both did would abort in
# protobuf when the second registered them. cohort.distributed._c10d links
# none of them, and loads beside it.
def __getattr__(name):
    if name in ("Client", "Task"):
        from cohort import _client
        return getattr(_client, name)
    raise AttributeError(f"module 'cohort' has no attribute {name!r}")
