"""MXNet 1.x tensor operators (mxnet.nd.*) with MXNet's argument names and defaults, composed from
kiln's own ops: concat/stack/split, pick, topk, argmax (float32 as MXNet), where, broadcast_*,
elemwise_*, reductions with `exclude`, reshape/transpose/slice_axis, norm, Cast...

kiln.mxnet_ops re-exports everything here; kiln.nd imports it, kiln.sym wraps it. No op here holds
math of its own: each is a composition of kiln.nd / kiln._C ops, so it differentiates, hybridizes
and exports as they do. `_op` also lets kiln.sym compose these with Symbols passed by keyword
(sym.pick(data=s, index=i)): the call is re-issued with every argument positional.
"""
import builtins as _b
import functools as _functools
import inspect as _inspect
import operator as _operator

from . import _C
from ._C import ArgumentError, ShapeError

__all__ = ["concat", "Concat", "stack", "split", "SliceChannel", "pick", "topk", "sort", "argsort", "argmax", "argmin",
           "clip", "where", "broadcast_to", "broadcast_like", "broadcast_axis", "broadcast_axes", "sum", "mean", "max",
           "min", "prod", "norm", "reshape", "Reshape", "transpose", "expand_dims", "squeeze", "slice", "slice_axis",
           "swapaxes", "SwapAxis", "tile", "Cast", "add_n", "ElementWiseSum", "BlockGrad", "identity", "softsign",
           "Flatten", "repeat", "flip", "reverse"]


def _op(fn):
    """Marks an MXNet op: drops MXNet's `name`/`attr` keywords (kiln names graph nodes itself); a
    call with a Symbol among its keyword arguments goes to kiln.sym with every argument positional."""
    sig = _inspect.signature(fn)

    def via_sym(args, kwargs):
        from . import sym
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        if _b.any(_is_symbol(v) for v in bound.kwargs.values()):
            raise ArgumentError(f"sym.{fn.__name__}: pass Symbols positionally")
        return getattr(sym, fn.__name__)(*bound.args, **bound.kwargs)

    @_functools.wraps(fn)
    def call(*args, **kwargs):
        if kwargs:
            if "name" in kwargs or "attr" in kwargs:
                kwargs.pop("name", None), kwargs.pop("attr", None)
            if "out" in kwargs:
                out = kwargs.pop("out")
                return _into(fn.__name__, call(*args, **kwargs), out)
            for v in kwargs.values():
                if _is_symbol(v):
                    return via_sym(args, kwargs)
        return fn(*args, **kwargs)
    return call


def _into(op, result, out):
    """MXNet's out=: the result written into `out` (same shape and dtype), which is returned."""
    if out is None:
        return result
    if not isinstance(result, _C.NDArray):
        raise ArgumentError(f"{op}: out= takes one array, and {op} returns {len(result)}; assign the results")
    if tuple(out.shape) != tuple(result.shape) or out._dtype_name != result._dtype_name:
        raise ShapeError(f"{op}: out= must be an array of shape {result.shape} and dtype {result._dtype_name}, "
                         f"found {out.shape} {out._dtype_name}")
    result.copyto(out)
    return out


_PLAIN = {int, float, bool, str, tuple, list, type(None), _C.NDArray}


def _is_symbol(v):
    return type(v) not in _PLAIN and getattr(v, "_kiln_symbol", False)


def _need(op, name, value):
    if value is None:
        raise ArgumentError(f"{op}: the argument '{name}' is required")
    return value


