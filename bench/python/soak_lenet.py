"""Soak: trains LeNet for a fixed number of steps and reports the slope of the resident memory.

A training loop that runs for hours must not grow. This trains bench/python/lenet_train.py's
LeNet (eager and hybridized, one case after the other in this process) with SGD on Fashion-MNIST
batches from kiln's DataLoader, epoch after epoch, and samples the process's resident set size
(RSS, /proc/self/statm) every SAMPLE_EVERY steps after kiln.waitall(). The first fifth of the
steps is warm-up (compiles, first allocations, the pool filling up) and left out; over the rest the
Theil-Sen slope (the median of the slopes between every two samples, so that one step of malloc's
heap does not read as a trend) gives MB per 1000 steps. A leak of one batch of images per step
(256 x 784 floats) would read about 800 MB per 1000 steps; keeping one 10-float NDArray per step
reads 1.0 (measured: the array, its Python object and its engine variable), twice SLOPE_BOUND_MB.

Prints JSON lines:
  {"bench": "soak_lenet", "case": "kiln_eager"|"kiln_hybridized", "metric": "rss_slope", "value": ..., "unit": "MB/1000 steps"}
  and per case rss_start_mb (after warm-up), rss_end_mb, pool_cached_start_mb, pool_cached_end_mb
  (the CPU pool's cache: it grows when more work is in flight at once, e.g. on a loaded machine,
  up to KILN_CPU_POOL_MB), steps_per_s; the bound as metric "rss_slope_bound", and the verdict on
  stderr.

Run: python3 bench/python/soak_lenet.py [--steps 1500] [--batch 256] [--quick]
(--quick, for CI: 400 steps of batch 64 per case on 5000 images)
"""
import argparse
import json
import os
import sys
import time

import kiln
from kiln import autograd
from kiln.data import DataLoader, FashionMNIST, transforms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lenet_train import BATCH, LR, initial_weights, kiln_lenet  # noqa: E402  the same network

SAMPLE_EVERY = 20
SLOPE_BOUND_MB = 0.5  # MB per 1000 steps, either way


def emit(case, metric, value, unit):
    print(json.dumps({"bench": "soak_lenet", "case": case, "metric": metric, "value": round(value, 4),
                      "unit": unit}), flush=True)


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def slope_per_1000(points):
    """The Theil-Sen slope of (step, MB) points, in MB per 1000 steps."""
    slopes = sorted((m2 - m1) / (s2 - s1) for i, (s1, m1) in enumerate(points) for s2, m2 in points[i + 1:])
    mid = len(slopes) // 2
    return 1000.0 * (slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2)


def soak(case, train, steps, batch, seed):
    net = kiln_lenet(initial_weights(seed))
    if case == "kiln_hybridized":
        net.hybridize()
    loss_fn = kiln.loss.SoftmaxCrossEntropyLoss()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})
    warmup = steps // 5
    loader = DataLoader(train, batch, shuffle=True, seed=seed, last_batch="discard")
    points, step, start = [], 0, None
    while step < steps:
        for X, y in loader:  # epoch after epoch, a new order each
            with autograd.record():
                loss = loss_fn(net(X), y)
            loss.backward()
            trainer.step(X.shape[0])
            step += 1
            if step == warmup:
                kiln.waitall()
                start = time.perf_counter()
            if step >= warmup and step % SAMPLE_EVERY == 0:
                kiln.waitall()
                points.append((step, rss_mb()))
                if len(points) == 1:
                    pool_start = kiln.cpu_memory_stats()["bytes_cached"] / 2**20
            if step == steps:
                break
    kiln.waitall()
    seconds = time.perf_counter() - start
    slope = slope_per_1000(points)
    emit(case, "rss_slope", slope, "MB/1000 steps")
    emit(case, "rss_start_mb", points[0][1], "MB")
    emit(case, "rss_end_mb", points[-1][1], "MB")
    pool_end = kiln.cpu_memory_stats()["bytes_cached"] / 2**20
    emit(case, "pool_cached_start_mb", pool_start, "MB")
    emit(case, "pool_cached_end_mb", pool_end, "MB")
    emit(case, "steps_per_s", (steps - warmup) / seconds, "steps/s")
    verdict = "flat" if abs(slope) <= SLOPE_BOUND_MB else "GROWS"
    print(f"# soak_lenet {case}: {steps} steps, RSS {points[0][1]:.1f} -> {points[-1][1]:.1f} MB after "
          f"warm-up (the pool's cache {pool_start:.1f} -> {pool_end:.1f} MB), slope {slope:+.3f} MB/1000 steps "
          f"(bound {SLOPE_BOUND_MB}): {verdict}", file=sys.stderr)
    return verdict == "flat"


def main():
    p = argparse.ArgumentParser(description="LeNet training soak: the slope of the resident memory")
    p.add_argument("--steps", type=int, default=1500, help="training steps per case")
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--quick", action="store_true", help="CI: 400 steps of batch 64 per case on 5000 images")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    steps, batch = (400, 64) if args.quick else (args.steps, args.batch)
    if steps < 5 * SAMPLE_EVERY:
        p.error(f"--steps must be at least {5 * SAMPLE_EVERY} to fit samples after the warm-up")
    train = FashionMNIST(train=True, limit=5000 if args.quick else None).transform_first(transforms.ToTensor())
    print(f"# soak_lenet: {steps} steps per case, batch {batch}, RSS sampled every {SAMPLE_EVERY} steps "
          f"after {steps // 5} warm-up steps", file=sys.stderr)
    emit("all", "rss_slope_bound", SLOPE_BOUND_MB, "MB/1000 steps")
    flat = [soak(case, train, steps, batch, args.seed) for case in ("kiln_eager", "kiln_hybridized")]
    # --quick is CI's smoke run on a shared machine: 400 steps are too few for a verdict that noise
    # cannot flip, so it reports the slope and leaves the verdict to the full run.
    sys.exit(0 if all(flat) or args.quick else 1)


if __name__ == "__main__":
    main()
