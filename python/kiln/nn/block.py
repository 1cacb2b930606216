"""Block, HybridBlock, Sequential and HybridSequential, as mxnet.gluon (without name scopes).

A Block registers every attribute that is a Parameter or a Block, in assignment order; its
parameters are listed under structural names ('features.1.weight', as PyTorch's state_dict).
HybridBlock.hybridize() compiles: see HybridBlock; HybridBlock.export() writes the last traced
graph and its parameters (DESIGN.md section 7), which nn.SymbolBlock.imports() loads back. Not
here yet: forward hooks, parameter sharing across Blocks by name.
"""
import collections
import contextlib
import json
import os

from .._C import ArgumentError, FormatError, NDArray as _NDArray, SignatureCache as _SignatureCache, StateError
from .._C import is_recording as _is_recording, is_training as _is_training, tracing as _tracing
from .. import init as _init
from ._structure import _captured_names, _data_input_names, _flatten, _param_order, _structure_indices, _unflatten
from .parameter import Parameter, ParameterDict, _devices
from . import parameter as _parameter
from . import serialization

__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential"]



class Block:
    """Base class of layers and models: override forward(); call the block to run it."""

    def __init__(self, prefix=None, params=None):
        # prefix is accepted for Gluon 1.x code and unused (kiln names parameters by structure);
        # params: a ParameterDict whose parameters self.params.get() returns before making new ones.
        object.__setattr__(self, "_reg_params", {})
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_shared_params", params)

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
        """This block's own parameters (not its children's; use collect_params for those), as
        Gluon 1.x's. `self.params.get('weight', shape=(2, 3))` in __init__ returns the parameter
        named so and else creates it on this block (Gluon 1.x's way to declare one)."""
        params = ParameterDict(shared=self.__dict__.get("_shared_params"))
        params.update(self._reg_params)
        params._owner = self
        return params

    def name_scope(self):
        """Gluon 1.x's naming scope: a no-op context (kiln names parameters by structure)."""
        return contextlib.nullcontext(self)

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


# The params-file metadata key listing the tensors exported with grad_req 'null' (a JSON list).
FROZEN_KEY = "kiln.grad_req_null"


# A data input of a trace given by its type alone (export re-traces from these, with no data).
_Spec = collections.namedtuple("_Spec", ["shape", "dtype", "device"])
# What one trace produced: the graph, how to rebuild the outputs, the data input names, whether it
# ran in training mode, and its arguments as _Specs (and the non-array arguments as given).
_Traced = collections.namedtuple("_Traced", ["graph", "structure", "input_names", "training", "specs"])


class _ReportText(str):
    """The compile report's text; shown as text, not as a quoted string, at the interactive prompt."""

    def __repr__(self):
        return str(self)


def _user_frame(tb):
    """The innermost traceback frame outside the kiln package: the user's line."""
    import traceback
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(tb) if not os.path.abspath(f.filename).startswith(pkg)]
    return frames[-1] if frames else None


# How many batch sizes a hybridized block traces quietly for the same inputs on the same devices:
# a training batch, a data loader's smaller last batch, the same two for evaluation on the test set,
# and on the training set.
_QUIET_BATCH_SIZES = 6


def _sig_devices(key):
    """The devices of a signature's array arguments (one graph per device is expected)."""
    return tuple(a[2] for a in key[2:] if a[0] != "const")


def _sig_layout(key):
    """A signature without its batch dimension (each array's first) and mode: what a data loader
    keeps fixed from batch to batch."""
    return tuple(a if a[0] == "const" else (len(a[0]), tuple(a[0][1:]), a[1], a[2]) for a in key[2:])


def _sig_batch(key):
    """The batch dimension of each array argument of a signature (None for a 0-d array or a constant)."""
    return tuple(a[0][0] if a[0] != "const" and len(a[0]) else None for a in key[2:])