def _axis(op, axis, ndim, name="axis"):
    """`axis` as a non-negative int within `ndim` dimensions."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ArgumentError(f"{op}: {name} must be an int, got {axis!r}")
    if not -ndim <= axis < _b.max(ndim, 1):
        raise ArgumentError(f"{op}: {name}={axis} is out of range for an array of {ndim} dimension(s); "
                            f"use a value in [{-ndim}, {ndim})")
    return axis % _b.max(ndim, 1)


def _count(op, value, name):
    """`value` as a non-negative int (a repeat count: 0 gives an empty axis, as in NumPy)."""
    try:
        n = None if isinstance(value, bool) else _operator.index(value)
    except TypeError:
        n = None
    if n is None or n < 0:
        raise ArgumentError(f"{op}: expected {name} to be a non-negative integer (0 gives an empty axis), "
                            f"found {value!r}")
    return n


def _axes(op, axis, ndim, exclude=False):
    """MXNet's axis argument (None, () for all, an int or a tuple) as a sorted tuple of axes."""
    if axis is None or axis == ():
        axes = tuple(range(ndim))
        return () if exclude else axes
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(sorted({_axis(op, a, ndim) for a in axes}))
    return tuple(a for a in range(ndim) if a not in axes) if exclude else axes


def _arrays(op, data):
    """*data of concat/stack, also accepting kiln's single list/tuple argument."""
    if len(data) >= 1 and isinstance(data[0], (list, tuple)):
        if len(data) > 2:
            raise ArgumentError(f"{op}: pass the arrays either as separate arguments or as one list")
        return list(data[0]), (data[1] if len(data) == 2 else None)
    return list(data), None


@_op
def concat(*data, dim=1, num_args=None, axis=None):
    """Joins arrays along `dim` (MXNet's default 1). kiln's form concat([a, b], axis) also works
    (its default axis stays 0)."""
    arrays, pos_axis = _arrays("concat", data)
    if not arrays:
        raise ArgumentError("concat: needs at least one array")
    if axis is None:
        axis = pos_axis if pos_axis is not None else (0 if isinstance(data[0], (list, tuple)) else dim)
    return _C.concat(arrays, axis)


Concat = concat


@_op
def stack(*data, axis=0, num_args=None):
    """Stacks same-shaped arrays along a new `axis`; kiln's stack([a, b], axis) also works."""
    arrays, pos_axis = _arrays("stack", data)
    if not arrays:
        raise ArgumentError("stack: needs at least one array")
    return _C.stack(arrays, pos_axis if pos_axis is not None else axis)


@_op
def split(data, num_outputs=None, axis=1, squeeze_axis=False, sections=None):
    """MXNet's split/SliceChannel: `num_outputs` equal parts along `axis` (default 1), each with that
    axis removed when `squeeze_axis`; a list (or one array when num_outputs is 1). A list of sizes
    for `num_outputs` (or `sections`) gives parts of those sizes."""
    parts = sections if sections is not None else _need("split", "num_outputs", num_outputs)
    ax = _axis("split", axis, data.ndim)
    n = data.shape[ax]
    if isinstance(parts, int):
        if parts <= 0 or n % parts:
            raise ShapeError(f"split: axis {ax} of shape {data.shape} has {n} elements, which do not split into "
                             f"{parts} equal parts; choose num_outputs dividing {n}")
        sizes = [parts]
    else:
        sizes = [int(s) for s in parts]
    outs = list(_C.split(data, sizes, ax))
    if squeeze_axis:
        if _b.any(o.shape[ax] != 1 for o in outs):
            raise ShapeError(f"split: squeeze_axis=True needs parts of size 1 along axis {ax}, "
                             f"found sizes {[o.shape[ax] for o in outs]}")
        outs = [_C.squeeze(o, [ax]) for o in outs]
    return outs[0] if len(outs) == 1 else outs


SliceChannel = split


def _move_last(x, ax):
    """x with its last axis moved to position `ax`."""
    if ax == x.ndim - 1:
        return x
    perm = list(range(x.ndim - 1))
    perm.insert(ax, x.ndim - 1)
    return x._transpose(perm)


def _one_hot_along(index, depth, ax, dtype):
    """one_hot(index) with the new axis of length `depth` at `ax` (index has that axis removed)."""
    return _move_last(_C.one_hot(index, depth, 1.0, 0.0, dtype), ax)


