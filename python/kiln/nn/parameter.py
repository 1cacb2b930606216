"""Parameter and ParameterDict, as mxnet.gluon: the contract Trainer and optimizers code against.

A Parameter holds one copy of its data per device (data parallelism, as Gluon); the gradient of
each copy is that array's `.grad` after attach_grad(grad_req). A shape may contain 0 for a
dimension not known yet: initialize() then records the request and the first forward pass
completes the shape and runs it (deferred initialization). A Parameter's name is its local name
('weight'); Blocks list it under its structural name ('features.1.weight'), not under Gluon 1.x's
global names ('dense0_weight'). Reading data(ctx) on a device it does not live on raises
StateError, a RuntimeError as in MXNet. Not here: sparse storage types, sharing by `params=`.
"""
import itertools
import re
import warnings

import numpy as np

from .. import autograd, nd
from .. import init as _init
from .._C import ArgumentError, Device, ShapeError, StateError
from ..context import current_context

__all__ = ["Parameter", "ParameterDict", "DeferredInitializationError"]

_GRAD_REQS = ("write", "add", "null")



# Changed whenever a Parameter's arrays are replaced (not refilled): cached compiled graphs read
# the arrays they captured, so a HybridBlock drops its cache when this changes. A fresh number from
# a counter, not `+= 1`: two threads replacing arrays at once must not both write the same value.
_generations = itertools.count(1)
_generation = 0

class DeferredInitializationError(StateError):
    """A parameter's data was asked for before the forward pass that completes its shape."""


def _dtype_name(dtype):
    if dtype is None:
        return "float32"
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    return np.dtype(dtype).name


def _dtype_object(name):
    return name if name == "bfloat16" else np.dtype(name)


def _devices(device=None, ctx=None):
    """A list of devices from a Device, a list of them, or None (the current context: cpu(0)
    outside a `with device:` block)."""
    device = device if device is not None else ctx
    if device is None:
        return [current_context()]
    if isinstance(device, Device):
        return [device]
    devices = list(device)
    if not devices or not all(isinstance(d, Device) for d in devices):
        raise ArgumentError(f"device must be a kiln.Device or a non-empty list of them, got {device!r}")
    return devices


def _shape_known(shape):
    return shape is not None and all(d > 0 for d in shape)