class HybridBlock(Block):
    """A Block that may be compiled.

    After hybridize(), the next call traces: forward() (or hybrid_forward(F, x, ...), with F =
    kiln.sym while tracing and kiln.nd otherwise) runs once on symbolic arrays that carry shape,
    dtype and device but no data, and every op is recorded into a graph. Later calls with the
    same input signature (shapes, dtypes, devices, training mode) run the compiled graph as one
    engine task, with no Python per op; a new signature traces again: quietly for another device,
    mode or batch size (up to a few: a data loader's smaller last batch is normal), with a warning,
    once, for any other change or for many batch sizes (each costs a compilation). The compiled
    graphs are kept in a bounded cache (_C.SignatureCache, KILN_GRAPH_CACHE_SIZE, default 64):
    beyond it the least recently used signature is dropped, and traced again if it comes back.
    Parameters are graph inputs, so training updates reach the compiled graph, and under
    autograd.record() gradients flow through it to the parameters as in eager mode.

    hybridize(freeze=True) is for inference, as torch.jit.freeze: in calls outside training and
    autograd.record(), the parameters become constants of the compiled graph, and everything
    computed from parameters alone (w * 2, w.T, a weight's normalization) is computed once, when
    the graph is compiled. The graph holds a snapshot: parameter updates after a graph was compiled
    (trainer.step(), set_data, load_parameters) do not reach it; call hybridize(freeze=True) again
    to compile with the new values. Each input signature is compiled, and so frozen, at its first
    call. Training calls run the unfrozen graph (with a warning, once), so gradients still reach
    the parameters. compile_report() says what was frozen and folded.

    export() writes the last graph traced in inference mode (tracing it again in inference mode
    when the last trace was a training one) as NAME-symbol.json and NAME-0000.params; for a
    frozen block, that graph is the frozen one, whose constants are saved as 'const0', 'const1'...
    """

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix, params)
        self._active = False
        self._freeze = False
        self._flags = {}
        self._cache = _SignatureCache()
        self._last_trace = self._last_inference_trace = None
        self._last_used_graph = None

    def hybridize(self, active=True, freeze=False, **kwargs):
        """Compiles the next call (see HybridBlock); freeze=True also makes the parameters
        constants of the graphs inference calls compile from now on, with the values they have then."""
        self._active = active
        self._freeze = bool(freeze)
        self._flags = dict(kwargs)
        self._cache = _SignatureCache()
        self._retrace_reported = self._freeze_reported = False
        self._batch_sizes = {}
        self._last_trace = self._last_inference_trace = None
        self._last_used_graph = None
        super().hybridize(active, freeze=freeze, **kwargs)

    def _freezing(self, stacklevel=4):
        """Whether this call runs a frozen graph: hybridize(freeze=True), and an inference call.
        `stacklevel`: the warning's, pointing at the user's call (from __call__ itself: 3)."""
        if not self._freeze:
            return False
        if _is_training() or _is_recording():
            if not getattr(self, "_freeze_reported", False):
                self._freeze_reported = True  # once per hybridize(): the reason, not a stream of warnings
                import warnings
                warnings.warn(f"{type(self).__name__}: hybridize(freeze=True) applies to inference calls "
                              f"only; this call is in training mode or under autograd.record(), so it runs "
                              f"the unfrozen graph, whose gradients reach the parameters", stacklevel=stacklevel)
            return False
        return True

    def compile_report(self, as_dict=False):
        """What compiling this block did, for the compiled graph its last call ran: per plan
        (forward; backward and the training pair once built) the passes and what each changed,
        the fused groups by the ops they came from, kernels and bytes moved before and after
        fusion, the planned arena (peak) against the intermediates unshared, compile time and
        codegen cache hits. The text KILN_REPORT=1 prints; as_dict=True gives the fields."""
        graph = self._last_used_graph
        if graph is None:
            if not self._active:
                what = "it is not hybridized: call hybridize(), run a batch through it (net(x)), then ask again"
            else:
                what = ("it has not run compiled yet: run a batch through it (net(x)), then ask again (a block "
                        "inside a hybridized parent is compiled as part of the parent: ask the parent)")
            raise StateError(f"{type(self).__name__}.compile_report(): there is no compiled graph to report "
                             f"on; {what}")
        return graph.compile_report(as_dict=True) if as_dict else _ReportText(graph.compile_report())

    def __call__(self, *args, **kwargs):
        for a in args:
            if type(a) is not _NDArray and getattr(a, "_kiln_symbol", False):
                return a._of_block(self, args)  # a Symbol of this block's graph (kiln.sym)
        if not self._active or _tracing() or kwargs:
            # eager, inside a parent's trace, or keyword inputs
            return self.forward(*args, **kwargs)
        # The hot path: a graph compiled for these arguments, parameters unchanged since.
        d = self.__dict__
        if d.get("_cache_generation") == _parameter._generation:
            hit = self._cache.call(_is_training(), self._freezing(stacklevel=3), args)
            if hit is not None:
                graph, structure, outs = hit
                d["_last_used_graph"] = graph
                return outs[0] if structure is None else _unflatten(outs, structure)[0]
        return self._call_cached(args)

    def _signature(self, args, frozen):
        """The trace cache's key: training mode, frozen, then each argument's type (or repr)."""
        key = [_is_training(), frozen]
        for a in args:
            if isinstance(a, _NDArray):
                key.append((a.shape, a._dtype_name, a.device))
            else:
                key.append(("const", repr(a)))
        return tuple(key)

    def _call_cached(self, args):
        # Deferred shapes are completed while the first call traces (Parameter._finish_deferred_init
        # pauses the trace to make the arrays), as Gluon infers them on its first hybridized call.
        if self._cache and getattr(self, "_cache_generation", None) != _parameter._generation:
            self._cache.clear()  # some Parameter's arrays were replaced: the graphs captured the old ones
        self._cache_generation = _parameter._generation
        frozen = self._freezing()
        key = self._signature(args, frozen)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._trace(args, frozen)
            self._cache_generation = _parameter._generation  # parameters the trace initialized
            self._report_retrace(key)
            self._cache[key] = entry
        graph, structure = entry
        self._last_used_graph = graph
        outs = graph([a for a in args if isinstance(a, _NDArray)])
        return outs[0] if structure is None else _unflatten(outs, structure)[0]

    def _report_retrace(self, key):
        """Warns, once per hybridize(), when the new signature `key` is churn a user should fix.
        Expected, and traced quietly: one graph per device (data parallelism), training and
        inference graphs, and a few batch sizes (a data loader's smaller last batch, an evaluation
        batch size). Warned: a change of anything but the batch dimension (the other dimensions,
        rank, dtype, a non-array argument), or more than _QUIET_BATCH_SIZES batch sizes for the same
        inputs on the same devices (each compiles a graph)."""
        seen = self.__dict__.setdefault("_batch_sizes", {})  # (devices, layout) -> batch sizes traced
        sizes = seen.setdefault((_sig_devices(key), _sig_layout(key)), set())
        known_layout = bool(sizes)
        sizes.add(_sig_batch(key))
        if getattr(self, "_retrace_reported", False):
            return
        same = [k for k in self._cache.keys() if _sig_devices(k) == _sig_devices(key)]
        if not same and not known_layout:
            return
        import warnings
        if known_layout or any(_sig_layout(k) == _sig_layout(key) for k in same):
            if len(sizes) <= _QUIET_BATCH_SIZES:
                return
            self._retrace_reported = True  # once per block: the reason, not a stream of warnings
            ordered = sorted(sizes, key=lambda b: tuple(-1 if d is None else d for d in b))
            shown = ", ".join(str(b[0]) if len(b) == 1 else str(b) for b in ordered)
            warnings.warn(f"{type(self).__name__}: traced again ({len(self._cache) + 1} graphs cached) for "
                          f"another batch size: {len(sizes)} batch sizes so far ({shown}), each compiled "
                          f"separately; keep batches to a few sizes (a DataLoader's last_batch='discard' or "
                          f"'rollover', or pad the inputs)", stacklevel=4)
            return
        self._retrace_reported = True
        old = next((k for k in same if k[:2] == key[:2]), same[0])
        diffs = [f"argument {i}: {o} -> {n}" for i, (o, n) in enumerate(zip(old[2:], key[2:])) if o != n]
        if old[0] != key[0]:
            diffs.append(f"training mode {old[0]} -> {key[0]}")
        if old[1] != key[1]:
            diffs.append(f"frozen {old[1]} -> {key[1]}")
        warnings.warn(f"{type(self).__name__}: traced again ({len(self._cache) + 1} graphs cached) "
                      f"because the input signature changed: {'; '.join(diffs)}", stacklevel=4)

    def _trace(self, args, frozen=False):
        specs = tuple(_Spec(a.shape, a._dtype_name, a.device) if isinstance(a, _NDArray) else a for a in args)
        traced = self._trace_specs(specs, freeze=frozen)
        self._last_graph = traced.graph
        self._last_trace = traced
        if not traced.training:
            self._last_inference_trace = traced
        return traced.graph, traced.structure

    def _trace_specs(self, specs, input_names=None, freeze=False):
        """Traces forward() on symbolic inputs of the types in `specs` (non-_Spec items are passed
        as given); the data inputs get `input_names`, or 'data' / 'data0', 'data1'...; `freeze`
        compiles it frozen."""
        from .. import _C
        n = sum(isinstance(a, _Spec) for a in specs)
        names = list(input_names) if input_names is not None else _data_input_names(n)
        with _C.TraceScope() as scope:
            sym_args, k = [], 0
            for a in specs:
                if isinstance(a, _Spec):
                    sym_args.append(scope.input(names[k], a.shape, a.dtype, a.device))
                    k += 1
                else:
                    sym_args.append(a)
            try:
                out = self.forward(*sym_args)
            except StateError as e:
                frame = _user_frame(e.__traceback__)
                where = f" (at {frame.filename}:{frame.lineno}: {frame.line})" if frame else ""
                raise StateError(f"{type(self).__name__}.forward cannot be hybridized{where}: {e}") from None
            arrays, structure = _flatten(out)
            for a in arrays:
                if not isinstance(a, _C.NDArray):
                    raise ArgumentError(f"{type(self).__name__}.forward returned {type(a).__name__}; a "
                                        f"hybridized block must return NDArrays (or lists/tuples of them)")
            graph = scope.finish(arrays, freeze=freeze)
        return _Traced(graph, structure, names, _is_training(), specs)

    def export(self, path, epoch=0):
        """Writes the compiled graph to `path`-symbol.json and its parameters to
        `path`-%04d.params (epoch), both atomically; returns the two file names.

        The graph is the one last traced in inference mode (a training-mode trace is traced again
        in inference mode, so BatchNorm uses its running statistics and Dropout is off). Every
        tensor the graph reads is saved under its parameter's structural name from
        collect_params() ('0.weight'), or as 'const0', 'const1'... when it is no parameter.
        The graph records the input shapes it was traced with; SymbolBlock.imports, kiln::load and
        kiln-run also run it at other sizes (another batch size), re-shaping it. A block hybridized with
        freeze=True exports its frozen graph: its constants (parameters and what was folded from
        them) are saved as 'const0', 'const1'..., which SymbolBlock.imports loads with grad_req
        'null', so the imported block is for inference, as the frozen one.
        """
        from .. import autograd
        path = os.fspath(path)
        traced = self._last_trace
        if not self._active or traced is None:
            raise StateError(f"{type(self).__name__}.export('{path}'): there is no compiled graph to "
                             f"export; call hybridize() and run one batch through the block "
                             f"(net(x)) first, then export")
        if traced.training:
            traced = self._last_inference_trace
            if traced is None or traced.specs != self._last_trace.specs:
                with autograd.predict_mode():
                    traced = self._trace_specs(self._last_trace.specs, freeze=self._freeze)
                # Cached as a call would cache it, so the next inference call need not trace.
                key = (False, self._freeze) + tuple((a.shape, a.dtype, a.device) if isinstance(a, _Spec)
                                                    else ("const", repr(a)) for a in traced.specs)
                if key not in self._cache:
                    self._cache[key] = (traced.graph, traced.structure)
                self._last_inference_trace = traced
        params = self.collect_params()
        names = _captured_names(traced.graph.captured, params)
        frozen = [n for n in names if n not in params or params[n].grad_req == "null"]
        return _export_graph(traced.graph, path, epoch, traced.input_names, names, frozen,
                             _structure_indices(traced.structure)[0], type(self).__name__,
                             _param_order(names, params))

    def forward(self, x, *args):
        if type(self).hybrid_forward is HybridBlock.hybrid_forward:
            raise NotImplementedError(f"{type(self).__name__} must implement forward() or hybrid_forward()")
        from .. import _C, nd, sym
        params = {k: p.data(x.device) for k, p in self._reg_params.items()}
        return self.hybrid_forward(sym if _C.tracing() else nd, x, *args, **params)

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError


