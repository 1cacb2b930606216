"""Asynchronous computation (d2l.ai, "Asynchronous Computation"), with kiln.

kiln's ops return as soon as their work is queued on the engine; only reading a value
(asnumpy(), item(), wait_to_read()) or kiln.waitall() waits. This example shows

  1. kiln against NumPy on the same matrix products;
  2. the time to queue work against the time to finish it;
  3. a loop that waits after every step against one that waits once at the end;
  4. what skipping the per-step waits costs in memory, and how the engine bounds it
     (KILN_ENGINE_MAX_PENDING tasks, KILN_ENGINE_MAX_PENDING_MB of queued outputs).

Run: python3 examples/python/async_computation.py [--small]
"""
import argparse
import os
import time

import numpy as np

import kiln
from kiln import nd
from kiln.utils import Benchmark


def rss_mb():
    """Resident memory of this process in MB (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    n_mat, reps = (400, 5) if args.small else (1000, 10)
    size, steps = (1000, 50) if args.small else (2000, 200)
    tiny_steps = 2000 if args.small else 10000

    # 1. The same work in NumPy (which runs each product before returning) and in kiln.
    print(f"== 1. {reps} products of {n_mat}x{n_mat} matrices ==")
    with Benchmark("numpy"):
        for _ in range(reps):
            a = np.random.normal(size=(n_mat, n_mat)).astype(np.float32)
            b = np.dot(a, a)
    with Benchmark("kiln.nd"):
        for _ in range(reps):
            a = nd.random.normal(shape=(n_mat, n_mat))
            b = nd.dot(a, a)

    # 2. The loop above returned before the products were done: queueing is not finishing.
    print("\n== 2. queueing vs finishing ==")
    kiln.waitall()
    start = time.perf_counter()
    for _ in range(reps):
        b = nd.dot(a, a)
    queued = time.perf_counter() - start
    b.wait_to_read()
    done = time.perf_counter() - start
    print(f"queued {reps} products in {queued:.4f} sec; all done after {done:.4f} sec")

    # 3. Waiting after every step stalls the frontend; waiting once lets it run ahead.
    for shape, n in (((size, size), steps), ((1, 2), tiny_steps)):
        print(f"\n== 3. {n} steps of y = x + 1 on {shape[0]}x{shape[1]} ==")
        x = nd.ones(shape)
        kiln.waitall()
        with Benchmark("synchronous (wait_to_read every step)") as sync:
            for _ in range(n):
                y = x + 1
                y.wait_to_read()
        with Benchmark("asynchronous (one waitall at the end)") as asyn:
            for _ in range(n):
                y = x + 1
            kiln.waitall()
        print(f"asynchronous/synchronous speedup: {sync.seconds / asyn.seconds:.2f}x")

    # 4. Memory: without per-batch syncs the frontend queues batches faster than they finish.
    # The engine's backpressure makes Push wait once its queue is full, so memory stays bounded.
    print("\n== 4. memory with and without per-batch syncs ==")
    print(f"engine limits: {os.environ.get('KILN_ENGINE_MAX_PENDING', '1024')} pending tasks, "
          f"{os.environ.get('KILN_ENGINE_MAX_PENDING_MB', '32')} MB of pending outputs")
    batch, features, n_batches = (256, 512, 40) if args.small else (512, 1024, 100)
    w = nd.random.normal(0, 0.01, shape=(features, features))
    for sync_each in (True, False):
        kiln.waitall()
        pushed0, rss0 = kiln._C.engine_stats()["pushed"], rss_mb()
        peak_tasks = peak_bytes = 0
        start = time.perf_counter()
        total = 0.0
        for _ in range(n_batches):
            X = nd.random.normal(shape=(batch, features))
            loss = (nd.relu(nd.dot(X, w)) ** 2).mean()
            if sync_each:
                total += loss.item()  # a sync point: the batch is done before the next is queued
            stats = kiln._C.engine_stats()  # sampled once per batch: what is queued right now
            peak_tasks, peak_bytes = max(peak_tasks, stats["pending"]), max(peak_bytes, stats["pending_bytes"])
        kiln.waitall()
        label = "with per-batch sync" if sync_each else "without syncs     "
        print(f"{label}: {time.perf_counter() - start:.4f} sec, "
              f"{kiln._C.engine_stats()['pushed'] - pushed0} tasks, at most {peak_tasks} tasks / "
              f"{peak_bytes / 2**20:.1f} MB queued, RSS {rss0:.0f} -> {rss_mb():.0f} MB")

if __name__ == "__main__":
    main()
