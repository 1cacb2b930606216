"""The MXNet 1.x operator API (mxnet.nd.Convolution, Pooling, FullyConnected, Activation, BatchNorm,
Dropout, SoftmaxOutput, dot, batch_dot, softmax, Embedding... and the tensor ops of
kiln.mxnet_tensor_ops) with MXNet's argument names and defaults, so that MXNet code written as

    h = nd.Convolution(data=X, weight=W1, bias=b1, kernel=(3, 3), num_filter=20)
    h = nd.Pooling(data=nd.Activation(h, act_type='relu'), pool_type='avg', kernel=(2, 2), stride=(2, 2))

runs on kiln. kiln.nd imports every name of __all__ (so they are nd.Convolution...), kiln.sym wraps
them for Symbols, and a hybrid_forward(F, x) sees them as F.Convolution.

Each op checks its arguments (typed errors saying what was expected and found) and then maps onto
kiln's own ops (conv2d, max_pool2d, avg_pool2d, linear, matmul, batch_norm, softmax, ...): no math
is implemented twice, so they differentiate, hybridize and export as those do. Convolution and
pooling are kiln's 2-D NCHW ones (1-D NCW data runs as (N, C, 1, W)); other layouts and 3-D
kernels are refused.

Where kiln differs from MXNet (documented per op): BatchNorm updates its moving statistics in the
forward pass (MXNet: in the backward pass) with the unbiased batch variance; SoftmaxOutput's
gradient is MXNet's softmax - one_hot(label) when the head gradient is ones (out.backward(), as
MXNet uses it: as the network's head), scaled by the mean of the head gradient over classes
otherwise (MXNet ignores the head gradient).
"""
import builtins as _b

from . import _C
from ._C import ArgumentError, ShapeError
from .mxnet_tensor_ops import *  # noqa: F401,F403
from .mxnet_tensor_ops import __all__ as _tensor_all, _op, _need, _axis, repeat, softsign

__all__ = ["Convolution", "Pooling", "FullyConnected", "Activation", "LeakyReLU", "BatchNorm", "Dropout",
           "softmax", "log_softmax", "SoftmaxOutput", "SoftmaxActivation", "dot", "batch_dot", "one_hot",
           "Embedding", "LayerNorm", "InstanceNorm", "L2Normalization", "smooth_l1", "gather_nd",
           "UpSampling", "SequenceMask"] + _tensor_all


def _pair(op, name, value, default):
    """A 2-D kernel/stride/pad/dilate argument: an int or a tuple of 2 ints ((), None: default)."""
    if value is None or value == ():
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    t = tuple(value)
    if len(t) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
        raise ArgumentError(f"{op}: {name} must be 2 ints for 4-D (NCHW) data or 1 int for 3-D (NCW) data "
                            f"(kiln has 1-D and 2-D {op} only), found {name}={value!r}")
    return t


def _widen(value, pad):
    """A 1-D argument as the 2-D one of the same op on (N, C, 1, W) data."""
    if value is None or value == ():
        return value
    t = (value,) if isinstance(value, int) else tuple(value)
    return (pad,) + t if len(t) == 1 else t


def _is_1d(data, kernel):
    return data is not None and data.ndim == 3 and kernel is not None and \
        (isinstance(kernel, int) or len(tuple(kernel)) == 1)


def _check_layout(op, layout, ndim=4):
    if layout not in (None, "NCHW" if ndim == 4 else "NCW"):
        raise ArgumentError(f"{op}: layout {layout!r} is not supported; kiln computes in NCHW (NCW for 1-D): "
                            f"transpose the data (nd.transpose(x, axes=(0, 3, 1, 2)) for NHWC) and use "
                            f"layout='NCHW'")


def _check_4d(op, data):
    if data.ndim != 4:
        raise ShapeError(f"{op}: data must be 4-D (batch, channel, height, width), or 3-D (batch, channel, "
                         f"width) with a 1-D kernel, found shape {data.shape}")


