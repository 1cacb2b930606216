"""Compile time of LeNet's training graph, cold and from the kernel disk cache.

The d2l.ai LeNet (as in lenet_train.py), hybridized, trained one step at a time on a random
batch of 256 with softmax cross-entropy and SGD. The first forward call under autograd.record()
traces the block and compiles its training graph (the forward that saves what the backward reads,
and the backward): the pass pipeline, planning, kernel compilation or loading. The compile time
is that call's time minus the median time of the forward calls after it (each timed up to
kiln.waitall(); the backward is left out of both because its time on this shared machine varies
far more than the compile takes). Each measurement runs in a fresh process, so nothing is cached
in memory:
  cold: an empty KILN_CACHE_DIR (every fused kernel is built by LLVM),
  warm: the directory the cold run filled (every kernel is loaded from disk).
Targets (the optimizing-compiler issue): cold under 2 s, warm under 0.1 s.

Prints JSON lines:
  {"bench": "compile_time", "case": "cold"|"warm", "metric": "seconds", "value": ..., "kernels": ..., ...}

Run: python3 bench/python/compile_time.py [--repeat 3] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child():
    import kiln
    from kiln import autograd, nd, nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=3, activation="relu"), nn.AvgPool2D(2, 2),
            nn.Conv2D(50, kernel_size=5, activation="relu"), nn.AvgPool2D(2, 2),
            nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(10))
    net.initialize(init=kiln.init.Normal(0.01))
    loss = kiln.loss.SoftmaxCrossEntropyLoss()
    X = nd.random.uniform(0, 1, (256, 1, 28, 28))
    y = nd.array([i % 10 for i in range(256)], dtype="int64")
    net(X)  # deferred shape inference, eagerly: parameter creation is not compilation
    kiln.waitall()
    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    net.hybridize()

    def step():
        start = time.perf_counter()
        with autograd.record():
            out = net(X)
            kiln.waitall()
            forward = time.perf_counter() - start
            l = loss(out, y)
        l.backward()
        trainer.step(256)
        kiln.waitall()
        return forward

    before = kiln.codegen_stats()
    first = step()
    after = kiln.codegen_stats()
    steady = statistics.median(step() for _ in range(5))
    print(json.dumps({"seconds": max(first - steady, 0.0), "first_forward": first, "steady_forward": steady,
                      "compiled": after.get("compiles", 0) - before.get("compiles", 0),
                      "loaded": after.get("disk_hits", 0) - before.get("disk_hits", 0),
                      "kernel_ms": after.get("compile_ms", 0) - before.get("compile_ms", 0),
                      "available": after["available"]}))


def run_child(cache_dir):
    env = dict(os.environ, KILN_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        sys.exit("compile_time: the measuring process failed:\n" + out.stderr)
    return json.loads(out.stdout.splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="cold/warm pairs; medians are reported")
    ap.add_argument("--quick", action="store_true", help="one pair (CI)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    runs = {"cold": [], "warm": []}
    for _ in range(1 if args.quick else args.repeat):
        with tempfile.TemporaryDirectory(prefix="kiln-compile-time-") as d:
            runs["cold"].append(run_child(d))
            runs["warm"].append(run_child(d))
    for case, target in (("cold", 2.0), ("warm", 0.1)):
        rs = runs[case]
        med = statistics.median(r["seconds"] for r in rs)
        print(json.dumps({"bench": "compile_time", "case": case, "metric": "seconds", "value": round(med, 4),
                          "unit": "s", "target": target, "runs": [round(r["seconds"], 4) for r in rs],
                          "kernels_compiled": rs[0]["compiled"], "kernels_loaded": rs[0]["loaded"],
                          "kernel_ms": round(statistics.median(r["kernel_ms"] for r in rs), 2),
                          "steady_forward_s": round(statistics.median(r["steady_forward"] for r in rs), 4),
                          "codegen": rs[0]["available"]}), flush=True)


if __name__ == "__main__":
    main()
