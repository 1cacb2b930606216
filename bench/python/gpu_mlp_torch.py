"""PyTorch's side of the gpu_mlp benchmark (bench/gpu.cc), run by scripts/gpu-check on the GPU
machine after bench_gpu: d2l's MLP 512-256-128-2 at batch 1 in PyTorch eager and
torch.compile(mode="reduce-overhead") (CUDA graphs), microseconds per call, timed the same way
as kiln's (calls back to back, one synchronization at the end, the median of repeats). Given
bench_gpu's JSON lines, it also prints the ratios PyTorch time / kiln time (above 1: kiln is
ahead).

    python3 gpu_mlp_torch.py [BENCH_GPU.jsonl] [--quick]
"""
import statistics
import sys
import time

from gpu_torch_common import emitter, kiln_figures, torch_with_gpu

emit = emitter("gpu_mlp")


def main():
    quick = "--quick" in sys.argv
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    torch = torch_with_gpu(emit)
    if torch is None:
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
    kiln = kiln_figures(files, "gpu_mlp", "us_per_call")
    for k_case, k_us in kiln.items():
        for t_case, t_us in figures.items():
            emit(t_case + "/" + k_case, "speedup", t_us / k_us, "x")


if __name__ == "__main__":
    main()
