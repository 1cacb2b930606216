"""The Python side of NDArray: NumPy-style indexing, dtype objects and convenience methods.

The class itself is kiln._C.NDArray (the C++ Tensor); the methods here are attached to it, so an
NDArray made anywhere has them.
"""
import numpy as _np

from . import _C
from ._C import NDArray

_BF16 = "bfloat16"


def _dtype(self):
    """The element type as a NumPy dtype (the string 'bfloat16' for bfloat16)."""
    name = self._dtype_name
    return _BF16 if name == _BF16 else _np.dtype(name)


def _shape_arg(args):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _reshape(self, *shape, **kwargs):
    shape = _shape_arg(shape) if shape else tuple(kwargs.pop("shape"))
    if kwargs:
        raise TypeError(f"reshape: unexpected arguments {sorted(kwargs)}")
    return self._reshape(shape)


def _transpose(self, *axes):
    axes = _shape_arg(axes) if axes else None
    return self._transpose(axes)


def _normalize_key(self, key):
    """Splits a basic index into per-axis (begin, end, step, keep) and the shape after it."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_real > self.ndim:
        raise IndexError(f"too many indices for an array of {self.ndim} dimensions: {n_real} given")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (self.ndim - n_real))
        else:
            expanded.append(k)
    if Ellipsis not in key:
        expanded.extend([slice(None)] * (self.ndim - n_real))
    begins, ends, steps, out_shape = [], [], [], []
    axis = 0
    for k in expanded:
        if k is None:
            out_shape.append(1)
            continue
        n = self.shape[axis]
        if isinstance(k, slice):
            b, e, s = k.indices(n)
            out_shape.append(len(range(b, e, s)))
            if e < 0:  # a negative step running past the first element: -1 would mean "the last"
                e = -n - 1
            begins.append(b), ends.append(e), steps.append(s)
        else:
            try:
                i = int(k)
            except TypeError:
                raise IndexError(f"only integers, slices, None, '...' and integer arrays are valid indices, "
                                 f"got {type(k).__name__}") from None
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            i %= n
            begins.append(i), ends.append(i + 1), steps.append(1)
        axis += 1
    return begins, ends, steps, tuple(out_shape)


def _is_advanced(key):
    return isinstance(key, (NDArray, list, _np.ndarray))


def _getitem(self, key):
    if _is_advanced(key):
        idx = key if isinstance(key, NDArray) else _C.array(_np.asarray(key))
        if idx._dtype_name == "bool":
            raise IndexError("boolean-mask indexing is not supported; use nd.where or index with "
                             "integer positions (np.nonzero(mask))")
        return _C.take(self, idx, 0)
    if self.ndim == 0 and key == ():
        return self
    begins, ends, steps, shape = _normalize_key(self, key)
    view = _C.slice(self, begins, ends, steps) if begins else self
    return view._reshape(shape) if view.shape != shape else view


def _setitem(self, key, value):
    if _is_advanced(key):
        raise IndexError("assignment through an integer-array index is not supported; "
                         "assign through slices, or build the array with nd.where")
    begins, ends, steps, shape = _normalize_key(self, key) if key != () else ([], [], [], self.shape)
    view = _C.slice(self, begins, ends, steps) if begins else self
    if begins and not view._shares_storage(self):
        raise RuntimeError("internal: the indexed region is not a view of the array")
    if isinstance(value, NDArray):
        src = value
    elif isinstance(value, (int, float, bool, _np.generic)) or (isinstance(value, _np.ndarray) and value.ndim == 0):
        _C.full(view.shape, value, self._dtype_name, self.device).copyto(view)
        return
    else:
        src = _C.array(_np.asarray(value, dtype=_np.float64 if self._dtype_name == _BF16 else self.dtype),
                       device=self.device)
    if src.shape != shape:
        src = _C.broadcast_to(src, shape)
    if src.shape != view.shape:
        src = src._reshape(view.shape)
    if src._dtype_name != self._dtype_name:
        src = src.astype(self._dtype_name)
    src.copyto(view)


def _T(self):
    return self._transpose(None)


def _tolist(self):
    return self.asnumpy().tolist()


def _array(self, dtype=None, copy=None):
    a = self.asnumpy()
    return a.astype(dtype) if dtype is not None else a


def _flatten(self):
    return _C.flatten(self)


def _squeeze(self, axis=None):
    return _C.squeeze(self, axis)


def _expand_dims(self, axis):
    return _C.expand_dims(self, axis)


def _clip(self, a_min, a_max):
    return _C.clip(self, a_min, a_max)


def _softmax(self, axis=-1):
    return _C.softmax(self, axis)


def _relu(self):
    return _C.relu(self)


def _zeros_like(self):
    return _C.zeros(self.shape, self._dtype_name, self.device)


def _broadcast_to(self, shape):
    return _C.broadcast_to(self, tuple(shape))


def _abs(self):
    return _C.abs(self)


def _exp(self):
    return _C.exp(self)


def _log(self):
    return _C.log(self)


def _sqrt(self):
    return _C.sqrt(self)


def _square(self):
    return _C.square(self)


def _rmatmul(self, other):
    return _C.matmul(_C.array(other) if not isinstance(other, NDArray) else other, self)


for _name, _fn in {
    "dtype": property(_dtype), "T": property(_T), "reshape": _reshape, "transpose": _transpose,
    "__getitem__": _getitem, "__setitem__": _setitem, "tolist": _tolist, "__array__": _array,
    "flatten": _flatten, "squeeze": _squeeze, "expand_dims": _expand_dims, "clip": _clip,
    "softmax": _softmax, "relu": _relu, "zeros_like": _zeros_like, "broadcast_to": _broadcast_to,
    "abs": _abs, "exp": _exp, "log": _log, "sqrt": _sqrt, "square": _square, "__rmatmul__": _rmatmul,
}.items():
    setattr(NDArray, _name, _fn)
