"""Overlap of gradient communication with the backward in data-parallel training.

A model trains on two devices (every GPU up to two, else the CPU devices cpu(0) and cpu(1)) with
kiln.Trainer, one minibatch split over the devices per step. Three timings, each the median over
repeated steps (every step waits for the engine at its end):
  compute: forward + backward on every device, then the update without the allreduce
           (trainer.update);
  comm:    trainer.allreduce_grads() alone, on gradients that are already there;
  step:    forward + backward + trainer.step (the bucketed allreduce queued behind the backward,
           then the update).
If communication overlapped the backward perfectly, step would equal compute; without any overlap
step = compute + comm. Hybridized, each device's backward is one compiled task that writes every
gradient at its end, so only the eager case (many tasks, 1 MB buckets) can overlap. Prints JSON lines per model:
  {"bench": "dp_step", "case": "<model>_compute"|"<model>_comm"|"<model>_step", "metric": "ms", ...}
  {"bench": "dp_step", "case": "<model>_step/(compute+comm)", "metric": "fraction", ...}
  {"bench": "dp_step", "case": "<model>_hidden", "metric": "fraction", "value": share of comm hidden}
On a CPU-only machine both devices share the same cores, so communication and computation
compete for them: the overlap that matters is the GPUs'.

Run: python3 bench/python/dp_step.py [--quick] [--repeat N]
"""
import argparse
import json
import statistics
import time

import numpy as np

import kiln
from kiln import autograd, nn


def mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(1024, activation="relu"), nn.Dense(1024, activation="relu"), nn.Dense(10))
    return net, (784,)


def lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=3, activation="relu"), nn.AvgPool2D(2, 2),
            nn.Conv2D(50, kernel_size=5, activation="relu"), nn.AvgPool2D(2, 2),
            nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(10))
    return net, (1, 28, 28)


def measure(name, make, devices, batch, repeat, hybridize=True, bucket_mb=None):
    net, shape = make()
    net.initialize(init=kiln.init.Normal(0.01), device=devices)
    if hybridize:
        net.hybridize()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, bucket_mb=bucket_mb)
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    X = rng.random((batch,) + shape, dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.float32)
    Xs, ys = kiln.split_and_load(X, devices), kiln.split_and_load(y, devices)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]

    def backward():
        with autograd.record():
            ls = [loss(net(a), b) for a, b in zip(Xs, ys)]
        autograd.backward(ls)

    def timed(fn):
        kiln.waitall()
        start = time.perf_counter()
        fn()
        kiln.waitall()
        return (time.perf_counter() - start) * 1e3

    def compute():
        backward()
        trainer.update(batch)

    def comm():
        for p in params:
            for w in p.list_data():
                w._fresh_grad = True
        trainer.allreduce_grads()

    def step():
        backward()
        trainer.step(batch)

    for _ in range(3):
        step()
    times = {"compute": [], "comm": [], "step": []}
    for _ in range(repeat):  # interleaved, so drifts of a shared machine hit all three alike
        times["compute"].append(timed(compute))
        times["comm"].append(timed(comm))
        trainer.update(batch)  # consumes the gradients comm marked
        times["step"].append(timed(step))
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = sum(p.list_data()[0].size * 4 for p in params)
    for k in ("compute", "comm", "step"):
        print(json.dumps({"bench": "dp_step", "case": f"{name}_{k}", "metric": "ms", "value": round(med[k], 3),
                          "unit": "ms", "devices": [repr(d) for d in devices], "batch": batch,
                          "grad_MB": round(nbytes / 2**20, 2), "runs": repeat}), flush=True)
    total = med["compute"] + med["comm"]
    print(json.dumps({"bench": "dp_step", "case": f"{name}_step/(compute+comm)", "metric": "fraction",
                      "value": round(med["step"] / total, 3)}), flush=True)
    hidden = (total - med["step"]) / med["comm"] if med["comm"] > 0 else 0.0
    print(json.dumps({"bench": "dp_step", "case": f"{name}_hidden", "metric": "fraction",
                      "value": round(hidden, 3)}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=None)
    args = p.parse_args()
    repeat = args.repeat or (3 if args.quick else 15)
    devices = kiln.gpus()[:2]
    if len(devices) < 2:
        devices = [kiln.cpu(0), kiln.cpu(1)]
    batch = 64 if args.quick else 256
    measure("mlp", mlp, devices, batch, repeat)
    measure("lenet", lenet, devices, batch, repeat)
    # Eager, with buckets of 1 MB: the backward is many tasks, so a bucket's allreduce can start
    # while the earlier layers' gradients are still being computed.
    measure("mlp_eager", mlp, devices, batch, repeat, hybridize=False, bucket_mb=1)


if __name__ == "__main__":
    main()
