"""kiln: eager convenience with compiled speed, in the names of MXNet Gluon and d2l.ai.

    import kiln
    from kiln import nd, autograd
    x = nd.ones((2, 3))
    print((x + 1).asnumpy())

MXNet 1.x code runs with its imports changed (`import kiln as mx`, `from kiln.gluon import nn`):
mx.nd, mx.sym/mx.symbol, mx.autograd, mx.init/mx.initializer, mx.gluon, mx.context, mx.Context,
mx.random, mx.kv/mx.kvstore, mx.base.MXNetError, mx.cpu(), mx.gpu(i) are the same objects as
kiln's own names.
"""
from . import _C
from ._C import (Device, KilnError, ShapeError, DTypeError, DeviceError, FormatError, ArgumentError,
                 StateError, OutOfMemoryError, InternalError, IntegerOverflowError, FileError, NDArray, cpu, gpu, num_gpus, waitall,
                 codegen_stats, gpu_memory_stats, empty_cache, cuda_graph_stats, dnn_algo_stats,
                 set_math_mode, math_mode)
from . import ndarray as _ndarray  # adds indexing and the Python-side methods to NDArray
from . import nd, autograd
from .context import Context  # mx.Context: every kiln.Device is one

__all__ = ["nd", "autograd", "NDArray", "Device", "Context", "random", "MXNetError", "cpu", "gpu",
           "num_gpus", "gpus", "waitall", "gpu_memory_stats", "empty_cache", "cuda_graph_stats", "dnn_algo_stats",
           "set_math_mode", "math_mode",
           "KilnError", "ShapeError", "DTypeError", "DeviceError", "FormatError", "ArgumentError",
           "StateError", "OutOfMemoryError", "InternalError", "IntegerOverflowError", "codegen_stats",
           "FileError"]


def _drain_at_exit():
    # Queued work finishes while the interpreter and every library kiln uses are still whole;
    # errors nobody waited for are dropped, as in C++ (see the README).
    try:
        waitall()
    except Exception:
        # Calls held back to be joined that could not run (out of memory) are held again; they
        # are dropped here, or a tensor freed while the interpreter ends would run them then.
        _C._drop_held_calls()
        try:
            waitall()
        except Exception:
            pass


import atexit as _atexit
_atexit.register(_drain_at_exit)

# Ctrl-C ends the engine's waits (KeyboardInterrupt); engine errors name the user's file:line.
# Removed at exit, before the drain above runs (atexit runs in reverse order).
import os as _os, threading as _threading
_C._install_hooks(_os.path.dirname(_os.path.abspath(__file__)) + _os.sep, _threading.main_thread().ident)
_atexit.register(_C._remove_hooks)


def gpus():
    """Every GPU of this machine, as devices ([] when there is none)."""
    return [gpu(i) for i in range(num_gpus())]


def _lazy(name):
    import importlib
    return importlib.import_module("." + name, __name__)


# Submodules that pull in more (nn, data, utils...) load on first use; each one exists
# (tests/python/test_utils.py imports every name).
_LAZY_MODULES = ("nn", "init", "loss", "optim", "data", "utils", "sym", "kvstore", "distributed", "trainer",
                 "profiler")
# MXNet's module names: mx.gluon, mx.context and mx.base are modules of their own, the others
# kiln's under MXNet's name (mx.symbol is kiln.sym).
_MXNET_MODULES = ("gluon", "context", "base")
_MXNET_ALIASES = {"symbol": "sym", "initializer": "init", "kv": "kvstore"}

random = nd.random  # mx.random.seed / uniform / normal, as mx.nd.random
MXNetError = KilnError  # mx.MXNetError and mx.base.MXNetError

from ._C import cpu_memory_stats  # the CPU pool's statistics, named as gpu_memory_stats's
__all__ += ["cpu_memory_stats", "gpu_step_stats"]

_step_counters_then = None


def gpu_step_stats():
    """What ran since the previous call (the first call: since the process started), after
    waiting for the queued work: a dict of

    - kernel_launches: kiln's GPU kernels launched one by one (a graph's replay launches none);
    - library_calls: cuBLASLt and cuDNN calls issued from the host (none in a replay);
    - graph_replays, graph_captures: CUDA graphs launched and captured;
    - host_syncs: times kiln's work waited for a GPU (a kernel reading a value back, a copy into
      host memory); the program's own waits (asnumpy, waitall) are where a step ends, not counted;
    - allocations: blocks asked of the GPUs' caching allocators; device_mallocs: cudaMalloc calls;
    - h2d_bytes, d2h_bytes, d2d_bytes, copies, memsets: transfers;
    - tasks: the engine's tasks on any device; plan_calls: calls of compiled plans that no other
      plan made; tasks_outside_plans: tasks - plan_calls, the per-op work around the plans;
    - plain_plan_runs: GPU plan calls that launched kernel by kernel instead of replaying.

    The counters are the same on simulated GPUs (KILN_GPU_SIM=N) as on real ones, so a test can
    assert a training step's structure without a GPU:

        kiln.gpu_step_stats()             # the start of the step
        step(X, y)
        s = kiln.gpu_step_stats()
        assert s["graph_replays"] == 1 and s["allocations"] == 0
    """
    global _step_counters_then
    now = _C.step_counters()
    then = _step_counters_then or {k: 0 for k in now}
    _step_counters_then = now
    return {k: now[k] - then[k] for k in now}


def __getattr__(name):
    if name in _LAZY_MODULES or name in _MXNET_MODULES:
        return _lazy(name)
    if name in _MXNET_ALIASES:
        return _lazy(_MXNET_ALIASES[name])
    if name == "Trainer":
        return _lazy("trainer").Trainer
    if name == "DistributedError":
        return _lazy("distributed").DistributedError
    if name == "split_and_load":
        return _lazy("utils").split_and_load
    raise AttributeError(f"module 'kiln' has no attribute '{name}'")
