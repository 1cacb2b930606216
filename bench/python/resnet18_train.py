"""ResNet-18 training on Fashion-MNIST: kiln eager and hybridized against PyTorch eager and
torch.jit.script, each in its own process, measured in the same run.

The model is d2l.ai's ResNet-18 for 28x28 images (the computational-performance chapter's:
3x3 stem with BatchNorm and relu and no max-pooling, four stages of two residual blocks with
64-128-256-512 channels, global average pooling, Dense(10)), trained with minibatch SGD (lr 0.05,
batch 256) on softmax cross-entropy over the first training images of Fashion-MNIST, scaled to
[0, 1]. Every case runs the same number of steps on the same batches: two warm-up steps (kernel
choice, the trace, TorchScript's profiling runs), then `--repeats` timings of `--steps` steps each,
one synchronization at the end of each; the median gives images per second. Both frameworks use
os.cpu_count() threads.

Each case runs in its own process, so that its peak resident memory (getrusage's ru_maxrss:
Python, the framework, the data and the training) is its own, and so that PyTorch's idle OpenMP
threads do not slow kiln. The torch processes read the IDX files with NumPy and never import kiln.

Prints JSON lines:
  {"bench": "resnet18_train", "case": CASE, "metric": "images_per_s"|"peak_rss_mb"|"first_loss"|"last_loss", ...}
  {"bench": "resnet18_train", "case": "kiln_hybridized/torch_eager", "metric": "speedup", ...}  (and the others)
  {"bench": "resnet18_train", "case": "torch_eager/kiln_hybridized", "metric": "memory_ratio", ...}

Run: python3 bench/python/resnet18_train.py [--steps 4] [--repeats 3] [--quick]
(--quick: batch 32 and a quarter of the channels, for CI.)
"""
import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

CASES = ("kiln_eager", "kiln_hybridized", "torch_eager", "torch_jit_script")
ROOT = "/usr/share/datasets/fashion-mnist"
LR = 0.05


def emit(case, metric, value, unit):
    print(json.dumps({"bench": "resnet18_train", "case": case, "metric": metric, "value": round(value, 6),
                      "unit": unit}), flush=True)


def batches(n_batches, batch):
    """The first n_batches * batch training images (N, 1, 28, 28) in [0, 1] and their labels."""
    n = n_batches * batch
    with gzip.open(os.path.join(ROOT, "train-images-idx3-ubyte.gz"), "rb") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16)[:n * 784]
    with gzip.open(os.path.join(ROOT, "train-labels-idx1-ubyte.gz"), "rb") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    if len(labels) < n:
        raise SystemExit(f"resnet18_train: {ROOT} holds {len(labels)} training images, {n} are needed")
    x = (images.reshape(n_batches, batch, 1, 28, 28).astype(np.float32) / 255)
    return x, labels.reshape(n_batches, batch).astype(np.int64)


def time_steps(step, sync, n_warmup, steps, repeats):
    losses = [step(i) for i in range(n_warmup)]
    sync()
    seconds = []
    for r in range(repeats):
        t0 = time.perf_counter()
        for s in range(steps):
            loss = step(n_warmup + r * steps + s)
        sync()
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
    return statistics.median(seconds), [float(l) for l in losses]


# ---- kiln ----

def run_kiln(args, hybridize):
    import kiln
    from kiln import autograd, nd, nn

    def resnet_block(channels, n, first_block=False):
        blk = nn.HybridSequential()
        for i in range(n):
            blk.add(nn.Residual(channels, use_1x1conv=True, strides=2) if i == 0 and not first_block
                    else nn.Residual(channels))
        return blk

    w = args.width
    net = nn.HybridSequential()
    net.add(nn.Conv2D(w, kernel_size=3, strides=1, padding=1), nn.BatchNorm(), nn.Activation("relu"))
    net.add(resnet_block(w, 2, first_block=True), resnet_block(2 * w, 2), resnet_block(4 * w, 2),
            resnet_block(8 * w, 2))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(10))
    net.initialize(init=kiln.init.Xavier())
    if hybridize:
        net.hybridize()
    loss_fn = kiln.loss.SoftmaxCrossEntropyLoss()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})
    xs, ys = batches(args.n_batches, args.batch)
    X = [nd.array(x) for x in xs]
    Y = [nd.array(y.astype(np.float32)) for y in ys]

    def step(i):
        k = i % len(X)
        with autograd.record():
            l = loss_fn(net(X[k]), Y[k]).mean()
        l.backward()
        trainer.step(1)
        return l

    sec, losses = time_steps(step, kiln.waitall, 2, args.steps, args.repeats)
    return sec, [float(l.item()) if hasattr(l, "item") else l for l in losses]


