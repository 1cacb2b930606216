"""What the PyTorch sides of the GPU benchmarks share (bench/python/gpu_*_torch.py, run by
scripts/gpu-check after bench_gpu): their JSON lines, bench_gpu's kiln figures read back for the
ratio lines, and PyTorch with a GPU, or the line saying why there is none. Run alone (as
scripts/run-bench runs every file here) it does nothing."""
import json


def emitter(bench, digits=3):
    """A function printing one JSON line of `bench`: emit(case, metric, value, unit)."""
    def emit(case, metric, value, unit):
        print(json.dumps({"bench": bench, "case": case, "metric": metric, "value": round(value, digits),
                          "unit": unit}), flush=True)
    return emit


def kiln_figures(files, bench, metric):
    """{case: value} of bench_gpu's lines (in `files`) of `bench` and `metric` whose case starts
    with kiln_."""
    out = {}
    for path in files:
        with open(path) as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("bench") == bench and d.get("metric") == metric and d.get("case", "").startswith("kiln_"):
                    out[d["case"]] = d["value"]
    return out


def torch_with_gpu(emit):
    """The torch module when PyTorch is installed and sees a GPU; else None, after the skip line."""
    try:
        import torch
    except ImportError:
        emit("skipped", "none", 0, "PyTorch is not installed")
        return None
    if not torch.cuda.is_available():
        emit("skipped", "none", 0, "PyTorch sees no GPU")
        return None
    return torch