class Parameter:
    """A named tensor of a Block: data (one copy per device), gradients and training settings.

    name: a short local name ('weight'); the structural name ('features.1.weight') is the key
    under which Block.collect_params() lists it.
    """

    def __init__(self, name="weight", grad_req="write", shape=None, dtype="float32", lr_mult=1.0,
                 wd_mult=1.0, init=None, allow_deferred_init=False, differentiable=True, stype="default",
                 grad_stype="default"):
        if stype != "default" or grad_stype != "default":
            raise ArgumentError(f"Parameter '{name}': only dense storage (stype='default') exists in "
                                f"kiln, got stype={stype!r}, grad_stype={grad_stype!r}")
        self.name = str(name)
        self._shape = None if shape is None else tuple(int(d) for d in (
            (shape,) if isinstance(shape, int) else shape))
        self._dtype = _dtype_name(dtype)
        self.lr_mult = lr_mult
        self.wd_mult = wd_mult
        self.init = init
        self._allow_deferred_init = allow_deferred_init
        self._differentiable = differentiable
        self._data = None            # list of NDArray, one per device, once initialized
        self._deferred = None        # (initializer, devices) waiting for the shape
        self._grad_req = None
        self.grad_req = grad_req

    def __repr__(self):
        return f"Parameter {self.name} (shape={self.shape}, dtype={self.dtype})"

    # -- attributes -------------------------------------------------------------------------------

    @property
    def shape(self):
        return self._shape

    @shape.setter
    def shape(self, new_shape):
        new_shape = tuple(int(d) for d in new_shape)
        if self._shape is not None:
            compatible = len(new_shape) == len(self._shape) and all(
                old in (0, new) for old, new in zip(self._shape, new_shape))
            if not compatible:
                raise ShapeError(f"Parameter '{self.name}': cannot change shape {self._shape} to "
                                 f"{new_shape}; only unknown (0) dimensions can be filled in")
        self._shape = new_shape

    @property
    def dtype(self):
        """The element type as a NumPy dtype ('bfloat16' for bfloat16), as NDArray.dtype."""
        return _dtype_object(self._dtype)

    @property
    def grad_req(self):
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req):
        if req not in _GRAD_REQS:
            raise ArgumentError(f"Parameter '{self.name}': grad_req must be one of {_GRAD_REQS}, got {req!r}")
        if not self._differentiable:
            req = "null"
        self._grad_req = req
        if self._data is not None:
            for arr in self._data:
                arr.attach_grad(req)

    # -- initialization ---------------------------------------------------------------------------

    def initialize(self, init=None, device=None, force_reinit=False, default_init=None, ctx=None):
        """Allocates the data on each device and fills it.

        The parameter's own `init` wins over `init`, which wins over `default_init` (Uniform()).
        With an unknown (0) dimension the work waits for the first forward pass.
        """
        if self._data is not None and not force_reinit:
            warnings.warn(f"Parameter '{self.name}' is already initialized; ignoring. "
                          f"Pass force_reinit=True to initialize it again.", stacklevel=2)
            return
        devices = _devices(device, ctx)
        chosen = self.init if self.init is not None else init
        if chosen is None:
            chosen = default_init if default_init is not None else _init.Uniform()
        if not _shape_known(self._shape) and not self._allow_deferred_init:
            raise ShapeError(f"cannot initialize Parameter '{self.name}': its shape {self._shape} "
                             f"is not fully known; give the shape (e.g. in_units=/in_channels=) "
                             f"or create it with allow_deferred_init=True")
        self._deferred = (_init.create(chosen), devices)
        if not _shape_known(self._shape):
            self._data = None
            return
        self._finish_deferred_init()

    def _finish_deferred_init(self):
        from .. import _C
        if _C.tracing():
            # A hybridized block's first call completes the shape while it traces: the arrays are
            # made with data (the trace paused), and the graph captures them as it reads them.
            with _C.TracePause():
                return self._finish_deferred_init()
        initializer, devices = self._deferred
        self._deferred = None
        if self._data is not None and self.list_device() == devices:
            # Re-initialization fills the arrays in place, so holders of data() (a Trainer) see it.
            initializer(self.name, self._data[0])
            for arr in self._data[1:]:
                _init._fill(arr, self._data[0])
            return
        first = nd.zeros(self._shape, self._dtype, devices[0])
        initializer(self.name, first)
        self._set_copies([first] + [first.to_device(d) for d in devices[1:]])

    def _set_copies(self, arrays):
        global _generation
        for arr in arrays:
            arr.attach_grad(self._grad_req)
        self._data = arrays
        _generation = next(_generations)  # compiled graphs captured the old arrays: HybridBlock retraces

    def _infer_shape(self, shape):
        """Fills the unknown dimensions from the first input and runs a pending initialization."""
        self.shape = shape
        if self._data is None and self._deferred is not None:
            self._finish_deferred_init()

    # -- data and gradients -----------------------------------------------------------------------

    def _check_initialized(self):
        if self._data is not None:
            return
        if self._deferred is not None:
            raise DeferredInitializationError(
                f"Parameter '{self.name}' has not been initialized yet: its shape {self._shape} is "
                f"completed by the first forward pass. Run one batch through the network before "
                f"reading the parameter, or give the input size (in_units=/in_channels=)")
        raise StateError(f"Parameter '{self.name}' has not been initialized: call initialize() on it "
                         f"or on its Block (net.initialize()) first")

    def _copy_on(self, arrays, device):
        if device is None:
            if len(arrays) == 1:
                return arrays[0]
            device = current_context()  # as Gluon: with several copies, None means the current context
        for arr in arrays:
            if arr.device == device:
                return arr
        raise StateError(f"Parameter '{self.name}' was not initialized on {device}; it lives on "
                         f"{self.list_device()}. Name one of those (data(ctx)), initialize it there "
                         f"(net.initialize(ctx=[..., {device}])) or move the input (x.as_in_context(...))")

    def data(self, device=None, ctx=None):
        """The copy on `device`. None means the only copy, or with copies on several devices the
        one on the current context (cpu(0) outside `with device:`), as Gluon: a StateError (a
        RuntimeError) when there is none."""
        self._check_initialized()
        return self._copy_on(self._data, device if device is not None else ctx)

    def list_data(self):
        self._check_initialized()
        return list(self._data)

    def grad(self, device=None, ctx=None):
        """The gradient of the copy on `device` (None: as data())."""
        return self._copy_on(self.list_grad(), device if device is not None else ctx)

    def list_grad(self):
        self._check_initialized()
        if self._grad_req == "null":
            raise StateError(f"Parameter '{self.name}' has no gradient because grad_req='null'; set "
                             f"grad_req='write' (or 'add') to compute one")
        return [arr.grad for arr in self._data]

    def list_device(self):
        if self._data is not None:
            return [arr.device for arr in self._data]
        if self._deferred is not None:
            return list(self._deferred[1])
        raise StateError(f"Parameter '{self.name}' has not been initialized: call initialize() first")

    list_ctx = list_device

    def set_data(self, data):
        """Copies `data` into every device's copy (setting the shape if it was still unknown)."""
        src = data if isinstance(data, nd.NDArray) else nd.array(np.asarray(data), dtype=self._dtype)
        if self._data is None:
            self.shape = src.shape
            devices = self._deferred[1] if self._deferred is not None else [current_context()]
            self._deferred = None
            self._set_copies([nd.zeros(src.shape, self._dtype, d) for d in devices])
        if src.shape != self._shape:
            raise ShapeError(f"Parameter '{self.name}'.set_data: expected shape {self._shape}, "
                             f"got {src.shape}")
        for arr in self._data:
            _init._fill(arr, src)

    def _load_init(self, arr, devices=None):
        """Takes loaded values, on `devices` when given (else where the data lives already)."""
        if devices is not None and (self._data is None or self.list_device() != devices):
            self.shape = arr.shape
            self._deferred = None
            self._set_copies([nd.zeros(arr.shape, self._dtype, d) for d in devices])
        self.set_data(arr)

    def zero_grad(self):
        """Sets every gradient to zero (a no-op for grad_req='null' or before initialization)."""
        if self._data is None or self._grad_req == "null":
            return
        with autograd.pause():
            for g in self.list_grad():
                nd.zeros(g.shape, g._dtype_name, g.device).copyto(g)

    def reset_device(self, device):
        """Moves the data to other devices, keeping its values."""
        devices = _devices(device)
        if self._data is None:
            if self._deferred is not None:
                self._deferred = (self._deferred[0], devices)
            return
        first = self._data[0]
        self._set_copies([first.to_device(d) if first.device != d else first for d in devices])

    reset_ctx = reset_device

    def cast(self, dtype):
        """Changes the element type, converting the data if there is any."""
        self._dtype = _dtype_name(dtype)
        if self._data is not None:
            self._set_copies([arr.astype(self._dtype) for arr in self._data])

    def _reduce(self):
        """One array for saving: the mean over devices (they differ only in local statistics)."""
        arrays = self.list_data()
        if len(arrays) == 1 or self._dtype not in ("float32", "float64", "float16", "bfloat16"):
            return arrays[0]
        total = arrays[0]
        for arr in arrays[1:]:
            total = total + arr.to_device(arrays[0].device)
        return total / len(arrays)


