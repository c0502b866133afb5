"""Cohort from Python: a federated client around your own training loop,
DDP over Cohort's collectives, and models that round-trip to PyTorch.

Everything that touches the network or a secret (the client's protocol,
CURVE, SecAgg+ masking, the collectives) runs in C++; the model and the
training loop are yours.
"""
