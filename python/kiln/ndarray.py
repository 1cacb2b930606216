"""The Python side of NDArray: NumPy-style indexing, dtype objects and convenience methods,
MXNet's among them (reshape's special values 0/-1/-2/-3/-4, asscalar, norm, as_in_context).

The class itself is kiln._C.NDArray (the C++ Tensor); the methods here are attached to it, so an
NDArray made anywhere has them.
"""
import operator as _operator

import numpy as _np

from . import _C
from ._C import ArgumentError, NDArray, ShapeError

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
    """A view with a new shape. As MXNet's NDArray.reshape, besides sizes the shape may hold
    0 (copy this input dimension), -1 (infer it from the others), -2 (copy every remaining input
    dimension), -3 (merge the next two input dimensions) and -4 (split the input dimension into the
    next two values, one of which may be -1); reverse=True matches them from the right."""
    reverse = bool(kwargs.pop("reverse", False))
    shape = _shape_arg(shape) if shape else _shape_arg((kwargs.pop("shape"),))
    if kwargs:
        raise TypeError(f"reshape: unexpected arguments {sorted(kwargs)}")
    return self._reshape(infer_reshape(self.shape, shape, reverse))


def infer_reshape(src, shape, reverse=False):
    """The output shape of reshaping `src` to `shape` under MXNet's special values."""
    src, shape = tuple(int(d) for d in src), tuple(int(d) for d in shape)
    if reverse:
        if -4 in shape:
            raise ArgumentError(f"reshape: -4 cannot be used with reverse=True (shape {shape})")
        return tuple(reversed(infer_reshape(src[::-1], shape[::-1])))
    out, infer_at, i, j = [], None, 0, 0  # i walks `shape`, j walks `src`

    def need(k, code):
        if j + k > len(src):
            raise ShapeError(f"reshape: {code} at position {i} of {shape} needs input dimension {j + k - 1}, "
                             f"but the input has shape {src}")
    while i < len(shape):
        v = shape[i]
        if v > 0:
            out.append(v)
            j += 1
        elif v == 0:
            need(1, "0")
            out.append(src[j])
            j += 1
        elif v == -1:
            if infer_at is not None:
                raise ShapeError(f"reshape: only one dimension can be inferred (-1), got {shape}")
            infer_at = len(out)
            out.append(1)
            j += 1
        elif v == -2:
            out.extend(src[j:])
            j = len(src)
        elif v == -3:
            need(2, "-3")
            out.append(src[j] * src[j + 1])
            j += 2
        elif v == -4:
            need(1, "-4")
            if i + 2 >= len(shape):
                raise ShapeError(f"reshape: -4 must be followed by two sizes, got {shape}")
            d0, d1, d2 = src[j], shape[i + 1], shape[i + 2]
            if d1 == -1 and d2 > 0 and d0 % d2 == 0:
                d1 = d0 // d2
            elif d2 == -1 and d1 > 0 and d0 % d1 == 0:
                d2 = d0 // d1
            if d1 <= 0 or d2 <= 0 or d1 * d2 != d0:
                raise ShapeError(f"reshape: -4 splits input dimension {j} of size {d0} into "
                                 f"({shape[i + 1]}, {shape[i + 2]}), which does not divide it")
            out.extend((d1, d2))
            i += 2
            j += 1
        else:
            raise ShapeError(f"reshape: {v} is not a size nor one of the special values 0, -1, -2, -3, -4 "
                             f"(shape {shape})")
        i += 1
    total = 1
    for d in src:
        total *= d
    if infer_at is not None:
        known = 1
        for k, d in enumerate(out):
            known *= d if k != infer_at else 1
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape an array of shape {src} ({total} elements) to {shape}: "
                             f"the -1 cannot be inferred")
        out[infer_at] = total // known
    n = 1
    for d in out:
        n *= d
    if n != total:
        raise ShapeError(f"cannot reshape an array of shape {src} ({total} elements) to {shape} "
                         f"(resolved as {tuple(out)}, {n} elements)")
    return tuple(out)


def _asscalar(self):
    """The value of a one-element array as a NumPy scalar (waits for it), as MXNet's asscalar()."""
    if self.size != 1:
        raise ShapeError(f"asscalar: the array has shape {self.shape} ({self.size} elements); it needs "
                         f"exactly one. Reduce it first (e.g. x.sum().asscalar()) or use asnumpy()")
    return self.asnumpy().reshape(-1)[0]


def _norm(self, ord=2, axis=None, keepdims=False):
    """The L2 (or, with ord=1, L1) norm over `axis` (every element when None), as MXNet's norm:
    over every element it is a one-element array of shape (1,). Differentiable."""
    if ord not in (1, 2):
        raise ArgumentError(f"norm: ord must be 1 or 2, got {ord!r}")
    if ord == 1:
        out = _C.abs(self).sum(axis=axis, keepdims=keepdims)
    else:
        out = _C.sqrt(_C.square(self).sum(axis=axis, keepdims=keepdims))
    if axis is None and not keepdims:
        out = out._reshape((1,))
    return out


