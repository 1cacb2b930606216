"""Compile time of LeNet's training graph, cold and from the kernel disk cache.

The d2l.ai LeNet (as in lenet_train.py), hybridized, trained one step at a time on a random
batch of 256 with softmax cross-entropy and SGD. The first forward call under autograd.record()
traces the block and compiles its training graph (the forward that saves what the backward reads,
and the backward): the pass pipeline, planning, kernel compilation or loading. A call returns
once its graph is compiled and its run is queued on the engine (kiln is asynchronous), so the
compile time is the first call's return time minus the median return time of the calls after it:
tracing included, the run itself not. The calling thread's CPU time over the same span is printed
beside it (`cpu_s`): on a machine shared with other work the wall time of a few milliseconds
includes waits for a core, the CPU time does not. The compile report's own total (`report_ms`: pipeline,
planning and codegen, tracing excluded) is printed beside it. Each measurement runs in a fresh
process, so nothing is cached in memory:
  cold: an empty KILN_CACHE_DIR (every generated kernel, elementwise or row, is built by LLVM),
  warm: the directory the cold run filled (every kernel is loaded from disk); each cold run is
        followed by --warm-runs warm ones (a warm run is short, so a stall of the scheduler on a
        busy machine weighs on one sample; the median over more of them is steadier).
Targets (the optimizing-compiler issue): cold under 2 s, warm under 0.1 s; warm at most a tenth
of cold (issue 13: the disk cache serves row kernels too).

Prints JSON lines:
  {"bench": "compile_time", "case": "cold"|"warm", "metric": "seconds", "value": ..., "kernels": ..., ...}
  {"bench": "compile_time", "case": "cold/warm", "metric": "speedup", "value": ..., "unit": "x", ...}

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
        kiln.waitall()
        with autograd.record():
            start, cpu_start = time.perf_counter(), time.thread_time()
            out = net(X)
            returned, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
            l = loss(out, y)
        l.backward()
        trainer.step(256)
        kiln.waitall()
        return returned, cpu

    before = kiln.codegen_stats()
    first, first_cpu = step()
    after = kiln.codegen_stats()
    report_ms = net.compile_report(as_dict=True)["total_ms"]
    steady_runs = [step() for _ in range(5)]
    steady = statistics.median(r[0] for r in steady_runs)
    steady_cpu = statistics.median(r[1] for r in steady_runs)
    print(json.dumps({"seconds": max(first - steady, 0.0), "first_call": first, "steady_call": steady,
                      "cpu_seconds": max(first_cpu - steady_cpu, 0.0),
                      "report_ms": report_ms,
                      "compiled": after.get("compiles", 0) - before.get("compiles", 0),
                      "loaded": after.get("disk_hits", 0) - before.get("disk_hits", 0),
                      "kernel_ms": after.get("compile_ms", 0) - before.get("compile_ms", 0),
                      "by_kind": {kind: {"compiled": s["compiles"] - before["kinds"][kind]["compiles"],
                                         "loaded": s["disk_hits"] - before["kinds"][kind]["disk_hits"]}
                                  for kind, s in after.get("kinds", {}).items()},
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
    ap.add_argument("--warm-runs", type=int, default=3, help="warm processes after each cold one")
    ap.add_argument("--quick", action="store_true", help="one cold and one warm run (CI)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    runs = {"cold": [], "warm": []}
    for _ in range(1 if args.quick else args.repeat):
        with tempfile.TemporaryDirectory(prefix="kiln-compile-time-") as d:
            runs["cold"].append(run_child(d))
            for _ in range(1 if args.quick else max(args.warm_runs, 1)):
                runs["warm"].append(run_child(d))
    for case, target in (("cold", 2.0), ("warm", 0.1)):
        rs = runs[case]
        med = statistics.median(r["seconds"] for r in rs)
        print(json.dumps({"bench": "compile_time", "case": case, "metric": "seconds", "value": round(med, 4),
                          "unit": "s", "target": target, "runs": [round(r["seconds"], 4) for r in rs],
                          "kernels_compiled": rs[0]["compiled"], "kernels_loaded": rs[0]["loaded"],
                          "kernels_by_kind": rs[0]["by_kind"],
                          "kernel_ms": round(statistics.median(r["kernel_ms"] for r in rs), 2),
                          "report_ms": round(statistics.median(r["report_ms"] for r in rs), 2),
                          "steady_call_s": round(statistics.median(r["steady_call"] for r in rs), 5),
                          "cpu_s": round(statistics.median(r["cpu_seconds"] for r in rs), 4),
                          "codegen": rs[0]["available"]}), flush=True)
    for metric, field in (("speedup", "seconds"), ("cpu_speedup", "cpu_seconds")):
        cold, warm = (statistics.median(r[field] for r in runs[c]) for c in ("cold", "warm"))
        print(json.dumps({"bench": "compile_time", "case": "cold/warm", "metric": metric,
                          "value": round(cold / warm, 2) if warm > 0 else None, "unit": "x", "target": 10.0}),
              flush=True)


if __name__ == "__main__":
    main()
