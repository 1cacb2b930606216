"""Images per second of data-parallel training on one device versus two.

LeNet (batch 256) and d2l's small ResNet-18 for 28x28 images (batch 128; channel width 64, or 16
with --quick) train hybridized on random Fashion-MNIST-sized batches with kiln.Trainer (SGD), on
one device and on two (every GPU up to two, else the CPU devices cpu(0) and cpu(1)), each batch
split over the devices. Each figure is the median over repeated timed windows of several steps
that end with a sync. Prints JSON lines:
  {"bench": "dp_throughput", "case": "<model>_1dev"|"<model>_2dev", "metric": "images_per_s", ...}
  {"bench": "dp_throughput", "case": "<model>_2dev/1dev", "metric": "speedup", ...}
Two CPU devices of one machine share its cores, so on a CPU-only machine the speedup measures
the cost of the split and the allreduce (ideal 1.0), not added compute; on two GPUs the ideal is 2.

Run: python3 bench/python/dp_throughput.py [--quick] [--repeat N]
"""
import argparse
import importlib.util
import json
import os
import statistics
import time

import numpy as np

import kiln
from kiln import autograd, nn

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "concise", os.path.join(_here, "..", "..", "examples", "python", "multi_device_concise.py"))
_concise = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_concise)


def lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=3, activation="relu"), nn.AvgPool2D(2, 2),
            nn.Conv2D(50, kernel_size=5, activation="relu"), nn.AvgPool2D(2, 2),
            nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(10))
    return net


def images_per_s(make, devices, batch, steps, repeat):
    net = make()
    net.initialize(init=kiln.init.Normal(0.01), device=devices)
    net.hybridize()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    X = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.float32)

    def step():
        Xs, ys = kiln.split_and_load(X, devices), kiln.split_and_load(y, devices)
        with autograd.record():
            ls = [loss(net(a), b) for a, b in zip(Xs, ys)]
        autograd.backward(ls)
        trainer.step(batch)

    for _ in range(2):
        step()
    rates = []
    for _ in range(repeat):
        kiln.waitall()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        kiln.waitall()
        rates.append(steps * batch / (time.perf_counter() - start))
    return statistics.median(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=None)
    args = p.parse_args()
    repeat = args.repeat or (2 if args.quick else 5)
    two = kiln.gpus()[:2]
    if len(two) < 2:
        two = [kiln.cpu(0), kiln.cpu(1)]
    width = 16 if args.quick else 64
    models = [("lenet", lenet, 256, 2 if args.quick else 5),
              ("resnet18", lambda: _concise.resnet18(10, width), 32 if args.quick else 128, 1 if args.quick else 3)]
    for name, make, batch, steps in models:
        rates = {}
        for label, devices in (("1dev", two[:1]), ("2dev", two)):
            rates[label] = images_per_s(make, devices, batch, steps, repeat)
            print(json.dumps({"bench": "dp_throughput", "case": f"{name}_{label}", "metric": "images_per_s",
                              "value": round(rates[label], 1), "unit": "images/s",
                              "devices": [repr(d) for d in devices], "batch": batch,
                              "width": width if name == "resnet18" else None, "runs": repeat}), flush=True)
        print(json.dumps({"bench": "dp_throughput", "case": f"{name}_2dev/1dev", "metric": "speedup",
                          "value": round(rates["2dev"] / rates["1dev"], 3)}), flush=True)


if __name__ == "__main__":
    main()
