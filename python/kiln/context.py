"""kiln.context: devices in the names of mxnet.context (Context, cpu, gpu, num_gpus,
current_context), for MXNet code that says `mx.context.num_gpus()` or `isinstance(c, mx.Context)`.

A Context is a kiln.Device: `mx.Context('gpu', 1) == mx.gpu(1)`. As in MXNet, `with mx.gpu(1):`
makes gpu(1) the default device of this thread's creation functions (nd.zeros, nd.array of data
from the host, nd.random.*) and of initialize() without ctx; the default is otherwise cpu(0).
"""
import threading

from ._C import ArgumentError, Device, cpu, gpu, num_gpus

__all__ = ["Context", "cpu", "gpu", "num_gpus", "current_context", "cpu_pinned"]


class _ContextType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Device)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, Device)


class Context(metaclass=_ContextType):
    """Context(device_type, device_id=0) as MXNet: returns the kiln.Device (cpu(i) or gpu(i));
    every kiln.Device is an instance of Context."""

    def __new__(cls, device_type, device_id=0):
        if isinstance(device_type, Device):
            return device_type
        kinds = {"cpu": cpu, "gpu": gpu, "cpu_pinned": cpu}
        if device_type not in kinds:
            raise ArgumentError(f"Context: device_type must be 'cpu' or 'gpu', got {device_type!r}")
        return kinds[device_type](int(device_id))


def cpu_pinned(device_id=0):
    """MXNet's page-locked host context; kiln pins host memory for copies by itself, so this is cpu."""
    return cpu(device_id)


_local = threading.local()  # .stack: the devices of the enclosing `with device:` blocks


def current_context():
    """The default device of creation functions: the innermost `with device:` of this thread,
    else cpu(0)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else cpu(0)


def _enter(device):
    if not hasattr(_local, "stack"):
        _local.stack = []
    _local.stack.append(device)
    return device


def _exit(device, *exc_info):
    _local.stack.pop()


Device.__enter__ = _enter
Device.__exit__ = _exit
