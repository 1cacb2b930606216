"""PyTorch's side of the gpu_mlp benchmark (bench/gpu.cc), run by scripts/gpu-check on the GPU
machine after bench_gpu: d2l's MLP 512-256-128-2 at batch 1 in PyTorch eager and
torch.compile(mode="reduce-overhead") (CUDA graphs), microseconds per call, timed the same way
as kiln's (calls back to back, one synchronization at the end, the median of repeats). Given
bench_gpu's JSON lines, it also prints the ratios PyTorch time / kiln time (above 1: kiln is
ahead).

    python3 gpu_mlp_torch.py [BENCH_GPU.jsonl] [--quick]
"""
import json
import statistics
import sys
import time


def emit(case, metric, value, unit):
    print(json.dumps({"bench": "gpu_mlp", "case": case, "metric": metric, "value": round(value, 3), "unit": unit}),
          flush=True)


def main():
    quick = "--quick" in sys.argv
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    try:
        import torch
    except ImportError:
        emit("skipped", "none", 0, "PyTorch is not installed")
        return
    if not torch.cuda.is_available():
        emit("skipped", "none", 0, "PyTorch sees no GPU")
        return
    calls, repeats = (200, 3) if quick else (2000, 7)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 2)).cuda().eval()
    x = torch.randn(1, 512, device="cuda")

    def us_per_call(fn):
        out = []
        with torch.no_grad():
            for r in range(repeats + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    y = fn(x)
                y.cpu()
                if r:
                    out.append((time.perf_counter() - t0) * 1e6 / calls)
        return statistics.median(out)

    figures = {"torch_eager": us_per_call(model)}
    emit("torch_eager", "us_per_call", figures["torch_eager"], "us")
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(5):  # compiles, then records the CUDA graph
                compiled(x)
        figures["torch_compile"] = us_per_call(compiled)
        emit("torch_compile_reduce_overhead", "us_per_call", figures["torch_compile"], "us")
    except Exception as e:  # no Triton or no C compiler on this machine
        emit("skipped", "none", 0, "torch.compile failed: " + str(e).splitlines()[0][:120])
    kiln = {}
    for path in files:
        with open(path) as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("bench") == "gpu_mlp" and d.get("metric") == "us_per_call":
                    kiln[d["case"]] = d["value"]
    for k_case, k_us in kiln.items():
        if not k_case.startswith("kiln_"):
            continue
        for t_case, t_us in figures.items():
            emit(t_case + "/" + k_case, "speedup", t_us / k_us, "x")


if __name__ == "__main__":
    main()
