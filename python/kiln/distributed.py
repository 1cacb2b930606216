"""Data-parallel training across processes, launched by ``mpirun`` (DESIGN.md section 10).

    # mpirun -np 2 python train.py
    import kiln.distributed as dist
    dist.init()                          # a 1-process world without mpirun
    grads = [p.grad() for p in params]
    dist.check_schedule([(n, g.shape, g.dtype) for n, g in zip(names, grads)])  # once
    dist.allreduce(grads, op="mean")     # queued: runs when backward has written the grads

``allreduce`` and ``broadcast`` return at once: they are engine tasks ordered after the writers of
the arrays, and the arrays' next read waits for them. CPU arrays travel over MPI, GPU arrays over
NCCL (one GPU per process: ``kiln.gpu(local_rank())``).

A rank that dies or stalls makes the others fail after ``timeout`` seconds (``init(timeout=...)``,
else ``KILN_DIST_TIMEOUT``, else 60) instead of hanging: ``barrier`` and ``check_schedule`` raise
``DistributedError`` (a ``kiln.StateError``); a queued ``allreduce`` stores the error on its arrays
and their next read raises it as a ``kiln.StateError``. Under ``mpirun`` (OpenMPI 4.1, default
settings) the launcher usually ends the job first: a rank that exits with an error, is killed, or
raises an uncaught exception (kiln then calls MPI_Abort) makes mpirun send SIGTERM to the others
within about a second, and each prints "kiln.distributed: rank R was terminated by the launcher
(SIGTERM) while waiting in allreduce ...". A rank that hangs alive is caught by the timeout.
"""
import atexit as _atexit
import ctypes as _ctypes
import os as _os
import sys as _sys


def _preload_mpi():
    # OpenMPI loads its components (mca_*.so) with dlopen, and some builds expect libmpi's symbols
    # in the global namespace, while Python imports extensions with RTLD_LOCAL: promote libmpi, as
    # mpi4py does. (Debian's OpenMPI 4.1 components link libmpi themselves and load either way.)
    for name in ("libmpi.so.40", "libmpi.so"):
        try:
            _ctypes.CDLL(name, mode=_os.RTLD_GLOBAL | getattr(_os, "RTLD_NOLOAD", 0))
            return
        except OSError:
            pass
    for name in ("libmpi.so.40", "libmpi.so"):
        try:
            _ctypes.CDLL(name, mode=_os.RTLD_GLOBAL)
            return
        except OSError:
            pass


_preload_mpi()

from . import _C  # noqa: E402
from ._C import DistributedError  # noqa: E402

_d = _C.distributed

__all__ = ["init", "is_initialized", "rank", "size", "local_rank", "barrier", "allreduce",
           "broadcast", "check_schedule", "finalize", "DistributedError"]


def init(timeout=None):
    """Joins the world of processes started by mpirun (idempotent). Without mpirun, the world is
    this process alone. ``timeout``: seconds any collective may wait for the other ranks."""
    _d.init(timeout)
    global _prev_excepthook
    if _prev_excepthook is None and not _d.is_local_world():
        _prev_excepthook = _sys.excepthook
        _sys.excepthook = _abort_on_uncaught


_prev_excepthook = None


def _abort_on_uncaught(etype, value, tb):
    # A rank that dies of an exception would leave the others waiting in their next collective
    # until the timeout: print the traceback, then end the job at once.
    _prev_excepthook(etype, value, tb)
    try:
        if _d.is_initialized() and _d.size() > 1:
            _sys.stderr.flush()
            _d.abort(1, f"stopped on an uncaught {etype.__name__}; ending the job so that the other "
                        "ranks do not wait for it (see the traceback above)")
    except Exception:
        pass


def is_initialized():
    return _d.is_initialized()


def rank():
    """This process's rank, 0 <= rank() < size()."""
    return _d.rank()


def size():
    """The number of processes."""
    return _d.size()


def local_rank():
    """The rank among the processes on this machine (use gpu(local_rank()))."""
    return _d.local_rank()


def barrier():
    """Waits until every rank reaches the barrier (after the collectives queued before it)."""
    _d.barrier()


def allreduce(arrays, op="sum"):
    """Reduces NDArrays in place across processes: op is "sum", "mean", "max" or "min".
    One engine task for the whole list; returns at once."""
    _d.allreduce(arrays, op)


def broadcast(arrays, root=0):
    """Overwrites the NDArrays of every rank with root's, in place; returns at once."""
    _d.broadcast(arrays, root)


def _dtype_name(dtype):
    if isinstance(dtype, str):
        return dtype
    import numpy as np
    return np.dtype(dtype).name


def check_schedule(entries):
    """Checks that every rank will reduce the same arrays in the same order.

    entries: (name, shape, dtype) in this rank's reduction order. Raises DistributedError on every
    rank, naming each rank's entry where the lists first differ, instead of hanging later."""
    _d.check_schedule([(str(n), tuple(s), _dtype_name(t)) for n, s, t in entries])


def finalize():
    """Waits for queued work and leaves the world (idempotent; also run at exit)."""
    _d.finalize()


def _finalize_at_exit():
    try:
        _d.finalize()
    except Exception:
        pass


_atexit.register(_finalize_at_exit)
