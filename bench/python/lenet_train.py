"""LeNet training on Fashion-MNIST: kiln eager against PyTorch eager, measured in the same run.

Both train d2l's LeNet (conv 3x3 20 -> relu -> avg-pool 2, conv 5x5 50 -> relu -> avg-pool 2,
dense 800->128 relu, dense 128->10) from the SAME initial weights (drawn once from N(0, 0.01),
biases 0), with minibatch SGD (lr 0.2, batch 256) on softmax cross-entropy, over the same
shuffled order of the same images (one NumPy Generator permutation per epoch). PyTorch runs on
os.cpu_count() threads, as kiln's CPU kernels do.

kiln feeds itself with its DataLoader (batches converted in a background thread); PyTorch
indexes a preloaded float tensor, its fastest plain-eager path. The epoch time covers the
training loop only, and epochs alternate between the two (kiln, torch, kiln, ...) so that a
change in the machine's load hits both alike; the test accuracy is measured after the last
epoch on the test set.

Prints JSON lines:
  {"bench": "lenet_train", "case": "kiln_eager"|"kiln_hybridized"|"torch_eager", "metric": "seconds_per_epoch"|"test_acc", ...}
  {"bench": "lenet_train", "case": "kiln_eager/torch_eager", "metric": "speedup", "value": t_torch/t_kiln, "unit": "x"}
  {"bench": "lenet_train", "case": "kiln"|"torch", "metric": "peak_rss_mb", ...}  (each process's peak resident
   memory, getrusage's ru_maxrss: the kiln process trains both kiln cases, so its figure bounds each)
  {"bench": "lenet_train", "case": "torch/kiln", "metric": "memory_ratio", ...}  (above 1: kiln uses less)

Run: python3 bench/python/lenet_train.py [--epochs 4] [--quick]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

import kiln
from kiln import autograd, nn
from kiln.data import DataLoader, FashionMNIST, transforms

BATCH, LR = 256, 0.2


def emit(case, metric, value, unit):
    print(json.dumps({"bench": "lenet_train", "case": case, "metric": metric, "value": round(value, 6),
                      "unit": unit}), flush=True)


def initial_weights(seed):
    """The starting point both frameworks copy: (shape, values) in layer order, weight then bias."""
    rng = np.random.default_rng(seed)
    shapes = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (128, 800), (128,), (10, 128), (10,)]
    return [(rng.normal(0, 0.01, s) if len(s) > 1 else np.zeros(s)).astype(np.float32) for s in shapes]


# ---- kiln ----

def kiln_lenet(weights):
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=3, activation="relu", in_channels=1), nn.AvgPool2D(2, 2),
            nn.Conv2D(50, kernel_size=5, activation="relu", in_channels=20), nn.AvgPool2D(2, 2),
            nn.Flatten(), nn.Dense(128, activation="relu", in_units=800), nn.Dense(10, in_units=128))
    net.initialize(init=kiln.init.Normal(0.01))
    params = list(net.collect_params().values())
    assert [tuple(p.shape) for p in params] == [w.shape for w in weights], "kiln LeNet parameter shapes"
    for p, w in zip(params, weights):
        p.set_data(kiln.nd.array(w))
    return net


class KilnCase:
    def __init__(self, train, test, weights, seed, hybridize=False):
        self.net = kiln_lenet(weights)
        if hybridize:
            self.net.hybridize()
        self.loss = kiln.loss.SoftmaxCrossEntropyLoss()
        self.trainer = kiln.Trainer(self.net.collect_params(), "sgd", {"learning_rate": LR})
        self.train_iter = DataLoader(train, BATCH, shuffle=True, seed=seed)
        self.test = test
        X, y = next(iter(DataLoader(train, BATCH, prefetch=0)))  # warm-up: kernel choice, allocations
        with autograd.record():
            l = self.loss(self.net(X), y)
        l.backward()
        kiln.waitall()

    def epoch(self):
        start = time.perf_counter()
        for X, y in self.train_iter:
            with autograd.record():
                l = self.loss(self.net(X), y)
            l.backward()
            self.trainer.step(X.shape[0])
        kiln.waitall()
        return time.perf_counter() - start

    def test_acc(self):
        correct = 0.0
        with autograd.predict_mode():
            for X, y in DataLoader(self.test, BATCH):
                correct += (self.net(X).argmax(axis=1).astype("int32") == y).astype("float32").sum().item()
        return correct / len(self.test)


# ---- PyTorch ----

class TorchCase:
    def __init__(self, images, labels, test_images, test_labels, weights, seed):
        import torch
        self.torch = torch
        torch.set_num_threads(os.cpu_count() or 1)
        tnn = torch.nn
        self.net = tnn.Sequential(tnn.Conv2d(1, 20, 3), tnn.ReLU(), tnn.AvgPool2d(2, 2), tnn.Conv2d(20, 50, 5),
                                  tnn.ReLU(), tnn.AvgPool2d(2, 2), tnn.Flatten(), tnn.Linear(800, 128), tnn.ReLU(),
                                  tnn.Linear(128, 10))
        with torch.no_grad():
            for p, w in zip(self.net.parameters(), weights):
                p.copy_(torch.from_numpy(w))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LR)
        self.X, self.y = self._images(images), torch.from_numpy(labels.astype(np.int64))
        self.test_X, self.test_y = self._images(test_images), test_labels
        self.loss = tnn.CrossEntropyLoss()
        self.loss(self.net(self.X[:BATCH]), self.y[:BATCH]).backward()  # warm-up (no update)
        self.rng = np.random.default_rng(seed)  # the same permutations as kiln's DataLoader(seed=seed)

    def _images(self, a):
        return self.torch.from_numpy(a[:, None].astype(np.float32) / 255)

    def epoch(self):
        order = self.torch.from_numpy(self.rng.permutation(len(self.X)))
        start = time.perf_counter()
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            self.opt.zero_grad()
            self.loss(self.net(self.X[idx]), self.y[idx]).backward()
            self.opt.step()
        return time.perf_counter() - start

    def test_acc(self):
        with self.torch.no_grad():
            pred = self.torch.cat([self.net(self.test_X[i:i + BATCH]).argmax(1)
                                   for i in range(0, len(self.test_X), BATCH)])
        return float((pred.numpy() == self.test_y).mean())


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_cases(names, args):
    """Runs the named cases, epochs alternating between them; returns {name: (s/epoch, test acc)}."""
    train_n, test_n = (5000, 1000) if args.quick else (None, None)
    epochs = 1 if args.quick else args.epochs
    raw_train = FashionMNIST(train=True, limit=train_n)
    raw_test = FashionMNIST(train=False, limit=test_n)
    weights = initial_weights(args.seed)
    cases = {}
    if "kiln_eager" in names or "kiln_hybridized" in names:
        to_tensor = transforms.ToTensor()
        train_set, test_set = raw_train.transform_first(to_tensor), raw_test.transform_first(to_tensor)
        for name in ("kiln_eager", "kiln_hybridized"):
            if name in names:
                cases[name] = KilnCase(train_set, test_set, weights, args.seed, hybridize=name == "kiln_hybridized")
    if "torch_eager" in names:
        cases["torch_eager"] = TorchCase(raw_train.images, raw_train.labels, raw_test.images, raw_test.labels,
                                         weights, args.seed)
    # Epochs alternate between the cases, so a change in the machine's load hits both alike.
    times = {name: [] for name in cases}
    for _ in range(epochs):
        for name, case in cases.items():
            times[name].append(case.epoch())
    return {name: (sum(times[name]) / len(times[name]), case.test_acc()) for name, case in cases.items()}


def main():
    p = argparse.ArgumentParser(description="LeNet training: kiln eager and hybridized vs PyTorch eager")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="CI: 5000 train / 1000 test images, 1 epoch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=("torch",), help=argparse.SUPPRESS)  # the torch run, in its own process
    args = p.parse_args()
    if args.only == "torch":
        sec, acc = run_cases(["torch_eager"], args)["torch_eager"]
        print(json.dumps([sec, acc, peak_rss_mb()]))
        return
    print(f"# lenet_train: {'5000/1000' if args.quick else '60000/10000'} train/test images, "
          f"{1 if args.quick else args.epochs} epoch(s), {os.cpu_count()} threads", file=sys.stderr)
    # PyTorch runs in its own process: its idle OpenMP threads spin and would slow kiln's epochs
    # (measured: 11.6 s -> 14.8 s per kiln epoch with torch loaded alongside).
    results = run_cases(["kiln_eager", "kiln_hybridized"], args)
    cmd = [sys.executable, os.path.abspath(__file__), "--only", "torch", "--epochs", str(args.epochs),
           "--seed", str(args.seed)] + (["--quick"] if args.quick else [])
    kiln_rss = peak_rss_mb()
    out = subprocess.run(cmd, capture_output=True, text=True)
    torch_rss = None
    if out.returncode == 0:
        sec, acc, torch_rss = json.loads(out.stdout.strip().splitlines()[-1])
        results["torch_eager"] = (sec, acc)
    else:
        print("# torch case failed (is python3-torch installed?): " + out.stderr.strip()[-300:], file=sys.stderr)
    for name, (sec, acc) in results.items():
        emit(name, "seconds_per_epoch", sec, "s")
        emit(name, "test_acc", acc, "acc")
    per_epoch = {name: r[0] for name, r in results.items()}
    if "torch_eager" in per_epoch:
        emit("kiln_eager/torch_eager", "speedup", per_epoch["torch_eager"] / per_epoch["kiln_eager"], "x")
        emit("kiln_hybridized/torch_eager", "speedup", per_epoch["torch_eager"] / per_epoch["kiln_hybridized"], "x")
    emit("kiln_hybridized/kiln_eager", "speedup", per_epoch["kiln_eager"] / per_epoch["kiln_hybridized"], "x")
    emit("kiln", "peak_rss_mb", kiln_rss, "MiB")
    if torch_rss is not None:
        emit("torch", "peak_rss_mb", torch_rss, "MiB")
        emit("torch/kiln", "memory_ratio", torch_rss / kiln_rss, "x")


if __name__ == "__main__":
    main()