# ---- PyTorch ----

def run_torch(args, script):
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    tnn = torch.nn

    class Residual(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride=stride, padding=1)
            self.conv2 = tnn.Conv2d(cout, cout, 3, padding=1)
            self.shortcut = tnn.Conv2d(cin, cout, 1, stride=stride) if stride != 1 else tnn.Identity()
            self.bn1, self.bn2 = tnn.BatchNorm2d(cout), tnn.BatchNorm2d(cout)

        def forward(self, x):
            y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(y + self.shortcut(x))

    w = args.width
    layers = [tnn.Conv2d(1, w, 3, padding=1), tnn.BatchNorm2d(w), tnn.ReLU()]
    cin = w
    for stage in range(4):
        cout = w << stage
        layers += [Residual(cin, cout, 2 if stage else 1), Residual(cout, cout, 1)]
        cin = cout
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, 10)]
    net = tnn.Sequential(*layers)
    model = torch.jit.script(net) if script else net
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    loss_fn = tnn.CrossEntropyLoss()
    xs, ys = batches(args.n_batches, args.batch)
    X = [torch.from_numpy(x) for x in xs]
    Y = [torch.from_numpy(y) for y in ys]

    def step(i):
        k = i % len(X)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(X[k]), Y[k])
        loss.backward()
        opt.step()
        return loss.item()

    return time_steps(step, lambda: None, 2, args.steps, args.repeats)


def run_case(name, args):
    if name.startswith("kiln"):
        sec, losses = run_kiln(args, hybridize=name == "kiln_hybridized")
    else:
        sec, losses = run_torch(args, script=name == "torch_jit_script")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"images_per_s": args.batch * args.steps / sec, "peak_rss_mb": rss_mb, "first_loss": losses[0],
            "last_loss": losses[-1]}


def main():
    p = argparse.ArgumentParser(description="ResNet-18 training: kiln eager and hybridized vs PyTorch")
    p.add_argument("--steps", type=int, default=4, help="steps per timing")
    p.add_argument("--repeats", type=int, default=3, help="timings; the median is reported")
    p.add_argument("--quick", action="store_true", help="CI: batch 32, width 16, 2 steps, 1 timing")
    p.add_argument("--only", choices=CASES, help=argparse.SUPPRESS)  # one case, in its own process
    args = p.parse_args()
    args.batch, args.width = (32, 16) if args.quick else (256, 64)
    if args.quick:
        args.steps, args.repeats = 2, 1
    args.n_batches = 2 + args.steps * args.repeats
    if args.only:
        print(json.dumps(run_case(args.only, args)))
        return
    print(f"# resnet18_train: batch {args.batch}, width {args.width}, {args.steps} steps x {args.repeats} "
          f"timings after 2 warm-up steps, {os.cpu_count()} threads, each case in its own process", file=sys.stderr)
    results = {}
    for name in CASES:
        cmd = [sys.executable, os.path.abspath(__file__), "--only", name, "--steps", str(args.steps),
               "--repeats", str(args.repeats)] + (["--quick"] if args.quick else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            if name.startswith("kiln"):
                raise SystemExit(f"resnet18_train: {name} failed:\n{out.stderr.strip()[-2000:]}")
            print(f"# {name} failed (is python3-torch installed?): {out.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[name]
        emit(name, "images_per_s", r["images_per_s"], "images/s")
        emit(name, "peak_rss_mb", r["peak_rss_mb"], "MiB")
        emit(name, "first_loss", r["first_loss"], "loss")
        emit(name, "last_loss", r["last_loss"], "loss")
        if not (r["last_loss"] == r["last_loss"] and r["last_loss"] < 10):  # NaN or diverged
            raise SystemExit(f"resnet18_train: {name} did not train: loss {r['first_loss']} -> {r['last_loss']}")
    for k in ("kiln_eager", "kiln_hybridized"):
        for t in ("torch_eager", "torch_jit_script"):
            if k in results and t in results:
                emit(f"{k}/{t}", "speedup", results[k]["images_per_s"] / results[t]["images_per_s"], "x")
                emit(f"{t}/{k}", "memory_ratio", results[t]["peak_rss_mb"] / results[k]["peak_rss_mb"], "x")


if __name__ == "__main__":
    main()
