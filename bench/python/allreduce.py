"""Allreduce bandwidth: in-process across CPU devices, and across 2 processes under mpirun.

Cases, for float32 buffers of 1 KB to 256 MB (--quick: 1 KB, 64 KB, 4 MB):
  inproc_cpu2:  kiln._C.allreduce over cpu(0), cpu(1) in one process (skipped, with a note, when
                this build of kiln._C has no in-process allreduce);
  copy:         one copy of the same buffer between the two devices: the machine's copy bandwidth
                in the same run (the allreduce reads two buffers and writes two);
  inproc_gpuN:  with two or more GPUs, NCCL among them, with the bus bandwidth beside it;
  kiln_2proc:   kiln.distributed.allreduce between 2 processes (mpirun --oversubscribe -np 2);
  mpi_2proc:    MPI_Allreduce called directly (ctypes on libmpi) in the same 2 processes, on the
                same buffer (shared with the NDArray through DLPack): the reference.
The metric is the algorithm bandwidth, bytes / time, in GB/s (medians of repeated timings, each
over enough back-to-back calls to last a few milliseconds), plus the ratio line
kiln_2proc/mpi_2proc (metric speedup, above 1: kiln ahead) at the largest size; target >= 0.8.

Prints JSON lines:
  {"bench": "allreduce", "case": "kiln_2proc", "metric": "GB_per_s", "value": ..., "unit": "GB/s", "bytes": ...}

Run: python3 bench/python/allreduce.py [--repeat 5] [--quick]
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

FULL_SIZES = [1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [1 << 10, 64 << 10, 4 << 20]


def emit(case, metric, value, unit, **extra):
    print(json.dumps({"bench": "allreduce", "case": case, "metric": metric, "value": round(value, 4),
                      "unit": unit, **extra}), flush=True)


def calls_for(nbytes):
    return max(1, min(200, (32 << 20) // nbytes))


def timed(fn, calls, repeat, sync=None):
    """Median seconds per call over `repeat` timings of `calls` back-to-back calls."""
    fn()  # warm up: allocations, connections, first-touch of pages
    samples = []
    for _ in range(repeat):
        if sync:
            sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def inproc(sizes, repeat):
    import numpy as np
    import kiln
    from kiln import nd
    if not hasattr(kiln._C, "allreduce"):
        print("# allreduce: this kiln._C has no in-process allreduce; inproc_cpu2 cases skipped",
              file=sys.stderr, flush=True)
        return
    gpus = kiln.gpus()
    for nbytes in sizes:
        n = nbytes // 4
        a = nd.array(np.ones(n, dtype=np.float32), device=kiln.cpu(0))
        b = nd.array(np.ones(n, dtype=np.float32), device=kiln.cpu(1))

        def step():
            kiln._C.allreduce([[a], [b]], op="sum")
            kiln.waitall()
        t = timed(step, calls_for(nbytes), repeat)
        emit("inproc_cpu2", "GB_per_s", nbytes / t / 1e9, "GB/s", bytes=nbytes)

        def copy():  # the reference: one copy of the buffer on the same machine, same run
            a.copyto(b)
            kiln.waitall()
        t = timed(copy, calls_for(nbytes), repeat)
        emit("copy", "GB_per_s", nbytes / t / 1e9, "GB/s", bytes=nbytes)
        if len(gpus) >= 2:  # NCCL among the GPUs; bus bandwidth as nccl-tests reports it
            xs = [nd.array(np.ones(n, dtype=np.float32), device=g) for g in gpus]

            def gpu_step():
                kiln._C.allreduce([[x] for x in xs], op="sum")
                kiln.waitall()
            t = timed(gpu_step, calls_for(nbytes), repeat)
            k = len(gpus)
            emit(f"inproc_gpu{k}", "GB_per_s", nbytes / t / 1e9, "GB/s", bytes=nbytes,
                 bus_GB_per_s=round(nbytes / t / 1e9 * 2 * (k - 1) / k, 4))


class DirectMPI:
    """MPI_Allreduce on OpenMPI's libmpi through ctypes: the reference kiln is compared with."""

    def __init__(self):
        self.lib = ctypes.CDLL("libmpi.so.40", mode=os.RTLD_GLOBAL)
        handle = lambda name: ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(self.lib, name)))
        self.comm, self.float, self.sum = (handle("ompi_mpi_comm_world"), handle("ompi_mpi_float"),
                                           handle("ompi_mpi_op_sum"))
        self.in_place = ctypes.c_void_p(1)  # OpenMPI's MPI_IN_PLACE
        self.lib.MPI_Allreduce.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] + [ctypes.c_void_p] * 3
        self.lib.MPI_Barrier.argtypes = [ctypes.c_void_p]

    def allreduce(self, ptr, count):
        rc = self.lib.MPI_Allreduce(self.in_place, ptr, count, self.float, self.sum, self.comm)
        assert rc == 0, rc

    def barrier(self):
        self.lib.MPI_Barrier(self.comm)


def worker(sizes, repeat):
    import numpy as np
    import kiln
    import kiln.distributed as dist
    from kiln import nd
    dist.init()
    assert dist.size() == 2, dist.size()
    mpi = DirectMPI()  # MPI calls never overlap kiln's: each timing waits for its own calls
    for nbytes in sizes:
        n = nbytes // 4
        x = nd.array(np.ones(n, dtype=np.float32))
        view = np.from_dlpack(x)  # the NDArray's own memory
        ptr = ctypes.c_void_p(view.ctypes.data)
        calls = calls_for(nbytes)

        def kiln_step():
            dist.allreduce([x])
            x.wait_to_read()

        def mpi_step():
            mpi.allreduce(ptr, n)
        t_kiln, t_mpi = [], []
        for _ in range(2):  # interleaved, so that drift hits both alike
            t_kiln.append(timed(kiln_step, calls, repeat, sync=dist.barrier))
            t_mpi.append(timed(mpi_step, calls, repeat, sync=mpi.barrier))
        if dist.rank() == 0:
            emit("kiln_2proc", "GB_per_s", nbytes / min(t_kiln) / 1e9, "GB/s", bytes=nbytes)
            emit("mpi_2proc", "GB_per_s", nbytes / min(t_mpi) / 1e9, "GB/s", bytes=nbytes)
        del view
    dist.finalize()


def two_processes(sizes, repeat):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("# allreduce: mpirun not found; 2-process cases skipped", file=sys.stderr, flush=True)
        return
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--oversubscribe", "-np", "2", sys.executable, os.path.abspath(__file__), "--worker",
           "--repeat", str(repeat), "--sizes", ",".join(map(str, sizes))]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=1200)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    for l in lines:
        print(json.dumps(l), flush=True)
    if p.returncode != 0:
        print(f"# allreduce: the 2-process run failed (exit {p.returncode})", file=sys.stderr, flush=True)
        return
    largest = max(sizes)
    kiln_bw = next(l["value"] for l in lines if l["case"] == "kiln_2proc" and l["bytes"] == largest)
    mpi_bw = next(l["value"] for l in lines if l["case"] == "mpi_2proc" and l["bytes"] == largest)
    emit("kiln_2proc/mpi_2proc", "speedup", kiln_bw / mpi_bw, "x", bytes=largest)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    if args.worker:
        return worker(sizes, args.repeat)
    inproc(sizes, args.repeat)
    two_processes(sizes, args.repeat)


if __name__ == "__main__":
    main()
