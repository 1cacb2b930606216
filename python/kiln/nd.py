"""kiln.nd: creating arrays and every eager op, as mxnet.nd / mxnet.np.

Every function queues its work on the engine and returns at once; asnumpy(), item(),
wait_to_read() and kiln.waitall() wait. Creation functions take MXNet's signatures
(zeros(shape, ctx, dtype), arange(start, stop, step, repeat, ctx=, dtype=), random.uniform(low,
high, shape, dtype, ctx)) and kiln's device= as well.
"""
import os as _os
import types as _types

import numpy as _np

from . import _C
from ._C import (ArgumentError, NDArray, Device, invoke, waitall, stop_gradient, sigmoid, gelu, flatten,
                 where, cast, clip, broadcast_to, expand_dims,
                 squeeze, slice, concat, stack, split, take, one_hot, matmul, linear, conv2d, max_pool2d,
                 avg_pool2d, global_avg_pool2d, softmax, log_softmax, softmax_cross_entropy, dropout,
                 batch_norm)
# The elementwise ops of the op list (kiln/runtime/op_list.h): negative, exp, relu, add, maximum, ...
globals().update({_n: getattr(_C, _n) for _n in _C.elementwise_op_names()})
from . import ndarray as _ndarray  # noqa: F401  (methods on NDArray)
from .context import current_context

dot = matmul
# a // b and a % b with NumPy's semantics (the remainder takes the divisor's sign); MXNet's names too.
floor_divide, mod = _C.floor_divide, _C.mod
remainder = modulo = mod


def _placement(fn, args, dtype=None, device=None, ctx=None):
    """(dtype, device) from MXNet's positional order (ctx, dtype) or kiln's (dtype, device): a
    positional Device is the device and anything else the dtype, so both orders work."""
    if len(args) > 2:
        raise TypeError(f"nd.{fn}: at most two positional arguments after the shape/value "
                        f"(ctx and dtype), got {len(args)}")
    for a in args:
        if isinstance(a, Device):
            device = _one(fn, "device", device, a)
        elif a is not None:
            dtype = _one(fn, "dtype", dtype, a)
    if device is not None and ctx is not None and device != ctx:
        raise ArgumentError(f"nd.{fn}: device={device} and ctx={ctx} disagree; pass one of them")
    device = device if device is not None else ctx
    if device is not None and not isinstance(device, Device):
        raise ArgumentError(f"nd.{fn}: ctx/device must be a kiln.Device such as kiln.gpu(0), "
                            f"got {type(device).__name__} {device!r}")
    return dtype, device if device is not None else current_context()


def _one(fn, what, given, positional):
    if given is not None:
        raise TypeError(f"nd.{fn}: {what} given both by position and by keyword")
    return positional


def zeros(shape, *args, dtype=None, device=None, ctx=None, **kwargs):
    """An array of zeros: zeros(shape, ctx=None, dtype=None) as MXNet (float32 by default)."""
    _no_stype("zeros", kwargs)
    dtype, device = _placement("zeros", args, dtype, device, ctx)
    return _C.zeros(shape, dtype, device)


def ones(shape, *args, dtype=None, device=None, ctx=None, **kwargs):
    """An array of ones: ones(shape, ctx=None, dtype=None) as MXNet (float32 by default)."""
    _no_stype("ones", kwargs)
    dtype, device = _placement("ones", args, dtype, device, ctx)
    return _C.ones(shape, dtype, device)


def full(shape, val, *args, dtype=None, device=None, ctx=None, **kwargs):
    """An array filled with `val`: full(shape, val, ctx=None, dtype=float32) as MXNet."""
    _no_stype("full", kwargs)
    dtype, device = _placement("full", args, dtype, device, ctx)
    return _C.full(shape, val, dtype, device)


def empty(shape, *args, dtype=None, device=None, ctx=None, **kwargs):
    """An array whose contents are not needed (kiln fills it with zeros)."""
    _no_stype("empty", kwargs)
    dtype, device = _placement("empty", args, dtype, device, ctx)
    return _C.zeros(shape, dtype, device)


def _no_stype(fn, kwargs):
    stype = kwargs.pop("stype", None)
    if stype not in (None, "default"):
        raise ArgumentError(f"nd.{fn}: only dense arrays (stype='default') exist in kiln, got stype={stype!r}")
    if kwargs:
        raise TypeError(f"nd.{fn}: unexpected arguments {sorted(kwargs)}")