def _as_in_context(self, ctx):
    """This array on `ctx`: itself when it is there already, else a copy (as MXNet)."""
    return self if self.device == ctx else self.to_device(ctx)


def _transpose(self, *axes):
    axes = _shape_arg(axes) if axes else None
    return self._transpose(axes)


def _is_bool_scalar(k):
    """True, False, numpy.bool_ or a 0-d boolean NumPy array: NumPy reads each as a new axis of
    length 1 (True) or 0 (False) that consumes no axis of the array."""
    return (isinstance(k, (bool, _np.bool_))
            or (isinstance(k, _np.ndarray) and k.ndim == 0 and k.dtype == _np.bool_))


def _normalize_key(self, key):
    """Splits a basic index into per-axis (begin, end, step) and the shape after it.

    Scalar booleans follow NumPy: together they add one axis, of length 0 if any is False, else
    1. Like every NumPy advanced index they also make the integers advanced, so the new axis sits
    where the integers and booleans are when they are adjacent in the key, else in front."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis and not _is_bool_scalar(k))
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
    bools, advanced_at, advanced_pos = [], [], None  # advanced_at: positions in `key` (NumPy's rule)
    axis = 0
    for pos, k in enumerate(expanded):
        if k is None:
            out_shape.append(1)
            continue
        if _is_bool_scalar(k):
            bools.append(bool(k))
            advanced_at.append(pos)
            advanced_pos = len(out_shape) if advanced_pos is None else advanced_pos
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
                # ints, NumPy integers and 0-d integer arrays, not floats (NumPy refuses them); a
                # 0-d NDArray converts as it always has
                i = int(k) if isinstance(k, NDArray) else _operator.index(k)
            except TypeError:
                raise IndexError(f"only integers, slices, None, '...', booleans and integer arrays are "
                                 f"valid indices, got {type(k).__name__} {k!r}") from None
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            i %= n
            begins.append(i), ends.append(i + 1), steps.append(1)
            advanced_at.append(pos)
            advanced_pos = len(out_shape) if advanced_pos is None else advanced_pos
        axis += 1
    if bools:
        adjacent = advanced_at == list(range(advanced_at[0], advanced_at[-1] + 1))
        out_shape.insert(advanced_pos if adjacent else 0, 1 if all(bools) else 0)
    return begins, ends, steps, tuple(out_shape)


def _is_advanced(key):
    # A 0-d NumPy array is a scalar index (an integer drops its axis, a boolean adds one).
    return isinstance(key, (NDArray, list)) or (isinstance(key, _np.ndarray) and key.ndim > 0)


def _getitem(self, key):
    if _is_advanced(key):
        idx = key if isinstance(key, NDArray) else _C.array(_np.asarray(key))
        if idx._dtype_name == "bool":
            raise IndexError("boolean-mask indexing is not supported; use nd.where or index with "
                             "integer positions (np.nonzero(mask))")
        return _C.take(self, idx, 0)
    if self.ndim == 0 and isinstance(key, tuple) and key == ():
        return self
    begins, ends, steps, shape = _normalize_key(self, key)
    view = _C.slice(self, begins, ends, steps) if begins else self
    if _has_bool(key):
        # NumPy's boolean indices copy (they are advanced indices): x[False] is empty, x[True]
        # holds x's elements under one more axis.
        if 0 in shape and 0 not in view.shape:
            return _C.zeros(shape, self._dtype_name, self.device)
        return _C.invoke("copy", [view._reshape(shape)])[0]  # the differentiable copy op
    return view._reshape(shape) if view.shape != shape else view


def _has_bool(key):
    return any(_is_bool_scalar(k) for k in (key if isinstance(key, tuple) else (key,)))


def _setitem(self, key, value):
    if _is_advanced(key):
        raise IndexError("assignment through an integer-array index is not supported; "
                         "assign through slices, or build the array with nd.where")
    whole = isinstance(key, tuple) and key == ()
    begins, ends, steps, shape = ([], [], [], self.shape) if whole else _normalize_key(self, key)
    view = _C.slice(self, begins, ends, steps) if begins else self
    # While tracing (hybridize), views are new symbolic values: the tracer follows the write from
    # the view back to `self` (trace::RecordAssign).
    if begins and not view._shares_storage(self) and not _C.is_symbolic(self):
        raise RuntimeError("internal: the indexed region is not a view of the array")
    if _has_bool(key) and 0 in shape and 0 not in view.shape:
        return  # a False index selects nothing
    if isinstance(value, NDArray):
        if _is_same_view(value, view):
            return  # `a[i] += b`: the in-place operator already wrote through the view
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


def _is_same_view(a, b):
    return (not _C.tracing() and a._shares_storage(b) and a.shape == b.shape and a.dtype == b.dtype
            and a._strides() == b._strides() and a._data_ptr() == b._data_ptr())


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
    "asscalar": _asscalar, "norm": _norm, "as_in_context": _as_in_context, "as_in_ctx": _as_in_context,
}.items():
    setattr(NDArray, _name, _fn)