def _int_index(index):
    return index if index._dtype_name in ("int32", "int64") else _C.cast(_C.round(index), "int64")


@_op
def pick(data, index, axis=-1, keepdims=False, mode="clip"):
    """data's elements at `index` along `axis` (index has data's shape without that axis, or size 1
    there); differentiable w.r.t. data. mode 'clip' clamps indices, 'wrap' wraps them."""
    ax = _axis("pick", axis, data.ndim)
    n = data.shape[ax]
    want = data.shape[:ax] + data.shape[ax + 1:]
    if index.ndim == data.ndim and index.shape[ax] == 1:
        index = _C.squeeze(index, [ax])
    if tuple(index.shape) != want:
        raise ShapeError(f"pick: index must have shape {want} (data {data.shape} without axis {ax}), "
                         f"found {index.shape}")
    if mode == "clip":
        index = _C.clip(index, 0, n - 1)
    elif mode == "wrap":
        if index._dtype_name in ("int32", "int64"):
            index = _C.cast(index, "float64")
        index = index - _C.floor(index / float(n)) * float(n)
    else:
        raise ArgumentError(f"pick: mode must be 'clip' or 'wrap', got {mode!r}")
    mask = _one_hot_along(_int_index(index), n, ax, data._dtype_name)
    return (data * mask).sum(axis=ax, keepdims=keepdims)


def _arg(name, data, axis, keepdims):
    if axis is None:
        out = getattr(data.reshape((-1,)), name)(axis=0)
        return _C.cast(out.reshape((1,)) if not keepdims else out.reshape((1,) * data.ndim), "float32")
    ax = _axis(name, axis, data.ndim)
    return _C.cast(getattr(data, name)(axis=ax, keepdims=keepdims), "float32")


@_op
def argmax(data, axis=None, keepdims=False):
    """Index of the largest element along `axis` (of all elements when None), as float32 as MXNet."""
    return _arg("argmax", data, axis, keepdims)


@_op
def argmin(data, axis=None, keepdims=False):
    """Index of the smallest element along `axis`, as float32 as MXNet."""
    return _arg("argmin", data, axis, keepdims)


_RANK_LIMIT = 1 << 24  # elements of the pairwise comparison topk may build (64 MiB of float32)
_MAX_ROUNDS = 256  # argmax rounds topk may take otherwise (each is a handful of ops)


@_op
def topk(data, axis=-1, k=1, ret_typ="indices", is_ascend=False, dtype="float32"):
    """The k largest (smallest with is_ascend) elements along `axis` (k < 1: all of them, sorted).
    ret_typ: 'indices' (in `dtype`), 'value' (differentiable w.r.t. data), 'both' ([value,
    indices]) or 'mask' (1 where selected). Ties go to the lower index. kiln has no sort op: small
    k takes k rounds of argmax and one-hot masking (O(k*n)); larger k ranks every element by
    pairwise comparison (O(n*n) per row, while that stays under 2**24 elements)."""
    if ret_typ not in ("indices", "value", "both", "mask"):
        raise ArgumentError(f"topk: ret_typ must be 'indices', 'value', 'both' or 'mask', got {ret_typ!r}")
    ax = _axis("topk", -1 if axis is None else axis, data.ndim)
    if axis is None:
        data = data.reshape((-1,))
    n = data.shape[ax]
    k = n if k < 1 else k
    if k > n:
        raise ArgumentError(f"topk: k={k} is larger than axis {ax} of shape {data.shape} ({n} elements)")
    rows = 1
    for d in data.shape:
        rows *= d
    if k > 4 and rows * n <= _RANK_LIMIT:
        return _topk_by_rank(data, ax, k, ret_typ, is_ascend, dtype)
    if k > _MAX_ROUNDS:
        raise ArgumentError(f"topk: k={k} of {n} elements per row of {data.shape} is too large for kiln, which has "
                            f"no sort op: its composition handles k <= {_MAX_ROUNDS}, or any k while "
                            f"size * n <= 2**24 ({rows * n} here); take a smaller k, or sort on the host "
                            f"(np.sort(x.asnumpy()))")
    fill = float("inf") if is_ascend else float("-inf")
    rest = _C.stop_gradient(data)  # only chooses; the values' gradient flows through `data * m`
    values, indices, masks = [], [], []
    for _ in range(k):
        idx = getattr(rest, "argmin" if is_ascend else "argmax")(axis=ax)
        m = _one_hot_along(idx, n, ax, data._dtype_name)
        masks.append(m)
        indices.append(idx)
        if ret_typ in ("value", "both"):
            values.append((data * m).sum(axis=ax))
        rest = _C.where(m > 0, _C.full(rest.shape, fill, rest._dtype_name, rest.device), rest)
    if ret_typ == "mask":
        return add_n(*masks)
    idx = _C.cast(_C.stack(indices, ax), dtype)
    if ret_typ == "indices":
        return idx
    val = _C.stack(values, ax)
    return val if ret_typ == "value" else [val, idx]


