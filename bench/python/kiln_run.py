"""kiln-run latency of the exported d2l.ai MLP (512-256-128-2, batch 1) against the same compiled
model called from Python (hybridized block, and the SymbolBlock imported from the same files).

    PYTHONPATH=build/python python3 bench/python/kiln_run.py [--quick]

Prints kiln-run's own JSON line, then {"bench": "kiln_run", "case": "python_hybridized"|
"python_symbolblock", "metric": "us_per_call", ...} (each call waits for its result, as kiln-run
does) and the ratios kiln_run/<case> (metric "speedup": above 1 means kiln-run is faster).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import kiln
from kiln import nd, nn


def emit(case, metric, value, unit):
    print(json.dumps({"bench": "kiln_run", "case": case, "metric": metric, "value": round(value, 4),
                      "unit": unit}), flush=True)


def per_call_us(f, n, repeats):
    f()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            f().wait_to_read()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, repeats = (200, 3) if args.quick else (2000, 5)
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(kiln._C.__file__))))
    tool = os.path.join(build, "tools", "kiln-run")
    if not os.path.exists(tool):
        sys.exit(f"kiln_run bench: {tool} not found; build the project first (make build)")
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    x = nd.random.normal(shape=(1, 512))
    net.hybridize()
    net(x)
    net(x)
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "mlp")
        sym, params = net.export(prefix)
        np.save(os.path.join(d, "x.npy"), x.asnumpy())
        out = subprocess.run([tool, sym, "--params", params, "--input", "data=" + os.path.join(d, "x.npy"),
                              "--repeat", str(n * repeats)], capture_output=True, text=True, check=True)
        line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
        print(line, flush=True)
        tool_us = json.loads(line)["value"]
        imported = nn.SymbolBlock.imports(sym, ["data"], params)
        cases = {"python_hybridized": per_call_us(lambda: net(x), n, repeats),
                 "python_symbolblock": per_call_us(lambda: imported(x), n, repeats)}
    for case, us in cases.items():
        emit(case, "us_per_call", us, "us")
    for case, us in cases.items():
        emit(f"kiln_run/{case}", "speedup", us / tool_us, "x")


if __name__ == "__main__":
    main()