def _export_graph(graph, path, epoch, input_names, param_names, frozen, structure, who, order=None):
    """Writes `graph` (whose captured tensors are named `param_names`) and those tensors; the
    params file's metadata lists the `frozen` ones (grad_req 'null': running statistics,
    constants) so that SymbolBlock.imports does not train them. A call of another compiled graph in
    it (a SymbolBlock used inside a hybridized block) is written inlined: graph.save inlines it, so
    the file holds plain ops and loads anywhere (passes/inline_calls.h). `order` (indices into the
    captured tensors) is the order the files list the parameters in; None: as traced."""
    from .. import _C
    if not isinstance(epoch, int) or not 0 <= epoch <= 9999:
        raise ArgumentError(f"{who}.export: epoch must be an integer in [0, 9999], got {epoch!r}")
    symbol_file, params_file = f"{path}-symbol.json", f"{path}-{epoch:04d}.params"
    order = list(range(len(param_names))) if order is None else list(order)
    names, captured = [param_names[i] for i in order], graph.captured
    text = graph.to_json(list(input_names), names, structure, param_order=order)
    # Both files are written before either replaces its old version (a full disk changes neither);
    # see _C.save_export for what a kill between the two renames leaves.
    _C.save_export(symbol_file, text, params_file,
                   [(param_names[i], _C.HostTensor(captured[i])) for i in order],
                   {"format": "kiln", FROZEN_KEY: json.dumps(list(frozen))})
    return symbol_file, params_file


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

    # How kiln.sym (which does not import this module) tells a plain stack, whose children it can
    # list in order without a trace: type(b).forward is type(b)._kiln_sequential_forward.
    _kiln_sequential_forward = forward

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
