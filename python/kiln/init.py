"""kiln.init: parameter initializers, as mxnet.init (Uniform, Normal, Xavier, Zero, One, Constant).

An initializer fills an existing array in place: `init(name, arr)`. As in Gluon, the parameter's
name picks the rule: names ending in 'bias', 'beta' or 'running_mean' get zeros, 'gamma' and
'running_var' get ones, and every other name ('weight' and user-chosen names alike) gets the
initializer's own weight rule. Random draws use kiln.nd.random, so kiln.nd.random.seed(s) makes
them reproducible. Not here: MXNet's Mixed, Load, Orthogonal, Bilinear, LSTMBias initializers.
"""
import math

from . import nd
from ._C import ArgumentError, ShapeError

__all__ = ["Initializer", "Uniform", "Normal", "Xavier", "Zero", "One", "Constant", "create"]

_ZERO_SUFFIXES = ("bias", "beta", "running_mean", "moving_mean")
_ONE_SUFFIXES = ("gamma", "running_var", "moving_var")


def _fill(arr, src):
    """Writes `src` into `arr` in place (casting to arr's dtype), outside any autograd recording."""
    from . import autograd
    if src._dtype_name != arr._dtype_name:
        src = src.astype(arr._dtype_name)
    if src.device != arr.device:
        src = src.to_device(arr.device)
    with autograd.pause():
        src.copyto(arr)


def _draw_dtype(arr):
    # Random ops draw in float32 or float64; narrower types are cast after the draw.
    return "float64" if arr._dtype_name == "float64" else "float32"


class Initializer:
    """Base class: subclasses override _init_weight(name, arr) (and optionally _init_bias...)."""

    def __call__(self, name, arr):
        name = str(name)
        if name.endswith(_ZERO_SUFFIXES):
            self._init_zero(name, arr)
        elif name.endswith(_ONE_SUFFIXES):
            self._init_one(name, arr)
        else:
            self._init_weight(name, arr)

    def _init_weight(self, name, arr):
        raise NotImplementedError(f"{type(self).__name__} must implement _init_weight(name, arr)")

    def _init_zero(self, name, arr):
        _fill(arr, nd.zeros(arr.shape, arr._dtype_name, arr.device))

    def _init_one(self, name, arr):
        _fill(arr, nd.ones(arr.shape, arr._dtype_name, arr.device))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Zero(Initializer):
    """Every element 0, whatever the parameter's name."""

    def __call__(self, name, arr):
        self._init_zero(name, arr)


class One(Initializer):
    """Every element 1, whatever the parameter's name."""

    def __call__(self, name, arr):
        self._init_one(name, arr)


class Constant(Initializer):
    """Every element `value`, whatever the parameter's name."""

    def __init__(self, value):
        self.value = value

    def __call__(self, name, arr):
        _fill(arr, nd.full(arr.shape, float(self.value), arr._dtype_name, arr.device))


class Uniform(Initializer):
    """Weights drawn from U(-scale, scale)."""

    def __init__(self, scale=0.07):
        self.scale = scale

    def _init_weight(self, name, arr):
        _fill(arr, nd.random.uniform(-self.scale, self.scale, shape=arr.shape,
                                     dtype=_draw_dtype(arr), device=arr.device))


class Normal(Initializer):
    """Weights drawn from N(0, sigma^2)."""

    def __init__(self, sigma=0.01):
        self.sigma = sigma

    def _init_weight(self, name, arr):
        _fill(arr, nd.random.normal(0.0, self.sigma, shape=arr.shape,
                                    dtype=_draw_dtype(arr), device=arr.device))


class Xavier(Initializer):
    """Glorot initialization: scale = sqrt(magnitude / factor), factor from the fans.

    fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive field; factor_type picks
    'avg' ((fan_in + fan_out) / 2), 'in' or 'out'. rnd_type 'uniform' draws U(-scale, scale),
    'gaussian' draws N(0, scale^2).
    """

    def __init__(self, rnd_type="uniform", factor_type="avg", magnitude=3):
        if rnd_type not in ("uniform", "gaussian"):
            raise ArgumentError(f"Xavier: rnd_type must be 'uniform' or 'gaussian', got {rnd_type!r}")
        if factor_type not in ("avg", "in", "out"):
            raise ArgumentError(f"Xavier: factor_type must be 'avg', 'in' or 'out', got {factor_type!r}")
        self.rnd_type = rnd_type
        self.factor_type = factor_type
        self.magnitude = float(magnitude)

    def _init_weight(self, name, arr):
        shape = arr.shape
        if len(shape) < 2:
            raise ShapeError(f"Xavier initializer needs a weight of at least 2 dimensions, got "
                             f"'{name}' with shape {shape}; use Uniform or Normal for 1-D parameters")
        receptive = math.prod(shape[2:])
        fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[self.factor_type]
        scale = math.sqrt(self.magnitude / factor)
        if self.rnd_type == "uniform":
            src = nd.random.uniform(-scale, scale, shape=shape, dtype=_draw_dtype(arr), device=arr.device)
        else:
            src = nd.random.normal(0.0, scale, shape=shape, dtype=_draw_dtype(arr), device=arr.device)
        _fill(arr, src)


_BY_NAME = {"zeros": Zero, "zero": Zero, "ones": One, "one": One, "uniform": Uniform,
            "normal": Normal, "xavier": Xavier}


def create(init):
    """An Initializer from an instance, a name ('zeros', 'ones', 'uniform', 'normal', 'xavier'),
    an Initializer class, or a number (a Constant)."""
    if isinstance(init, Initializer):
        return init
    if isinstance(init, type) and issubclass(init, Initializer):
        return init()
    if isinstance(init, str):
        cls = _BY_NAME.get(init.lower())
        if cls is None:
            raise ArgumentError(f"unknown initializer {init!r}; expected one of {sorted(_BY_NAME)} "
                                f"or a kiln.init.Initializer")
        return cls()
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return Constant(init)
    raise ArgumentError(f"expected a kiln.init.Initializer or its name, got {type(init).__name__}")
