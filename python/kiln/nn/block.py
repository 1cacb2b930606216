"""Block, HybridBlock, Sequential and HybridSequential, as mxnet.gluon (without name scopes).

A Block registers every attribute that is a Parameter or a Block, in assignment order; its
parameters are listed under structural names ('features.1.weight', as PyTorch's state_dict).
HybridBlock.hybridize() only records the flag for now: forward always runs eagerly. Not here:
forward hooks, export(), parameter sharing across Blocks by name.
"""
import os

from .._C import ArgumentError, FormatError, StateError
from .. import init as _init
from .parameter import Parameter, ParameterDict, _devices
from . import serialization

__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential"]


class Block:
    """Base class of layers and models: override forward(); call the block to run it."""

    def __init__(self):
        object.__setattr__(self, "_reg_params", {})
        object.__setattr__(self, "_children", {})

    def __setattr__(self, name, value):
        if "_children" not in self.__dict__:
            raise StateError(f"{type(self).__name__}: assigning '{name}' before Block.__init__() ran; "
                             f"call super().__init__() first in __init__")
        self._reg_params.pop(name, None)
        self._children.pop(name, None)
        if isinstance(value, Parameter):
            self._reg_params[name] = value
        elif isinstance(value, Block):
            self._children[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._reg_params.pop(name, None)
        self._children.pop(name, None)
        object.__delattr__(self, name)

    def register_child(self, block, name=None):
        """Registers a child Block under `name` (its index among the children when None)."""
        name = str(len(self._children)) if name is None else name
        self._children[name] = block
        return block

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __repr__(self):
        if not self._children:
            return f"{type(self).__name__}()"
        body = "\n".join(f"  ({k}): " + repr(v).replace("\n", "\n  ") for k, v in self._children.items())
        return f"{type(self).__name__}(\n{body}\n)"

    # -- parameters -------------------------------------------------------------------------------

    def _collect(self, prefix, out, seen):
        for key, param in self._reg_params.items():
            if id(param) not in seen:  # a shared Parameter is listed once, under its first name
                seen.add(id(param))
                out[prefix + key] = param
        for key, child in self._children.items():
            child._collect(prefix + key + ".", out, seen)

    def collect_params(self, select=None):
        """This block's and its children's parameters by structural name, optionally those whose
        name matches the regular expression `select` (re.match, e.g. '.*weight|.*bias')."""
        params = ParameterDict()
        self._collect("", params, set())
        return params if select is None else params.select(select)

    @property
    def params(self):
        """This block's own parameters (not its children's; use collect_params for those)."""
        return ParameterDict(self._reg_params)

    def initialize(self, init=None, device=None, ctx=None, force_reinit=False, verbose=False):
        """Initializes every parameter: its own initializer if it has one, else `init`
        (default kiln.init.Uniform()). `device` may be a list for data parallelism."""
        self.collect_params().initialize(_init.Uniform() if init is None else init, device, ctx,
                                         force_reinit, verbose)

    def zero_grad(self):
        self.collect_params().zero_grad()

    def reset_device(self, device):
        self.collect_params().reset_device(device)

    reset_ctx = reset_device

    def cast(self, dtype):
        for param in self.collect_params().values():
            param.cast(dtype)

    def apply(self, fn):
        """Calls fn(block) on every child (recursively) and then on this block."""
        for child in self._children.values():
            child.apply(fn)
        fn(self)
        return self

    def hybridize(self, active=True, **kwargs):
        for child in self._children.values():
            child.hybridize(active, **kwargs)

    # -- saving and loading -----------------------------------------------------------------------

    def save_parameters(self, path, deduplicate=False):
        """Writes every parameter to `path` (safetensors layout), atomically."""
        arrays = {name: param._reduce() for name, param in self.collect_params().items()}
        serialization.save_arrays(os.fspath(path), arrays, {"format": "kiln"})

    def load_parameters(self, path, device=None, allow_missing=False, ignore_extra=False,
                        cast_dtype=False, dtype_source="current", ctx=None):
        """Loads parameters saved by save_parameters. Everything is checked before any parameter
        changes, so a failed load leaves the network as it was."""
        path = os.fspath(path)
        arrays, _ = serialization.load_arrays(path)
        params = self.collect_params()
        missing = [n for n in params if n not in arrays]
        extra = [n for n in arrays if n not in params]
        if missing and not allow_missing:
            raise FormatError(f"load_parameters('{path}'): expected parameter(s) {missing} of "
                              f"{type(self).__name__}, not found in the file (it holds "
                              f"{sorted(arrays)}); pass allow_missing=True to keep their current "
                              f"values, or load a file saved from this network")
        if extra and not ignore_extra:
            raise FormatError(f"load_parameters('{path}'): the file holds parameter(s) {extra} that "
                              f"{type(self).__name__} does not have (it has {list(params)}); pass "
                              f"ignore_extra=True to skip them, or load into the matching network")
        for name, arr in arrays.items():
            if name not in params:
                continue
            param = params[name]
            known = param.shape is not None and len(param.shape) == len(arr.shape) and all(
                d in (0, a) for d, a in zip(param.shape, arr.shape))
            if param.shape is not None and not known:
                raise FormatError(f"load_parameters('{path}'): parameter '{name}' has shape "
                                  f"{param.shape} in the network but {arr.shape} in the file; build "
                                  f"the network with the sizes it was saved with")
            if arr._dtype_name != param._dtype and not cast_dtype:
                raise FormatError(f"load_parameters('{path}'): parameter '{name}' is {param._dtype} "
                                  f"in the network but {arr._dtype_name} in the file; pass "
                                  f"cast_dtype=True to convert it")
        for name, arr in arrays.items():
            if name not in params:
                continue
            param = params[name]
            if cast_dtype and dtype_source == "saved":
                param.cast(arr._dtype_name)
            devices = None if device is None and ctx is None else _devices(device, ctx)
            param._load_init(arr, devices)


class HybridBlock(Block):
    """A Block that may be compiled: hybridize() records the request; forward runs eagerly.

    A subclass may define forward(x, ...) or, in the Gluon 1.x style, hybrid_forward(F, x, ...,
    **params), which receives kiln.nd as F and the block's own parameters as arrays.
    """

    def __init__(self):
        super().__init__()
        self._active = False
        self._flags = {}

    def hybridize(self, active=True, **kwargs):
        self._active = active
        self._flags = dict(kwargs)
        super().hybridize(active, **kwargs)

    def forward(self, x, *args):
        if type(self).hybrid_forward is HybridBlock.hybrid_forward:
            raise NotImplementedError(f"{type(self).__name__} must implement forward() or hybrid_forward()")
        from .. import nd
        params = {k: p.data(x.device) for k, p in self._reg_params.items()}
        return self.hybrid_forward(nd, x, *args, **params)

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError


class _SequentialMixin:
    def add(self, *blocks):
        """Appends blocks; they run in the order added."""
        for block in blocks:
            if not isinstance(block, Block):
                raise ArgumentError(f"{type(self).__name__}.add expects Blocks, got {type(block).__name__}")
            self.register_child(block)
        return self

    def forward(self, x, *args):
        for block in self._children.values():
            x = block(x, *args)
            args = ()
            if isinstance(x, (tuple, list)):
                x, args = x[0], tuple(x[1:])
        return x if not args else (x,) + args

    def __getitem__(self, key):
        blocks = list(self._children.values())
        if isinstance(key, slice):
            return type(self)().add(*blocks[key])
        return blocks[key]

    def __len__(self):
        return len(self._children)


class Sequential(_SequentialMixin, Block):
    """Stacks Blocks: the output of each is the input of the next."""


class HybridSequential(_SequentialMixin, HybridBlock):
    """Stacks HybridBlocks: the output of each is the input of the next."""
