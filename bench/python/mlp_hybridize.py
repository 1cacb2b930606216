"""The d2l.ai hybridize benchmark: the 512-256-128-2 MLP called 1000 times on a (1, 512) input
(and on a batch of 64): kiln eager, kiln hybridized, kiln hybridized with freeze=True, PyTorch
eager, torch.jit.script and torch.jit.trace + torch.jit.freeze, in one run, same thread count.

    PYTHONPATH=build/python python3 bench/python/mlp_hybridize.py [--quick]

Prints JSON lines {"bench": "mlp_hybridize", "case": ..., "metric": "us_per_call", ...} per batch
size (cases for batch 64 end in _b64), medians of 5 repeats, and the ratios
kiln_hybridized/<each other case> and kiln_frozen/torch_jit_trace, the two frozen graphs (metric
"speedup": above 1 means kiln is ahead).
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

import kiln
from kiln import nd, nn


def emit(case, metric, value, unit):
    print(json.dumps({"bench": "mlp_hybridize", "case": case, "metric": metric, "value": round(value, 4),
                      "unit": unit}), flush=True)


def kiln_net(weights):
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    net(nd.zeros((1, 512)))
    for p, w in zip(net.collect_params().values(), weights):
        p.set_data(nd.array(w))
    return net


def time_calls(call, sync, n, repeats):
    call()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            y = call()
        sync()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples), y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a short run for CI")
    args = ap.parse_args()
    n, repeats = (100, 3) if args.quick else (1000, 5)
    rng = np.random.default_rng(0)
    shapes = [(256, 512), (256,), (128, 256), (128,), (2, 128), (2,)]
    weights = [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]

    # kiln first, for both batch sizes, then PyTorch: once torch has run, its idle OpenMP threads
    # spin and would slow what runs after them in this process.
    inputs = {b: rng.normal(size=(b, 512)).astype(np.float32) for b in (1, 64)}
    t = {b: {} for b in inputs}
    kiln_out = {}
    for batch, xn in inputs.items():
        x = nd.array(xn)
        eager = kiln_net(weights)
        hybrid = kiln_net(weights)
        hybrid.hybridize()
        frozen = kiln_net(weights)
        frozen.hybridize(freeze=True)
        t[batch]["kiln_eager"], ye = time_calls(lambda: eager(x), kiln.waitall, n, repeats)
        t[batch]["kiln_hybridized"], yh = time_calls(lambda: hybrid(x), kiln.waitall, n, repeats)
        t[batch]["kiln_frozen"], yf = time_calls(lambda: frozen(x), kiln.waitall, n, repeats)
        kiln_out[batch] = (ye.asnumpy(), yh.asnumpy(), yf.asnumpy())

    import torch
    torch.set_num_threads(os.cpu_count())
    tnet = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 2)).eval()
    with torch.no_grad():
        for p, w in zip(tnet.parameters(), weights):
            p.copy_(torch.from_numpy(w))
    for batch, xn in inputs.items():
        xt = torch.from_numpy(xn)
        with torch.no_grad():
            scripted = torch.jit.script(tnet)
            traced = torch.jit.freeze(torch.jit.trace(tnet, xt))
            t[batch]["torch_eager"], yt = time_calls(lambda: tnet(xt), lambda: None, n, repeats)
            t[batch]["torch_jit_script"], _ = time_calls(lambda: scripted(xt), lambda: None, n, repeats)
            t[batch]["torch_jit_trace"], _ = time_calls(lambda: traced(xt), lambda: None, n, repeats)
        ref = yt.numpy()
        for name, y in zip(("kiln_eager", "kiln_hybridized", "kiln_frozen"), kiln_out[batch]):
            err = float(np.abs(y - ref).max())
            if err > 1e-3:
                raise SystemExit(f"mlp_hybridize: {name} differs from torch by {err} at batch {batch}")

    for batch, cases in t.items():
        sfx = "" if batch == 1 else f"_b{batch}"
        for case, us in cases.items():
            emit(case + sfx, "us_per_call", us, "us")
        for case, us in cases.items():
            if case != "kiln_hybridized":
                emit(f"kiln_hybridized/{case}{sfx}", "speedup", us / cases["kiln_hybridized"], "x")
        emit(f"kiln_frozen/torch_jit_trace{sfx}", "speedup", cases["torch_jit_trace"] / cases["kiln_frozen"], "x")


if __name__ == "__main__":
    main()