def _topk_by_rank(data, ax, k, ret_typ, is_ascend, dtype):
    """topk through each element's rank: the count of elements ahead of it (greater, or equal
    at a lower index); the one-hot of the ranks is the sorting permutation."""
    n, last = data.shape[ax], data.ndim - 1
    perm = list(range(data.ndim))
    perm[ax], perm[last] = perm[last], perm[ax]
    x = data._transpose(perm) if ax != last else data  # the axis last
    xs = _C.stop_gradient(x)
    xi, xj = _C.expand_dims(xs, -1), _C.expand_dims(xs, -2)  # (..., n, 1) and (..., 1, n)
    ahead = (xj < xi) if is_ascend else (xj > xi)
    pos = _C.arange(0, n, 1, data._dtype_name, data.device)
    lower = _C.cast(_C.expand_dims(pos, 0) < _C.expand_dims(pos, 1), data._dtype_name)  # [i, j] = j < i
    ft = data._dtype_name
    rank = (_C.cast(ahead, ft) + _C.cast(xj == xi, ft) * lower).sum(axis=-1)  # (..., n)
    if ret_typ == "mask":
        out = _C.cast(rank < float(k), ft)
        return out._transpose(perm) if ax != last else out
    onehot = _C.one_hot(_C.cast(rank, "int64"), n, 1.0, 0.0, ft)  # (..., i, r): element i has rank r
    begin, end = [0] * x.ndim, list(x.shape)
    end[-1] = k

    def first_k(t):
        t = _C.slice(t, begin, end, None)
        return t._transpose(perm) if ax != last else t
    idx = first_k(_C.cast((_C.expand_dims(pos, -1) * onehot).sum(axis=-2), dtype))
    if ret_typ == "indices":
        return idx
    val = first_k((_C.expand_dims(x, -1) * onehot).sum(axis=-2))
    return val if ret_typ == "value" else [val, idx]


@_op
def sort(data, axis=-1, is_ascend=True):
    """data sorted along `axis` (ascending by default), differentiable w.r.t. data (see topk)."""
    return topk(data, axis=axis, k=0, ret_typ="value", is_ascend=is_ascend)


@_op
def argsort(data, axis=-1, is_ascend=True, dtype="float32"):
    """The indices that sort data along `axis`, in `dtype` (float32 as MXNet; see topk)."""
    return topk(data, axis=axis, k=0, ret_typ="indices", is_ascend=is_ascend, dtype=dtype)


@_op
def clip(data, a_min, a_max):
    """data limited to [a_min, a_max]."""
    if a_min > a_max:
        raise ArgumentError(f"clip: a_min ({a_min}) must not exceed a_max ({a_max})")
    return _C.clip(data, float(a_min), float(a_max))


