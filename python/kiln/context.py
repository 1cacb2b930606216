"""kiln.context: devices in the names of mxnet.context (Context, cpu, gpu, num_gpus,
current_context), for MXNet code that says `mx.context.num_gpus()` or `isinstance(c, mx.Context)`.

A Context is a kiln.Device: `mx.Context('gpu', 1) == mx.gpu(1)`. Not here: `with ctx:` scopes
that change the default device; kiln's default is always cpu(0).
"""
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


def current_context():
    """The default device of creation functions: cpu(0)."""
    return cpu(0)
