#!/usr/bin/python3
"""Federated training of your own PyTorch model with SecAgg+.

A small CNN with BatchNorm, dropout and a residual connection: a model
Cohort's C++ engine cannot express. Each client trains it on its share of
Fashion-MNIST (Dirichlet(0.5) label skew); the coordinator only sums the
masked updates.

    B=build/cli/cohort; export PYTHONPATH=build/python; D=runs/pytorch
    # 1. The model's initial weights and the config's model block.
    /usr/bin/python3 examples/python/federated_pytorch.py prepare --out $D
    # 2. Keys: the coordinator's and each client's; the clients' public
    #    keys are the allowlist (and each client's --peers).
    for n in coordinator client-0 client-1 client-2 client-3 client-4; do
        $B keygen --out $D/keys --name $n; done
    mkdir -p $D/allow && cp $D/keys/client-*.pub $D/allow/
    $B coordinator --config $D/run.textproto --run-dir $D/run \\
        --initial-model $D/init.npz --bind tcp://127.0.0.1:7000 \\
        --identity $D/keys/coordinator.key --allow $D/allow
    # 3. Each client, k = 0 ... 4:
    /usr/bin/python3 examples/python/federated_pytorch.py client --index k --clients 5 \\
        --coordinator tcp://127.0.0.1:7000 --identity $D/keys/client-k.key \\
        --coordinator-key $D/keys/coordinator.pub --peers $D/allow
    $B status --run-dir $D/run      # secagg+ rounds
    # 4. The trained model back in PyTorch, on the 10,000 test images:
    /usr/bin/python3 examples/python/federated_pytorch.py evaluate --run-dir $D/run

The coordinator reads the model as `model { external { ... } }` and its
initial values from --initial-model (cohort.torch.save_initial's .npz).
"""

import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cohort
import cohort.torch as ct

DATA = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


class Net(nn.Module):
    """conv-BN-ReLU, a residual conv-BN block, max-pool, dropout, linear."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(16 * 14 * 14, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(x + self.bn2(self.conv2(x)))  # The residual connection.
        return self.fc(self.drop(F.max_pool2d(x, 2)).flatten(1))


def read_idx(name):
    with gzip.open(os.path.join(DATA, name)) as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def client_share(index, clients, alpha=0.5, seed=0):
    """This client's training samples: a Dirichlet(alpha) split every
    client computes alike from the same seed."""
    images, labels = read_idx("train-images-idx3-ubyte.gz"), read_idx("train-labels-idx1-ubyte.gz")
    rng = np.random.default_rng(seed)
    mine = []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet([alpha] * clients)) * len(idx)).astype(int)[:-1]
        mine.append(np.split(idx, cuts)[index])
    mine = np.concatenate(mine)
    x = torch.from_numpy(images[mine].astype(np.float32) / 255.0).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels[mine].astype(np.int64)))


def prepare(args):
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = Net()
    ct.save_initial(model, os.path.join(args.out, "init.npz"))
    layout = "".join(
        f'    layout {{ name: "{k}" {" ".join(f"shape: {d}" for d in v.shape)} }}\n'
        for k, v in model.state_dict().items() if torch.is_floating_point(v))
    # round_deadline_s: five clients training a CNN on a few CPU cores can
    # outlast the default 60 s round (a late client's update is dropped).
    with open(os.path.join(args.out, "run.textproto"), "w") as f:
        f.write(f"seed: 0\nmodel {{\n  external {{\n    num_params: {ct.num_params(model)}\n"
                f"{layout}  }}\n}}\n"
                "train { batch_size: 32 learning_rate: 0.05 local_epochs: 1 }\n"
                f"rounds {{ num_rounds: 10 min_clients: {args.clients} "
                f"start_clients: {args.clients} round_deadline_s: 600 }}\n"
                "secagg { aggregation: SECAGG_PLUS }\n")
    print(f"wrote {args.out}/init.npz and {args.out}/run.textproto "
          f"({ct.num_params(model)} parameters)")


def make_fit(model, data):
    """fit(params, task) for cohort.Client: `model` trained on `data`."""

    def fit(params, task):
        ct.set_flat(model, params)
        torch.manual_seed(task.seed)  # Shuffling and dropout: (run, round, client).
        loader = DataLoader(data, batch_size=task.batch_size, shuffle=True)
        opt = torch.optim.SGD(model.parameters(), lr=task.learning_rate,
                              momentum=task.momentum, weight_decay=task.weight_decay)
        n, metrics = ct.fit_loop(model, loader, opt, task.epochs)
        return ct.get_flat(model, out=params), n, metrics

    return fit


def run_client(args):
    data = client_share(args.index, args.clients)
    model = Net()
    fit = make_fit(model, data)
    cohort.Client(coordinator=args.coordinator, identity=args.identity,
                  coordinator_key=args.coordinator_key, peers=args.peers,
                  num_samples=len(data), num_params=ct.num_params(model)).run(fit)


def evaluate(args):
    model = Net()
    round_ = ct.load_flat(model, args.run_dir)  # The run's last committed round.
    x = torch.from_numpy(read_idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
    model.eval()  # Dropout off; BatchNorm's averaged running statistics.
    with torch.no_grad():
        correct = sum((model(x[i:i + 1000].unsqueeze(1)).argmax(1) == y[i:i + 1000]).sum().item()
                      for i in range(0, len(y), 1000))
    print(f"round {round_}: test accuracy {correct / len(y):.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prepare", help="write init.npz and run.textproto")
    pre.add_argument("--out", required=True)
    pre.add_argument("--clients", type=int, default=5)
    cl = sub.add_parser("client", help="run one federated client")
    cl.add_argument("--index", type=int, required=True)
    cl.add_argument("--clients", type=int, default=5)
    for flag in ("--coordinator", "--identity", "--coordinator-key"):
        cl.add_argument(flag, required=True)
    cl.add_argument("--peers")
    ev = sub.add_parser("evaluate", help="test accuracy of a run's model")
    ev.add_argument("--run-dir", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    {"prepare": prepare, "client": run_client, "evaluate": evaluate}[args.command](args)


if __name__ == "__main__":
    main()