@_op
def where(condition, x, y):
    """x where condition is non-zero, else y; a 1-D condition over a batch picks whole rows of x/y."""
    if condition.ndim == 1 and x.ndim > 1 and condition.shape[0] == x.shape[0]:
        condition = condition.reshape((condition.shape[0],) + (1,) * (x.ndim - 1))
    return _C.where(condition, x, y)


@_op
def broadcast_to(data, shape):
    """data broadcast to `shape`; a 0 in `shape` keeps data's size there, as in MXNet."""
    shape = tuple(shape)
    if len(shape) == data.ndim:
        shape = tuple(d if s == 0 else s for s, d in zip(shape, data.shape))
    return _C.broadcast_to(data, shape)


@_op
def broadcast_like(lhs, rhs, lhs_axes=None, rhs_axes=None):
    """lhs broadcast to rhs's shape."""
    if lhs_axes is not None or rhs_axes is not None:
        shape = list(lhs.shape)
        for la, ra in zip(lhs_axes or (), rhs_axes or ()):
            shape[la] = rhs.shape[ra]
        return _C.broadcast_to(lhs, tuple(shape))
    return _C.broadcast_to(lhs, tuple(rhs.shape))


@_op
def broadcast_axis(data, axis=(), size=()):
    """data, whose `axis` dimensions are 1, repeated `size` times along them."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    sizes = (size,) if isinstance(size, int) else tuple(size)
    if len(axes) != len(sizes):
        raise ArgumentError(f"broadcast_axis: axis {axes} and size {sizes} must have the same length")
    shape = list(data.shape)
    for a, s in zip(axes, sizes):
        a = _axis("broadcast_axis", a, data.ndim)
        if shape[a] != 1:
            raise ShapeError(f"broadcast_axis: axis {a} of shape {data.shape} must have size 1 to broadcast, "
                             f"found {shape[a]}")
        shape[a] = s
    return _C.broadcast_to(data, tuple(shape))


broadcast_axes = broadcast_axis


def _reduce(name):
    def f(data, axis=None, keepdims=False, exclude=False):
        if not exclude and (axis is None or type(axis) is int):  # the common case, checked by the method
            return getattr(data, name)(axis=axis, keepdims=keepdims)
        axes = _axes(name, axis, data.ndim, exclude)
        if not axes:
            return data
        return getattr(data, name)(axis=axes, keepdims=keepdims)
    f.__name__ = name
    f.__doc__ = (f"{name} over `axis` (an int or a tuple; None or () for all; with exclude=True every "
                 f"axis but those), as MXNet's nd.{name}.")
    return _op(f)


sum = _reduce("sum")
mean = _reduce("mean")
max = _reduce("max")
min = _reduce("min")


@_op
def prod(data, axis=None, keepdims=False, exclude=False):
    """Product over `axis` by multiplication, as MXNet and NumPy compute it (exp(sum(log|x|)) was
    off in the last bits: 3*5*7*11*13 gave 15015.001): the reduced axes are moved last and
    flattened, then halves are multiplied pairwise, log2(n) elementwise products, each rounded
    once. Any dtype (integers wrap as in NumPy), differentiable through the products (zeros
    included), and 1 over an empty reduction."""
    axes = _axes("prod", axis, data.ndim, exclude)
    kept = [a for a in range(data.ndim) if a not in axes]
    out_shape = (tuple(1 if a in axes else data.shape[a] for a in range(data.ndim)) if keepdims
                 else tuple(data.shape[a] for a in kept))
    n = 1
    for a in axes:
        n *= data.shape[a]
    if n == 0:
        return _C.full(out_shape, 1.0, data._dtype_name, data.device)
    perm = tuple(kept) + axes
    x = data._transpose(perm) if perm != tuple(range(data.ndim)) else data
    lead = tuple(data.shape[a] for a in kept)
    x = x.reshape(lead + (n,))
    begin = [0] * x.ndim

    def part(t, b, e):
        end = list(t.shape)
        begin[-1], end[-1] = b, e
        return _C.slice(t, begin, end, None)
    tails = []  # the odd last elements, multiplied in at the end
    while n > 1:
        if n % 2:
            tails.append(part(x, n - 1, n))
            x, n = part(x, 0, n - 1), n - 1
        x, n = part(x, 0, n // 2) * part(x, n // 2, n), n // 2
    for t in reversed(tails):
        x = x * t
    return x.reshape(out_shape)


@_op
def norm(data, ord=2, axis=None, keepdims=False):
    """The L2 (ord=2) or L1 (ord=1) norm over `axis` (every element when None)."""
    axes = _axes("norm", axis, data.ndim)
    if ord == 2:
        return _C.sqrt(_C.square(data).sum(axis=axes, keepdims=keepdims))
    if ord == 1:
        return _C.abs(data).sum(axis=axes, keepdims=keepdims)
    raise ArgumentError(f"norm: ord must be 1 or 2, got {ord!r}")


@_op
def reshape(data, shape=None, reverse=False):
    """data with a new shape (NDArray.reshape's special values apply)."""
    if reverse:
        raise ArgumentError("reshape: reverse=True is not supported; give the shape left to right")
    return data.reshape(tuple(_need("reshape", "shape", shape)))


Reshape = reshape


@_op
def transpose(data, axes=None):
    """data with its axes permuted (reversed when `axes` is None or ())."""
    return data._transpose(tuple(axes) if axes else None)


@_op
def expand_dims(data, axis):
    return _C.expand_dims(data, axis)


@_op
def squeeze(data, axis=None):
    return _C.squeeze(data, axis)


@_op
def slice(data, begin, end, step=None):
    """data[begin:end:step] per axis; None entries take the defaults; missing axes are whole."""
    begin, end = tuple(begin), tuple(end)
    step = tuple(step) if step else (None,) * len(begin)
    if not len(begin) == len(end) == len(step):
        raise ArgumentError(f"slice: begin {begin}, end {end} and step {step} must have the same length")
    b, e, s = [], [], []
    for ax, (bb, ee, ss) in enumerate(zip(begin, end, step)):
        bi, ei, si = _b.slice(bb, ee, ss).indices(data.shape[ax])
        b.append(bi), e.append(ei if ei >= 0 else -data.shape[ax] - 1), s.append(si)
    return _C.slice(data, b, e, s)


@_op
def slice_axis(data, axis, begin, end):
    """data[..., begin:end, ...] along `axis`; end=None runs to the end; negatives count back."""
    ax = _axis("slice_axis", axis, data.ndim)
    n = data.shape[ax]
    bi, ei, _ = _b.slice(begin, end).indices(n)
    if ei <= bi:
        raise ArgumentError(f"slice_axis: begin={begin}, end={end} select nothing of axis {ax} ({n} elements)")
    b = [0] * data.ndim
    e = list(data.shape)
    b[ax], e[ax] = bi, ei
    return _C.slice(data, b, e, None)


@_op
def swapaxes(data, dim1=0, dim2=0):
    perm = list(range(data.ndim))
    a, c = _axis("swapaxes", dim1, data.ndim), _axis("swapaxes", dim2, data.ndim)
    perm[a], perm[c] = perm[c], perm[a]
    return data._transpose(perm)


SwapAxis = swapaxes


@_op
def tile(data, reps):
    """data repeated `reps` times per axis (broadcast on a new axis before each, then merged), as
    numpy.tile: a zero repeat or a zero-size input gives the empty result."""
    try:
        reps = (reps,) if _b.hasattr(reps, "__index__") else tuple(reps)
    except TypeError:
        raise ArgumentError(f"tile: reps must be an int or a tuple of ints, got {reps!r}") from None
    reps = tuple(_count("tile", r, "reps") for r in reps)
    nd_ = _b.max(len(reps), data.ndim)
    reps = (1,) * (nd_ - len(reps)) + reps
    # _reshape takes the sizes as they are (a 0 is a size, not MXNet's "copy this dimension").
    x = data._reshape((1,) * (nd_ - data.ndim) + tuple(data.shape))
    inter, target = [], []
    for r, d in zip(reps, x.shape):
        inter += [1, d]
        target += [r, d]
    y = _C.broadcast_to(x._reshape(tuple(inter)), tuple(target))
    return y._reshape(tuple(r * d for r, d in zip(reps, x.shape)))


@_op
def Cast(data, dtype):
    return _C.cast(data, dtype)


@_op
def repeat(data, repeats, axis=None):
    """Each element repeated `repeats` times along `axis` (of the flattened data when None), as
    numpy.repeat: repeats=0 gives an empty axis."""
    repeats = _count("repeat", repeats, "repeats")
    if axis is None:
        data, axis = data._reshape((data.size,)), 0
    ax = _axis("repeat", axis, data.ndim)
    shape = tuple(data.shape)
    y = _C.broadcast_to(_C.expand_dims(data, ax + 1), shape[:ax + 1] + (repeats,) + shape[ax + 1:])
    return y._reshape(shape[:ax] + (shape[ax] * repeats,) + shape[ax + 1:])


@_op
def flip(data, axis):
    """data reversed along `axis` (an int or a tuple)."""
    axes = _axes("flip", axis, data.ndim)
    b = [data.shape[a] - 1 if a in axes else 0 for a in range(data.ndim)]
    e = [-data.shape[a] - 1 if a in axes else data.shape[a] for a in range(data.ndim)]
    return _C.slice(data, b, e, [-1 if a in axes else 1 for a in range(data.ndim)])


reverse = flip


def add_n(*args):
    """The elementwise sum of its arguments."""
    if not args:
        raise ArgumentError("add_n: needs at least one array")
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out


ElementWiseSum = add_n


@_op
def BlockGrad(data):
    """data, with no gradient flowing back (stop_gradient)."""
    return _C.stop_gradient(data)


@_op
def identity(data):
    """A copy of data."""
    return data.copy()


@_op
def softsign(data):
    return data / (_C.abs(data) + 1.0)


@_op
def Flatten(data):
    """(N, d1, d2, ...) -> (N, d1*d2*...)."""
    return _C.flatten(data)


def _binary(name, fn, same_shape=False, as_float=False):
    def f(lhs, rhs):
        if same_shape and tuple(lhs.shape) != tuple(rhs.shape):
            raise ShapeError(f"{name}: the inputs must have the same shape, found {lhs.shape} and {rhs.shape}; "
                             f"use broadcast_{name.split('_', 1)[1]} to broadcast")
        out = fn(lhs, rhs)
        return _C.cast(out, lhs._dtype_name) if as_float and out._dtype_name != lhs._dtype_name else out
    f.__name__ = name
    f.__doc__ = f"MXNet's {name}: {fn.__name__} of lhs and rhs" + ("" if same_shape else " with broadcasting") + \
        (", as 0/1 in lhs's dtype" if as_float else "")
    return _op(f)


_BINARY = {"add": _C.add, "sub": _C.subtract, "mul": _C.multiply, "div": _C.divide, "power": _C.power,
           "maximum": _C.maximum, "minimum": _C.minimum, "mod": _C.mod}
_COMPARE = {"equal": _C.equal, "not_equal": _C.not_equal, "greater": _C.greater,
            "greater_equal": _C.greater_equal, "lesser": _C.less, "lesser_equal": _C.less_equal}
for _n, _f in _BINARY.items():
    globals()["broadcast_" + _n] = _binary("broadcast_" + _n, _f)
    __all__.append("broadcast_" + _n)
for _n, _f in _COMPARE.items():
    globals()["broadcast_" + _n] = _binary("broadcast_" + _n, _f, as_float=True)
    __all__.append("broadcast_" + _n)
for _n in ("add", "sub", "mul", "div"):
    globals()["elemwise_" + _n] = _binary("elemwise_" + _n, _BINARY[_n], same_shape=True)
    __all__.append("elemwise_" + _n)
