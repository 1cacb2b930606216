"""Automatic parallelism (d2l.ai, "Automatic Parallelism"), with kiln, on what this machine has.

kiln's engine knows what every queued op reads and writes, so independent work runs at the same
time without being asked to. This example shows

  1. two independent chains of matrix products, one after the other on one device's worker
     against one on each of two CPU devices (cpu(0) and cpu(1) have a worker each);
  2. with a GPU: products on the GPU and copies of their results to the host, one after the
     other against overlapped (compute and copies run on different CUDA streams).

Part 1 uses one thread per kernel (KILN_NUM_THREADS=1, unless set) so the speedup is the
engine's: with multithreaded kernels both chains already share the cores and there is little
left to gain on a small machine. It also lets 256 MB of results wait in the engine
(KILN_ENGINE_MAX_PENDING_MB, default 32): the loop queues all of chain A before chain B, and
with a queue smaller than chain A's results the producer would wait for A to drain before it
could queue B, so B would start late. Part 2 is skipped without a GPU.

Run: python3 examples/python/auto_parallelism.py [--small]
"""
import argparse
import os
import time

os.environ.setdefault("KILN_NUM_THREADS", "1")  # read when kiln's first CPU kernel runs
os.environ.setdefault("KILN_ENGINE_MAX_PENDING_MB", "256")  # read when the engine starts

import kiln  # noqa: E402
from kiln import nd  # noqa: E402
from kiln.utils import Benchmark  # noqa: E402


def run(x, n):
    """A chain of n products of x with itself; each is independent of the others."""
    return [nd.dot(x, x) for _ in range(n)]


def best_of(repeats, fn):
    """The shortest of `repeats` timings of fn() followed by waitall, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        kiln.waitall()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    size, n = (400, 20) if args.small else (1000, 20)

    # 1. Two chains on the CPU.
    print(f"== 1. two chains of {n} products of {size}x{size} matrices on the CPU "
          f"({os.cpu_count()} cores, KILN_NUM_THREADS={os.environ['KILN_NUM_THREADS']}, "
          f"KILN_ENGINE_MAX_PENDING_MB={os.environ['KILN_ENGINE_MAX_PENDING_MB']}) ==")
    x0 = nd.random.uniform(shape=(size, size), device=kiln.cpu(0))
    x0b = x0.copy()  # a second input on the same device
    x1 = x0.copyto(kiln.cpu(1))
    run(x0, n), run(x1, n)
    kiln.waitall()  # warm up: allocations, kernel selection
    one = best_of(3, lambda: run(x0, n))
    seq = best_of(3, lambda: (run(x0, n), run(x0b, n)))
    par = best_of(3, lambda: (run(x0, n), run(x1, n)))
    print(f"chain A on cpu(0):                     {one:.4f} sec")
    print(f"chain A then chain B, both on cpu(0):  {seq:.4f} sec")
    print(f"chain A on cpu(0) & chain B on cpu(1): {par:.4f} sec")
    print(f"concurrent/sequential speedup: {seq / par:.2f}x (ideal {min(2, os.cpu_count() or 1)}x; "
          f"best of 3 runs each)")

    # 2. Compute and copies overlapped on a GPU.
    if kiln.num_gpus() == 0:
        print("\n== 2. compute and copy on a GPU: skipped, no GPU (kiln.num_gpus() == 0) ==")
        return
    gsize, gn = (2000, 10) if args.small else (4000, 20)
    print(f"\n== 2. {gn} products of {gsize}x{gsize} on gpu(0), results copied to the host ==")
    g = nd.random.uniform(shape=(gsize, gsize), device=kiln.gpu(0))
    ys = run(g, gn)
    [y.copyto(kiln.cpu()) for y in ys]
    kiln.waitall()
    with Benchmark("run on gpu(0)") as compute:
        ys = run(g, gn)
        kiln.waitall()
    with Benchmark("copy to cpu") as copy:
        [y.copyto(kiln.cpu()) for y in ys]
        kiln.waitall()
    with Benchmark("run on gpu(0) and copy to cpu, overlapped") as both:
        ys = run(g, gn)
        [y.copyto(kiln.cpu()) for y in ys]  # each copy waits only for its own product
        kiln.waitall()
    print(f"overlap saves {compute.seconds + copy.seconds - both.seconds:.4f} sec of "
          f"{compute.seconds + copy.seconds:.4f} sec")


if __name__ == "__main__":
    main()
