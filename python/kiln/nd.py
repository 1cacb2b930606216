"""kiln.nd: creating arrays and every eager op, as mxnet.nd / mxnet.np.

Every function queues its work on the engine and returns at once; asnumpy(), item(),
wait_to_read() and kiln.waitall() wait.
"""
import types as _types

import numpy as _np

from . import _C
from ._C import (NDArray, zeros, ones, full, arange, invoke, waitall, stop_gradient, sigmoid, gelu, flatten,
                 where, cast, clip, broadcast_to, expand_dims,
                 squeeze, slice, concat, stack, split, take, one_hot, matmul, linear, conv2d, max_pool2d,
                 avg_pool2d, global_avg_pool2d, softmax, log_softmax, softmax_cross_entropy, dropout,
                 batch_norm)
# The elementwise ops of the op list (kiln/runtime/op_list.h): negative, exp, relu, add, maximum, ...
globals().update({_n: getattr(_C, _n) for _n in _C.elementwise_op_names()})
from . import ndarray as _ndarray  # noqa: F401  (methods on NDArray)

dot = matmul


def array(obj, dtype=None, device=None, ctx=None):
    """A new array holding a copy of `obj` (an NDArray, a NumPy array, a list or a number).

    NumPy arrays keep their dtype (float64 stays float64); Python numbers and lists become float32
    (bool stays bool) as in MXNet. A 0-d NumPy array or NumPy scalar gives a 0-d array; a Python
    number gives shape (1,), as MXNet's nd.array."""
    x = _C.array(obj, dtype, device or ctx)
    if isinstance(obj, NDArray) and x._shares_storage(obj):
        x = x.copy()
    elif isinstance(obj, (_np.ndarray, _np.generic)) and obj.ndim == 0 and x.ndim != 0:
        x = x._reshape(())
    return x


def zeros_like(x):
    return zeros(x.shape, x._dtype_name, x.device)


def ones_like(x):
    return ones(x.shape, x._dtype_name, x.device)


def empty(shape, dtype=None, device=None, ctx=None):
    """An array whose contents are not needed (kiln fills it with zeros)."""
    return zeros(shape, dtype, device or ctx or _C.cpu())


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


def reshape(x, shape):
    return x._reshape(tuple(shape))


def transpose(x, axes=None):
    return x._transpose(axes)


def _device(device, ctx):
    return device or ctx or _C.cpu()


def _seed(s):
    _C.seed(int(s))


random = _types.SimpleNamespace(
    uniform=lambda low=0.0, high=1.0, shape=(1,), dtype=None, device=None, ctx=None:
        _C.random_uniform(low, high, shape, dtype, _device(device, ctx)),
    normal=lambda loc=0.0, scale=1.0, shape=(1,), dtype=None, device=None, ctx=None:
        _C.random_normal(loc, scale, shape, dtype, _device(device, ctx)),
    bernoulli=lambda p=0.5, shape=(1,), dtype=None, device=None, ctx=None:
        _C.random_bernoulli(p, shape, dtype, _device(device, ctx)),
    seed=_seed,
)


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