class ParameterDict(dict):
    """An ordered name -> Parameter mapping (what Block.collect_params and Block.params return).

    As Gluon 1.x, ParameterDict(prefix='', shared=None) also makes parameters: get(name, **kwargs)
    returns the entry `prefix + name`, or the one entry whose structural name ends with '.name'
    ('weight' finds '0.weight' when no other name ends so), or the one `shared` has, and else
    creates Parameter(prefix + name, **kwargs) and adds it (to its Block too when the dict is a
    Block's `params`).
    """

    def __init__(self, prefix="", shared=None):
        if not isinstance(prefix, str):  # ParameterDict(mapping or pairs), as dict
            super().__init__(prefix)
            prefix = ""
        else:
            super().__init__()
        self._prefix = prefix
        self._shared = shared
        self._owner = None  # the Block whose `params` this is: get() registers new parameters on it

    @property
    def prefix(self):
        return self._prefix

    def _find(self, name):
        full = self._prefix + name
        if full in self:
            return self[full]
        matches = [k for k in self if k.endswith("." + name)]
        if len(matches) > 1:
            raise ArgumentError(f"ParameterDict.get('{name}'): {len(matches)} parameters end with it "
                                f"({matches}); use the full name")
        if matches:
            return self[matches[0]]
        if self._shared is not None:
            return self._shared._find(name) if isinstance(self._shared, ParameterDict) else self._shared.get(full)
        return None

    def get(self, name, **kwargs):
        """The parameter called `name` (see the class), created with `kwargs` if there is none.

        kwargs given for an existing parameter must agree with it; an unknown (0) dimension of its
        shape is filled in from `shape`."""
        param = self._find(str(name))
        if param is None:
            param = Parameter(self._prefix + str(name), **kwargs)
            self[self._prefix + str(name)] = param
            if self._owner is not None:
                self._owner._reg_params.setdefault(self._prefix + str(name), param)
            return param
        for key, value in kwargs.items():
            if key == "shape":
                if value is not None:
                    param.shape = (value,) if isinstance(value, int) else value
            elif key == "dtype":
                if _dtype_name(value) != param._dtype:
                    raise ArgumentError(f"ParameterDict.get('{name}'): dtype {_dtype_name(value)} does not "
                                        f"match the existing parameter's {param._dtype}")
            elif not hasattr(param, key):
                raise TypeError(f"ParameterDict.get('{name}'): Parameter has no attribute '{key}'")
            elif getattr(param, key) != value and value is not None:
                raise ArgumentError(f"ParameterDict.get('{name}'): {key}={value!r} does not match the "
                                    f"existing parameter's {key}={getattr(param, key)!r}")
        return param

    def initialize(self, init=None, device=None, ctx=None, force_reinit=False, verbose=False):
        """Initializes every parameter: its own initializer if it has one, else `init`
        (kiln.init.Uniform() when None), on `device`/`ctx`: one device or a list of them."""
        default = _init.Uniform() if init is None else init
        for param in self.values():
            param.initialize(None, device, force_reinit=force_reinit, default_init=default, ctx=ctx)

    def list_ctx(self):
        """The devices the parameters live on (each once, in order of first appearance)."""
        devices = []
        for param in self.values():
            for d in param.list_device():
                if d not in devices:
                    devices.append(d)
        return devices

    list_device = list_ctx

    def zero_grad(self):
        for param in self.values():
            param.zero_grad()

    def setattr(self, name, value):
        """Sets an attribute (e.g. 'grad_req', 'lr_mult') on every parameter."""
        for param in self.values():
            setattr(param, name, value)

    def reset_device(self, device):
        for param in self.values():
            param.reset_device(device)

    reset_ctx = reset_device

    def select(self, pattern):
        """The entries whose name matches the regular expression (re.match, as Gluon)."""
        regex = re.compile(pattern)
        return ParameterDict({k: v for k, v in self.items() if regex.match(k)})

    def __repr__(self):
        body = "\n".join(f"  {k}: {v!r}" for k, v in self.items())
        return f"ParameterDict(\n{body}\n)" if body else "ParameterDict()"