def arange(start, stop=None, step=1.0, repeat=1, infer_range=None, ctx=None, dtype=None, device=None):
    """Evenly spaced values in [start, stop), as MXNet's nd.arange: arange(3) is [0, 1, 2];
    `repeat` repeats each value (arange(2, repeat=2) is [0, 0, 1, 1]); float32 unless `dtype`."""
    if infer_range:
        raise ArgumentError("nd.arange: infer_range (deprecated in MXNet) is not supported; give stop")
    dtype, device = _placement("arange", (), dtype, device, ctx)
    x = _C.arange(start, stop, step, dtype, device)
    repeat = int(repeat)
    if repeat < 1:
        raise ArgumentError(f"nd.arange: repeat must be >= 1, got {repeat}")
    if repeat > 1:
        n = x.shape[0]
        x = _C.broadcast_to(x._reshape((n, 1)), (n, repeat))._reshape((n * repeat,))
    return x


def array(obj, *args, dtype=None, device=None, ctx=None):
    """A new array holding a copy of `obj` (an NDArray, a NumPy array, a list or a number):
    array(source, ctx=None, dtype=None) as MXNet; kiln's array(obj, dtype, device) also works.

    NumPy arrays keep their dtype (float64 stays float64); Python numbers and lists become float32
    (bool stays bool) as in MXNet. A 0-d NumPy array or NumPy scalar gives a 0-d array; a Python
    number gives shape (1,), as MXNet's nd.array."""
    given = device is not None or ctx is not None or any(isinstance(a, Device) for a in args)
    dtype, device = _placement("array", args, dtype, device, ctx)
    # an NDArray stays on its device unless told otherwise; host data goes to the default device
    x = _C.array(obj, dtype, device if given or not isinstance(obj, NDArray) else None)
    if isinstance(obj, NDArray) and x._shares_storage(obj):
        x = x.copy()
    elif isinstance(obj, (_np.ndarray, _np.generic)) and obj.ndim == 0 and x.ndim != 0:
        x = x._reshape(())
    return x


def zeros_like(x, dtype=None, ctx=None, device=None):
    """Zeros of x's shape, on x's device and of its dtype unless told otherwise."""
    return _C.zeros(x.shape, dtype or x._dtype_name, device or ctx or x.device)


def ones_like(x, dtype=None, ctx=None, device=None):
    """Ones of x's shape, on x's device and of its dtype unless told otherwise."""
    return _C.ones(x.shape, dtype or x._dtype_name, device or ctx or x.device)


def full_like(x, val, dtype=None, ctx=None, device=None):
    """`val` in x's shape, on x's device and of its dtype unless told otherwise."""
    return _C.full(x.shape, val, dtype or x._dtype_name, device or ctx or x.device)


def _reduce(name):
    def f(x, axis=None, keepdims=False):
        return getattr(x, name)(axis=axis, keepdims=keepdims)
    f.__name__ = name
    return f


sum = _reduce("sum")
mean = _reduce("mean")
max = _reduce("max")
min = _reduce("min")
argmax = _reduce("argmax")
argmin = _reduce("argmin")


def reshape(x, shape, reverse=False):
    """x with a new shape; MXNet's special values 0, -1, -2, -3, -4 work as in NDArray.reshape."""
    return x.reshape(shape, reverse=reverse)


def norm(x, ord=2, axis=None, keepdims=False):
    return x.norm(ord=ord, axis=axis, keepdims=keepdims)


def transpose(x, axes=None):
    return x._transpose(axes)


def _seed(seed_state, ctx="all"):
    """Seeds the random draws (MXNet's mx.random.seed; one generator for all devices, so ctx is moot).

    Called from the main thread it seeds the process-wide generator, which every thread draws from
    unless it seeded its own; called from another thread it gives that thread a generator of its
    own: a thread that seeds, initializes and trains gets the numbers a single-threaded run with
    the same seed gets, whatever other threads draw meanwhile."""
    import threading
    _C.seed(int(seed_state), threading.current_thread() is not threading.main_thread())


def _random_shape(shape):
    return (1,) if shape is None else shape


