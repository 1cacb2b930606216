"""Python per-op overhead of eager dispatch: `c = a + b` on tiny arrays, kiln vs PyTorch eager (CPU).

Each case runs the add N times in a Python loop, then waits for the queued work (kiln.waitall();
torch runs synchronously), and reports the median of 5 repeats in microseconds per op. PyTorch
gets as many threads as kiln's engine (os.cpu_count()). The 1-element add is the headline case;
the 64-element add shows that the cost is the dispatch, not the arithmetic.

    PYTHONPATH=build/python python3 bench/python/eager_dispatch.py [--quick] [-n N]

Prints JSON lines: {"bench": "eager_dispatch", "case": ..., "metric": ..., "value": ..., "unit": ...}
and the ratio torch_us / kiln_us as case "kiln_python/torch_eager", metric "speedup".
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

import kiln
from kiln import nd


def _time_loop(a, b, n, sync):
    c = a + b  # warm-up: first-call costs (op lookup, allocator) are not per-op overhead
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        c = a + b
    sync()
    return (time.perf_counter() - t0) / n * 1e6, c


def _median_us(a, b, n, sync, repeats):
    return statistics.median(_time_loop(a, b, n, sync)[0] for _ in range(repeats))


def _emit(case, metric, value, unit):
    print(json.dumps({"bench": "eager_dispatch", "case": case, "metric": metric,
                      "value": round(value, 4), "unit": unit}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run for CI")
    p.add_argument("-n", type=int, default=None, help="ops per repeat")
    args = p.parse_args()
    n = args.n or (2000 if args.quick else 100000)
    repeats = 5

    results = {}
    for size, suffix in ((1, ""), (64, "_64elem")):
        x = np.arange(size, dtype=np.float32)
        a, b = nd.array(x), nd.array(x + 1)
        us = _median_us(a, b, n, kiln.waitall, repeats)
        results["kiln" + suffix] = us
        _emit("kiln_python" + suffix, "us_per_op", us, "us")

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(os.cpu_count())
        for size, suffix in ((1, ""), (64, "_64elem")):
            a = torch.arange(size, dtype=torch.float32)
            b = a + 1
            us = _median_us(a, b, n, lambda: None, repeats)
            results["torch" + suffix] = us
            _emit("torch_eager" + suffix, "us_per_op", us, "us")
        _emit("kiln_python/torch_eager", "speedup", results["torch"] / results["kiln"], "x")
        _emit("kiln_python/torch_eager_64elem", "speedup", results["torch_64elem"] / results["kiln_64elem"], "x")


if __name__ == "__main__":
    main()