@_op
def Convolution(data=None, weight=None, bias=None, kernel=None, stride=(), dilate=(), pad=(), num_filter=None,
                num_group=1, workspace=1024, no_bias=False, cudnn_tune=None, cudnn_off=False, layout=None):
    """2-D convolution of NCHW `data` with `weight` (num_filter, C / num_group, kh, kw) and `bias`
    (num_filter,), as MXNet's Convolution (stride, dilate default 1; pad 0); 1-D on NCW data with
    a 1-element kernel and weight (num_filter, C / num_group, k)."""
    op = "Convolution"
    data, weight = _need(op, "data", data), _need(op, "weight", weight)
    num_filter = _need(op, "num_filter", num_filter)
    if _is_1d(data, kernel):  # (N, C, W): as (N, C, 1, W) with a (1, k) kernel
        _check_layout(op, layout, 3)
        k = _widen(kernel, 1)[1:]
        want = (num_filter, data.shape[1] // _b.max(num_group, 1)) + k
        if tuple(weight.shape) != want:
            raise ShapeError(f"{op}: weight must have shape {want} (num_filter, channels / num_group, kernel) for "
                             f"data {data.shape}, found {weight.shape}")
        w = weight.reshape(tuple(weight.shape[:2]) + (1,) + k)
        out = Convolution(_C.expand_dims(data, 2), w, bias, _widen(kernel, 1), _widen(stride, 1),
                          _widen(dilate, 1), _widen(pad, 0), num_filter, num_group, workspace, no_bias)
        return _C.squeeze(out, [2])
    _check_layout(op, layout)
    k = _pair(op, "kernel", _need(op, "kernel", kernel), None)
    s, d, p = _pair(op, "stride", stride, (1, 1)), _pair(op, "dilate", dilate, (1, 1)), _pair(op, "pad", pad, (0, 0))
    _check_4d(op, data)
    c = data.shape[1]
    if num_group < 1 or c % num_group or num_filter % num_group:
        raise ArgumentError(f"{op}: num_group={num_group} must divide the {c} input channels and num_filter="
                            f"{num_filter}")
    want = (num_filter, c // num_group) + k
    if tuple(weight.shape) != want:
        raise ShapeError(f"{op}: weight must have shape {want} (num_filter, channels / num_group, *kernel) for "
                         f"data {data.shape}, found {weight.shape}; check num_filter, kernel and the weight")
    if no_bias:
        bias = None
    elif bias is None:
        raise ArgumentError(f"{op}: bias is required unless no_bias=True")
    elif tuple(bias.shape) != (num_filter,):
        raise ShapeError(f"{op}: bias must have shape ({num_filter},) (num_filter), found {bias.shape}")
    return _C.conv2d(data, weight, bias, s, p, d, num_group)


def _full_extra(n, k, s, p):
    """Rows to append so that 'valid' pooling gives the output size of MXNet's 'full' convention."""
    span = n + 2 * p - k
    full = -(-span // s) + 1
    return (full - 1) * s - span


@_op
def Pooling(data=None, kernel=(), pool_type="max", global_pool=False, cudnn_off=False, pooling_convention="valid",
            stride=(), pad=(), p_value=None, count_include_pad=None, layout=None):
    """2-D max/avg/sum pooling of NCHW `data` (1-D of NCW data), as MXNet's Pooling: stride
    defaults to 1 (not to the kernel), global_pool pools each whole channel, pooling_convention
    'full' rounds the output size up (max pooling only when it changes the size),
    count_include_pad (default True) for avg."""
    op = "Pooling"
    data = _need(op, "data", data)
    if data.ndim == 3 and (global_pool or _is_1d(data, kernel)):  # (N, C, W): as (N, C, 1, W)
        _check_layout(op, layout, 3)
        out = Pooling(_C.expand_dims(data, 2), _widen(kernel, 1), pool_type, global_pool, cudnn_off,
                      pooling_convention, _widen(stride, 1), _widen(pad, 0), p_value, count_include_pad)
        return _C.squeeze(out, [2])
    _check_layout(op, layout)
    if pool_type not in ("max", "avg", "sum"):
        raise ArgumentError(f"{op}: pool_type must be 'max', 'avg' or 'sum', found {pool_type!r}"
                            + ("; kiln has no Lp pooling" if pool_type == "lp" else ""))
    if pooling_convention not in ("valid", "full"):
        raise ArgumentError(f"{op}: pooling_convention must be 'valid' or 'full', found {pooling_convention!r}")
    _check_4d(op, data)
    if global_pool:
        if pool_type == "max":
            return data.max(axis=(2, 3), keepdims=True)
        out = _C.global_avg_pool2d(data)
        return out * float(data.shape[2] * data.shape[3]) if pool_type == "sum" else out
    if kernel is None or kernel == ():
        raise ArgumentError(f"{op}: kernel is required unless global_pool=True")
    k = _pair(op, "kernel", kernel, None)
    s, p = _pair(op, "stride", stride, (1, 1)), _pair(op, "pad", pad, (0, 0))
    for i in range(2):
        if k[i] > data.shape[2 + i] + 2 * p[i]:
            raise ShapeError(f"{op}: kernel {k} is larger than the padded input {data.shape[2:]} with pad {p}")
    if pooling_convention == "full":
        extra = [_full_extra(data.shape[2 + i], k[i], s[i], p[i]) for i in range(2)]
        if any(extra):
            if pool_type != "max":
                raise ArgumentError(f"{op}: pooling_convention='full' changes the output size here and kiln "
                                    f"supports that for pool_type='max' only; pad the input instead")
            for i, e in enumerate(extra):
                if e:
                    shape = list(data.shape)
                    shape[2 + i] = e
                    data = _C.concat([data, _C.full(tuple(shape), float("-inf"), data._dtype_name, data.device)],
                                     2 + i)
    if pool_type == "max":
        return _C.max_pool2d(data, k, s, p)
    include = True if count_include_pad is None else bool(count_include_pad)
    out = _C.avg_pool2d(data, k, s, p, include)
    return out * float(k[0] * k[1]) if pool_type == "sum" else out


@_op
def FullyConnected(data=None, weight=None, bias=None, num_hidden=None, no_bias=False, flatten=True):
    """data @ weight.T + bias with weight (num_hidden, in_units); flatten=True first flattens data
    to (batch, -1), flatten=False applies to the last axis."""
    op = "FullyConnected"
    data, weight = _need(op, "data", data), _need(op, "weight", weight)
    num_hidden = _need(op, "num_hidden", num_hidden)
    if flatten and data.ndim != 2:
        data = _C.flatten(data) if data.ndim > 2 else data.reshape((data.shape[0] if data.ndim else 1, -1))
    want = (num_hidden, data.shape[-1])
    if tuple(weight.shape) != want:
        raise ShapeError(f"{op}: weight must have shape {want} (num_hidden, input features), found {weight.shape}")
    if no_bias:
        bias = None
    elif bias is None:
        raise ArgumentError(f"{op}: bias is required unless no_bias=True")
    elif tuple(bias.shape) != (num_hidden,):
        raise ShapeError(f"{op}: bias must have shape ({num_hidden},) (num_hidden), found {bias.shape}")
    return _C.linear(data, weight, bias)


_ACTIVATIONS = {"relu": _C.relu, "sigmoid": _C.sigmoid, "tanh": _C.tanh, "softrelu": _C.softplus,
                "softsign": softsign}


@_op
def Activation(data=None, act_type=None):
    """act_type: 'relu', 'sigmoid', 'tanh', 'softrelu' (log(1 + e^x)) or 'softsign' (x / (1 + |x|))."""
    data = _need("Activation", "data", data)
    fn = _ACTIVATIONS.get(act_type)
    if fn is None:
        raise ArgumentError(f"Activation: act_type must be one of {sorted(_ACTIVATIONS)}, found {act_type!r}")
    return fn(data)


_SELU_ALPHA, _SELU_LAMBDA = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@_op
def LeakyReLU(data=None, gamma=None, act_type="leaky", slope=0.25, lower_bound=0.125, upper_bound=0.334):
    """act_type 'leaky' (x or slope * x), 'prelu' (per-channel slope `gamma` on axis 1), 'elu',
    'selu' or 'gelu'."""
    data = _need("LeakyReLU", "data", data)
    pos = data > 0
    if act_type == "leaky":
        return _C.where(pos, data, data * float(slope))
    if act_type == "prelu":
        gamma = _need("LeakyReLU", "gamma", gamma)
        if data.ndim < 2 or _prod(gamma.shape) not in (1, data.shape[1]):
            raise ShapeError(f"LeakyReLU: prelu's gamma must have 1 or {data.shape[1] if data.ndim > 1 else '?'} "
                             f"elements (channels, axis 1 of {data.shape}), found {gamma.shape}")
        g = gamma.reshape((1, -1) + (1,) * (data.ndim - 2))
        return _C.where(pos, data, data * g)
    if act_type == "elu":
        return _C.where(pos, data, _C.expm1(data) * float(slope))
    if act_type == "selu":
        return _C.where(pos, data, _C.expm1(data) * _SELU_ALPHA) * _SELU_LAMBDA
    if act_type == "gelu":
        return _C.gelu(data)
    raise ArgumentError(f"LeakyReLU: act_type must be 'leaky', 'prelu', 'elu', 'selu' or 'gelu', found "
                        f"{act_type!r}" + ("; kiln has no rrelu" if act_type == "rrelu" else ""))


@_op
def BatchNorm(data=None, gamma=None, beta=None, moving_mean=None, moving_var=None, eps=1e-3, momentum=0.9,
              fix_gamma=True, use_global_stats=False, output_mean_var=False, axis=1, cudnn_off=False,
              min_calib_range=None, max_calib_range=None):
    """Batch normalization over every axis but `axis`, as MXNet's BatchNorm: in training
    (autograd.is_training(), i.e. inside autograd.record() unless use_global_stats) it uses the
    batch statistics and updates moving_mean/moving_var in place (momentum as MXNet's); otherwise
    the moving statistics. fix_gamma=True (MXNet's default) uses gamma = 1 (gamma gets a zero
    gradient). kiln updates the moving statistics in the forward pass with the unbiased variance."""
    op = "BatchNorm"
    args = [_need(op, n, v) for n, v in (("data", data), ("gamma", gamma), ("beta", beta),
                                          ("moving_mean", moving_mean), ("moving_var", moving_var))]
    data, gamma, beta, moving_mean, moving_var = args
    if output_mean_var:
        raise ArgumentError(f"{op}: output_mean_var=True is not supported; compute the mean and variance with "
                            f"nd.mean if you need them")
    ax = _axis(op, axis, data.ndim)
    c = data.shape[ax]
    for n, p in (("gamma", gamma), ("beta", beta), ("moving_mean", moving_mean), ("moving_var", moving_var)):
        if tuple(p.shape) != (c,):
            raise ShapeError(f"{op}: {n} must have shape ({c},) (axis {ax} of data {data.shape}), found {p.shape}")
    if fix_gamma:
        gamma = _C.stop_gradient(gamma) * 0.0 + 1.0
    training = _C.is_training() and not use_global_stats
    return _C.batch_norm(data, gamma, beta, moving_mean, moving_var, ax, float(eps), float(momentum), training)


@_op
def Dropout(data=None, p=0.5, mode="training", axes=(), cudnn_off=False):
    """Zeroes elements with probability p and scales the rest by 1 / (1 - p) in training
    (autograd.is_training()), or always with mode='always'; the identity otherwise."""
    data = _need("Dropout", "data", data)
    if mode not in ("training", "always"):
        raise ArgumentError(f"Dropout: mode must be 'training' or 'always', found {mode!r}")
    if not 0 <= p < 1:
        raise ArgumentError(f"Dropout: p must be in [0, 1), found {p}")
    if axes:
        raise ArgumentError("Dropout: axes (variational dropout) is not supported; leave axes=()")
    return _C.dropout(data, float(p), mode == "always" or _C.is_training())


def _softmax_input(op, data, temperature, use_length, length):
    if use_length or length is not None:
        raise ArgumentError(f"{op}: use_length/length are not supported; mask the data instead")
    if temperature is not None and temperature != 1.0:
        if temperature <= 0:
            raise ArgumentError(f"{op}: temperature must be positive, found {temperature}")
        data = data / float(temperature)
    return data


@_op
def softmax(data, axis=-1, temperature=None, dtype=None, use_length=False, length=None):
    """exp(data / temperature) normalized along `axis`."""
    out = _C.softmax(_softmax_input("softmax", data, temperature, use_length, length), axis)
    return out if dtype is None else _C.cast(out, dtype)


@_op
def log_softmax(data, axis=-1, temperature=None, dtype=None, use_length=False, length=None):
    """log(softmax(data / temperature)) along `axis`."""
    out = _C.log_softmax(_softmax_input("log_softmax", data, temperature, use_length, length), axis)
    return out if dtype is None else _C.cast(out, dtype)


@_op
def SoftmaxActivation(data, mode="instance"):
    """softmax over the last axis ('instance') or over axis 1 ('channel')."""
    if mode not in ("instance", "channel"):
        raise ArgumentError(f"SoftmaxActivation: mode must be 'instance' or 'channel', found {mode!r}")
    return _C.softmax(_C.flatten(data) if mode == "instance" and data.ndim > 2 else data,
                      -1 if mode == "instance" else 1).reshape(tuple(data.shape))


@_op
def SoftmaxOutput(data, label, grad_scale=1.0, ignore_label=-1.0, multi_output=False, use_ignore=False,
                  preserve_shape=False, normalization="null", out_grad=False, smooth_alpha=0.0):
    """softmax(data) whose gradient is MXNet's (softmax(data) - one_hot(label)) * grad_scale / norm
    (norm: 1 for 'null', the batch size for 'batch', the count of non-ignored labels for 'valid'),
    zero for rows whose label is ignore_label when use_ignore, with smooth_alpha label smoothing.

    The value is softmax(data); the gradient runs through a cross-entropy term that adds zero to
    the value: out = stop_gradient(p) + h - stop_gradient(h), h = (ce * weight / C) repeated over
    the C classes. So out.backward() (a head gradient of ones) gives MXNet's gradient; another head
    gradient scales it by its mean over the classes (MXNet ignores the head gradient)."""
    op = "SoftmaxOutput"
    if normalization not in ("null", "batch", "valid"):
        raise ArgumentError(f"{op}: normalization must be 'null', 'batch' or 'valid', found {normalization!r}")
    if out_grad:
        raise ArgumentError(f"{op}: out_grad=True is not supported")
    shape = tuple(data.shape)
    if multi_output:  # (N, C, d...) with label (N, d...): softmax over axis 1
        if data.ndim < 3:
            raise ShapeError(f"{op}: multi_output needs data of 3+ dimensions (N, C, ...), found {shape}")
        perm = (0,) + tuple(range(2, data.ndim)) + (1,)
        x = data._transpose(perm)
        want = shape[:1] + shape[2:]
    elif preserve_shape:
        x, want = data, shape[:-1]
    else:
        x = data if data.ndim == 2 else data.reshape((shape[0], -1))
        want = shape[:1]
    c = x.shape[-1]
    if tuple(label.shape) != want and not (label.ndim == 1 and label.shape[0] == _prod(want)):
        raise ShapeError(f"{op}: label must have shape {want} for data {shape}, found {label.shape}")
    x2 = x.reshape((-1, c))
    lab = label.reshape((-1,))
    lab_i = lab if lab._dtype_name in ("int32", "int64") else _C.cast(_C.round(lab), "int64")
    on, off = (1.0 - smooth_alpha, smooth_alpha / (c - 1)) if smooth_alpha and c > 1 else (1.0, 0.0)
    if use_ignore:  # ignored rows pick class 0 (their loss is masked below); the others must be classes
        lab_i = lab_i * _C.cast(lab != float(ignore_label), lab_i._dtype_name)
    target = _C.one_hot(lab_i, c, on, off, x2._dtype_name, labels=True)
    p = _C.softmax(x2, -1)
    ce = -(target * _C.log_softmax(x2, -1)).sum(axis=-1)
    weight = float(grad_scale)
    if use_ignore:
        keep = _C.cast(lab != float(ignore_label), x2._dtype_name)
        ce = ce * keep
    if normalization == "batch":
        weight /= shape[0]
    elif normalization == "valid" and use_ignore:
        ce = ce / _C.maximum(_C.stop_gradient(keep.sum()), 1.0)
    elif normalization == "valid":
        weight /= lab.shape[0]
    h = _C.broadcast_to(_C.expand_dims(ce * (weight / c), -1), tuple(p.shape))
    out = _C.stop_gradient(p) + (h - _C.stop_gradient(h))
    out = out.reshape(tuple(x.shape))
    if multi_output:
        inv = [0] * data.ndim
        for i, a in enumerate(perm):
            inv[a] = i
        return out._transpose(tuple(inv))
    return out.reshape(shape)


def _prod(t):
    n = 1
    for d in t:
        n *= d
    return n


@_op
def dot(lhs, rhs, transpose_a=False, transpose_b=False, forward_stype=None):
    """MXNet's dot: the last axis of lhs against the first axis of rhs (for N-D arrays the result
    has shape lhs.shape[:-1] + rhs.shape[1:]); transpose_a/b reverse an operand's axes first."""
    if lhs.ndim <= 2 and rhs.ndim <= 2 and lhs.ndim and rhs.ndim and not (lhs.ndim == 1 and rhs.ndim == 1):
        a = lhs.reshape((1, -1)) if lhs.ndim == 1 else lhs
        b = rhs.reshape((-1, 1)) if rhs.ndim == 1 else rhs
        out = _C.matmul(a, b, transpose_a and lhs.ndim == 2, transpose_b and rhs.ndim == 2)
        shape = (tuple(out.shape[:1]) if lhs.ndim == 2 else ()) + (tuple(out.shape[1:]) if rhs.ndim == 2 else ())
        return out if shape == tuple(out.shape) else out.reshape(shape or (1,))
    a = lhs._transpose(None) if transpose_a else lhs
    b = rhs._transpose(None) if transpose_b else rhs
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"dot: the inputs must have at least 1 dimension, found {lhs.shape} and {rhs.shape}")
    k = a.shape[-1]
    if b.shape[0] != k:
        raise ShapeError(f"dot: the last axis of lhs ({a.shape}) must match the first axis of rhs ({b.shape})")
    out = _C.matmul(a.reshape((-1, k)), b.reshape((k, -1)))
    return out.reshape((tuple(a.shape[:-1]) + tuple(b.shape[1:])) or (1,))


@_op
def batch_dot(lhs, rhs, transpose_a=False, transpose_b=False, forward_stype=None):
    """Batched matrix product of 3-D (B, M, K) and (B, K, N) arrays: (B, M, N)."""
    if lhs.ndim != 3 or rhs.ndim != 3 or lhs.shape[0] != rhs.shape[0]:
        raise ShapeError(f"batch_dot: the inputs must be 3-D with the same batch size, found {lhs.shape} and "
                         f"{rhs.shape}")
    ka = lhs.shape[1] if transpose_a else lhs.shape[2]
    kb = rhs.shape[2] if transpose_b else rhs.shape[1]
    if ka != kb:
        raise ShapeError(f"batch_dot: inner sizes differ: {lhs.shape} (transpose_a={transpose_a}) and {rhs.shape} "
                         f"(transpose_b={transpose_b})")
    return _C.matmul(lhs, rhs, bool(transpose_a), bool(transpose_b))


@_op
def one_hot(indices, depth, on_value=1.0, off_value=0.0, dtype="float32"):
    """A `depth`-long vector per index (on_value at the index, off_value elsewhere; indices out of
    range give rows of off_value); float indices are taken as integers."""
    if depth is None or depth < 1:
        raise ArgumentError(f"one_hot: depth must be a positive int, found {depth!r}")
    idx = indices if indices._dtype_name in ("int32", "int64") else _C.cast(_C.round(indices), "int64")
    return _C.one_hot(idx, int(depth), float(on_value), float(off_value), dtype)


@_op
def Embedding(data=None, weight=None, input_dim=None, output_dim=None, dtype="float32", sparse_grad=False):
    """The rows of weight (input_dim, output_dim) at the indices `data`: shape data.shape + (output_dim,)."""
    op = "Embedding"
    data, weight = _need(op, "data", data), _need(op, "weight", weight)
    want = (_need(op, "input_dim", input_dim), _need(op, "output_dim", output_dim))
    if tuple(weight.shape) != want:
        raise ShapeError(f"{op}: weight must have shape {want} (input_dim, output_dim), found {weight.shape}")
    idx = data if data._dtype_name in ("int32", "int64") else _C.cast(_C.round(data), "int64")
    return _C.take(weight, idx, 0)


def _normalize(data, axes, eps):
    mu = data.mean(axis=axes, keepdims=True)
    centered = data - mu
    return centered * _C.rsqrt(_C.square(centered).mean(axis=axes, keepdims=True) + float(eps))


def _affine(op, y, gamma, beta, ax):
    shape = [1] * y.ndim
    shape[ax] = y.shape[ax]
    for n, p in (("gamma", gamma), ("beta", beta)):
        if tuple(p.shape) != (y.shape[ax],):
            raise ShapeError(f"{op}: {n} must have shape ({y.shape[ax]},) (axis {ax} of data {y.shape}), "
                             f"found {p.shape}")
    return y * gamma.reshape(tuple(shape)) + beta.reshape(tuple(shape))


@_op
def LayerNorm(data=None, gamma=None, beta=None, axis=-1, eps=1e-5, output_mean_var=False):
    """(data - mean) / sqrt(var + eps) * gamma + beta, the statistics over `axis` alone."""
    if output_mean_var:
        raise ArgumentError("LayerNorm: output_mean_var=True is not supported")
    data = _need("LayerNorm", "data", data)
    ax = _axis("LayerNorm", axis, data.ndim)
    return _affine("LayerNorm", _normalize(data, (ax,), eps), _need("LayerNorm", "gamma", gamma),
                   _need("LayerNorm", "beta", beta), ax)


@_op
def InstanceNorm(data=None, gamma=None, beta=None, eps=1e-3):
    """Normalization of each (sample, channel) over the remaining axes, then gamma and beta per channel."""
    data = _need("InstanceNorm", "data", data)
    if data.ndim < 3:
        raise ShapeError(f"InstanceNorm: data must have 3+ dimensions (N, C, ...), found {data.shape}")
    return _affine("InstanceNorm", _normalize(data, tuple(range(2, data.ndim)), eps),
                   _need("InstanceNorm", "gamma", gamma), _need("InstanceNorm", "beta", beta), 1)


@_op
def L2Normalization(data, eps=1e-10, mode="instance"):
    """data / sqrt(sum(data ** 2) + eps) over every axis but the first ('instance'), over axis 1
    ('channel') or over the axes after the first two ('spatial')."""
    axes = {"instance": tuple(range(1, data.ndim)), "channel": (1,), "spatial": tuple(range(2, data.ndim))}.get(mode)
    if axes is None:
        raise ArgumentError(f"L2Normalization: mode must be 'instance', 'channel' or 'spatial', found {mode!r}")
    return data * _C.rsqrt(_C.square(data).sum(axis=axes, keepdims=True) + float(eps))


@_op
def smooth_l1(data, scalar=1.0):
    """0.5 * (scalar * x) ** 2 where |x| < 1 / scalar ** 2, else |x| - 0.5 / scalar ** 2."""
    s2 = float(scalar) ** 2
    a = _C.abs(data)
    return _C.where(a < 1.0 / s2, _C.square(data) * (0.5 * s2), a - 0.5 / s2)


@_op
def gather_nd(data, indices):
    """data at the positions indices[:, ...] (the first axis of indices runs over data's first
    M axes): shape indices.shape[1:] + data.shape[M:]; differentiable w.r.t. data."""
    m = indices.shape[0] if indices.ndim else 0
    if indices.ndim < 1 or not 1 <= m <= data.ndim:
        raise ShapeError(f"gather_nd: indices must have a first axis of 1 to {data.ndim} (data {data.shape}), "
                         f"found shape {indices.shape}")
    lead = 1
    for d in data.shape[:m]:
        lead *= d
    linear, stride = None, 1
    idx = _C.cast(indices, "float64")
    for i in reversed(range(m)):
        term = idx[i] * float(stride)
        linear = term if linear is None else linear + term
        stride *= data.shape[i]
    flat = data.reshape((lead,) + tuple(data.shape[m:]))
    return _C.take(flat, _C.cast(_C.round(linear), "int64"), 0)


@_op
def UpSampling(data, scale=None, sample_type="nearest", num_args=1, num_filter=0, multi_input_mode="concat",
               workspace=512):
    """Nearest-neighbour upsampling of NCHW data by the integer `scale`."""
    if sample_type != "nearest":
        raise ArgumentError(f"UpSampling: sample_type must be 'nearest' (kiln has no bilinear upsampling), "
                            f"found {sample_type!r}")
    scale = _need("UpSampling", "scale", scale)
    _check_4d("UpSampling", data)
    return repeat(repeat(data, int(scale), axis=2), int(scale), axis=3)


@_op
def SequenceMask(data, sequence_length=None, use_sequence_length=False, value=0.0, axis=0):
    """data with the steps at or past each sequence's length set to `value`: axis 0 is time and
    axis 1 the batch (axis=0, data (T, B, ...)) or the other way round (axis=1, data (B, T, ...));
    sequence_length has one length per batch entry."""
    if not use_sequence_length:
        return data
    if axis not in (0, 1):
        raise ArgumentError(f"SequenceMask: axis must be 0 or 1 (the time axis), got {axis!r}")
    seq = _need("SequenceMask", "sequence_length", sequence_length)
    batch = data.shape[1 - axis]
    if tuple(seq.shape) != (batch,):
        raise ShapeError(f"SequenceMask: sequence_length must have shape ({batch},) (one per batch entry of "
                         f"{data.shape} with time on axis {axis}), found {seq.shape}")
    pos_shape, len_shape = [1] * data.ndim, [1] * data.ndim
    pos_shape[axis], len_shape[1 - axis] = data.shape[axis], batch
    pos = _C.arange(0, data.shape[axis], 1, "float32", data.device).reshape(tuple(pos_shape))
    keep = pos < _C.cast(seq, "float32").reshape(tuple(len_shape))
    return _C.where(keep, data, _C.full((1,), float(value), data._dtype_name, data.device))