def _uniform(low=0.0, high=1.0, shape=(1,), dtype=None, ctx=None, out=None, device=None):
    """Draws from U(low, high): uniform(low, high, shape, dtype, ctx) as MXNet."""
    dtype, device = _placement("random.uniform", (), dtype, device, ctx)
    return _out(_C.random_uniform(low, high, _random_shape(shape), dtype, device), out)


def _normal(loc=0.0, scale=1.0, shape=(1,), dtype=None, ctx=None, out=None, device=None):
    """Draws from N(loc, scale^2): normal(loc, scale, shape, dtype, ctx) as MXNet."""
    dtype, device = _placement("random.normal", (), dtype, device, ctx)
    return _out(_C.random_normal(loc, scale, _random_shape(shape), dtype, device), out)


def _bernoulli(p=0.5, shape=(1,), dtype=None, ctx=None, out=None, device=None):
    """1 with probability p, else 0."""
    dtype, device = _placement("random.bernoulli", (), dtype, device, ctx)
    return _out(_C.random_bernoulli(p, _random_shape(shape), dtype, device), out)


def _randint(low, high, shape=(1,), dtype="int32", ctx=None, out=None, device=None):
    """Integers drawn uniformly from [low, high), as MXNet's random.randint (int32 by default)."""
    if int(high) <= int(low):
        raise ArgumentError(f"nd.random.randint: high ({high}) must be greater than low ({low})")
    _, device = _placement("random.randint", (), None, device, ctx)
    u = _C.random_uniform(float(low), float(high), _random_shape(shape), "float64", device)
    x = _C.floor(u)
    # float64 rounding could reach `high` itself; clamp into [low, high - 1]
    return _out(_C.clip(x, float(low), float(high) - 1).astype(dtype or "int32"), out)


def _out(x, out):
    if out is None:
        return x
    x.copyto(out)
    return out


random = _types.SimpleNamespace(uniform=_uniform, normal=_normal, bernoulli=_bernoulli, randint=_randint,
                                seed=_seed)


_SAVED_AS = "kiln.nd.save"  # metadata key: 'list' or 'dict', what nd.load gives back


def save(fname, data):
    """Writes an NDArray, a list of them or a dict str -> NDArray to `fname`, as MXNet's nd.save
    (in kiln's params format, safetensors' layout; nd.load reads it back)."""
    if isinstance(data, NDArray):
        data = [data]
    if isinstance(data, dict):
        kind, named = "dict", [(str(k), v) for k, v in data.items()]
    elif isinstance(data, (list, tuple)):
        kind, named = "list", [(str(i), v) for i, v in enumerate(data)]
    else:
        raise TypeError(f"nd.save: data must be an NDArray, a list of them or a dict str -> NDArray, "
                        f"got {type(data).__name__}")
    for name, v in named:
        if not isinstance(v, NDArray):
            raise TypeError(f"nd.save: entry '{name}' is a {type(v).__name__}, not an NDArray")
    _C.save_params(_os.fspath(fname), [(n, _C.HostTensor(v)) for n, v in named], {_SAVED_AS: kind})


def load(fname, ctx=None, device=None):
    """What nd.save wrote: a list of NDArrays, or a dict when a dict was saved (a params file
    written by save_parameters or export reads as a dict)."""
    _, device = _placement("load", (), None, device, ctx)
    arrays, metadata = _C.load_params(_os.fspath(fname), device)
    arrays = dict(arrays)
    if dict(metadata).get(_SAVED_AS) == "list":
        return [arrays[str(i)] for i in range(len(arrays))]
    return arrays


def from_dlpack(obj):
    """An NDArray sharing the memory of `obj` (a NumPy array, a torch tensor, anything with
    __dlpack__, or a DLPack capsule). Nothing is copied: a strided source (a transposed or sliced
    view, negative strides included) becomes a strided kiln view of the same memory, and the
    producer's memory stays alive until the kiln array (and every view of it) is gone."""
    return _C.from_dlpack(obj)


def to_dlpack(x):
    """The DLPack capsule of `x` (as x.__dlpack__()); it shares x's memory."""
    return _C.to_dlpack(x)


from .mxnet_ops import *  # noqa: E402,F401,F403  (the MXNet 1.x operator API: Convolution, Pooling, ...)
