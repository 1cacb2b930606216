"""SymbolBlock: a block made from an exported graph (NAME-symbol.json + NAME-0000.params), as
mxnet.gluon.SymbolBlock.

    net = nn.SymbolBlock.imports("mlp-symbol.json", ["data"], "mlp-0000.params")
    y = net(x)

Loading checks everything before the block exists: the graph file (kiln._C.load_graph), the input
names, and every parameter's name, shape and dtype; each problem is a FormatError saying what
differs. The parameters become Parameters under their saved names, grad_req 'write' (but 'null'
for those exported with grad_req 'null', such as BatchNorm's running statistics, and for
constants: the params file's metadata lists them), so the block fine-tunes with kiln.Trainer and
exports again. The export of a frozen block (hybridize(freeze=True)) holds only constants, so the
block imported from it is for inference, as the frozen one was. A call runs the compiled graph as one engine task
and is differentiable. Inputs may have other sizes than the exported ones (another batch size), as
MXNet rebinds its executor: the graph is re-shaped for them (shapes inferred again, size-valued
attributes rewritten; kiln._C.LoadedGraph.reshaped, passes/reshape_inputs.h) and compiled once per
input shapes and device, the last MAX_PLANS of them kept; a graph that cannot be re-shaped soundly
is a ShapeError naming the node and the input. A hybridized block that calls a SymbolBlock exports
with the SymbolBlock's graph inlined. Not here: BatchNorm running statistics that update in
training (the exported graph is the inference one).
"""
import collections
import json
import os

from .. import _C
from .._C import ArgumentError, DeviceError, DTypeError, FormatError, ShapeError, StateError
from .block import FROZEN_KEY, HybridBlock, _export_graph
from .parameter import Parameter, _devices
from . import serialization

__all__ = ["SymbolBlock"]

MAX_PLANS = 8  # compiled graphs a SymbolBlock keeps, one per (device, input shapes)


def _rebuild(outs, structure):
    """Outputs grouped as the manifest says: a leaf index or nested lists (returned as tuples)."""
    if isinstance(structure, int):
        return outs[structure]
    return tuple(_rebuild(outs, s) for s in structure)


def _load_params(param_file, names, types, device):
    """Reads `param_file` and checks it against the graph's parameters; one FormatError lists every
    missing, extra, misshapen and mistyped entry."""
    try:
        arrays, metadata = serialization.load_arrays(param_file, device)
    except OSError as e:
        raise FormatError(f"cannot open '{param_file}': {e.strerror}; check the path") from None
    problems = []
    missing = [n for n in names if n not in arrays]
    extra = [n for n in arrays if n not in names]
    if missing:
        problems.append(f"missing parameter(s) {missing}")
    if extra:
        problems.append(f"extra parameter(s) {extra} that the graph does not read")
    for name, (shape, dtype) in zip(names, types):
        arr = arrays.get(name)
        if arr is not None and tuple(arr.shape) != tuple(shape):
            problems.append(f"'{name}' has shape {tuple(arr.shape)}, the graph expects {tuple(shape)}")
        if arr is not None and arr._dtype_name != dtype:
            problems.append(f"'{name}' is {arr._dtype_name}, the graph expects {dtype}")
    if problems:
        raise FormatError(f"'{param_file}' does not fit its graph: {'; '.join(problems)}; load the "
                          f"params file exported together with the symbol file (an export killed "
                          f"between its two files leaves such a pair: export again)")
    try:
        frozen = json.loads(metadata.get(FROZEN_KEY, "[]"))
        if not isinstance(frozen, list) or not all(isinstance(n, str) for n in frozen):
            raise TypeError("not a list of names")
        frozen = set(frozen)
    except (TypeError, ValueError, RecursionError):  # RecursionError: hostile nesting
        raise FormatError(f"'{param_file}': the metadata entry {FROZEN_KEY!r} must be a JSON list of "
                          f"names, found {metadata.get(FROZEN_KEY)!r}; export the block again") from None
    return [arrays[n] for n in names], frozen


class SymbolBlock(HybridBlock):
    """A HybridBlock whose forward is a compiled graph read from an exported file.

    Build one with SymbolBlock.imports(). It is compiled already, so hybridize() changes nothing;
    it compiles once per device its inputs live on, and again if a parameter's arrays are replaced
    (cast(), reset_device()). Multiple outputs come back as tuples.
    """

    def __init__(self, outputs, inputs, params=None):
        """SymbolBlock(outputs, inputs, params=None) as Gluon: a block of a kiln.sym Symbol
        `outputs` whose data inputs are the vars `inputs` (one or a list, in call order); it
        shares the parameters of the blocks in the Symbol (`params`, a ParameterDict, may name
        further Parameters by list_arguments() names). The graph is the Symbol's trace; when no
        shape of its vars is known yet, the first call's inputs give them. (SymbolBlock.imports
        builds one from exported files.)"""
        super().__init__()
        self._compiled = collections.OrderedDict()  # (device, shapes) -> (CachedGraph, arrays), LRU last
        self._symbol = None
        if not getattr(outputs, "_kiln_symbol", False) and not (
                isinstance(outputs, (list, tuple)) and outputs and getattr(outputs[0], "_kiln_symbol", False)):
            raise ArgumentError(f"SymbolBlock(outputs, inputs): outputs must be a kiln.sym Symbol, got "
                                f"{type(outputs).__name__}; to load exported files use SymbolBlock.imports")
        self._init_symbol(outputs, inputs, params)

    @classmethod
    def _of_graph(cls, graph_text, input_names, param_names, input_types, param_types, output_structure, source):
        """A block of an exported graph (what imports builds), with new Parameters."""
        block = cls.__new__(cls)
        HybridBlock.__init__(block)
        block._compiled = collections.OrderedDict()
        block._symbol = None
        block._init_graph(graph_text, input_names, param_names, input_types, output_structure, source,
                          [Parameter(name, shape=tuple(shape), dtype=dtype)
                           for name, (shape, dtype) in zip(param_names, param_types)])
        return block

    def _init_graph(self, graph_text, input_names, param_names, input_types, output_structure, source, params):
        self._graph_text = graph_text
        self._input_names = list(input_names)
        self._param_names = list(param_names)
        self._input_types = [(tuple(s), d) for s, d in input_types]
        self._output_structure = output_structure
        self._source = source
        self._sym_params = list(params)
        for name, param in zip(self._param_names, self._sym_params):
            if not any(q is param for q in self._reg_params.values()):
                self._reg_params[name] = param  # listed by collect_params() under its saved name

    def _init_symbol(self, outputs, inputs, params):
        from ..sym import _merged_params
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if isinstance(outputs, (list, tuple)):
            if len(outputs) != 1:
                raise ArgumentError(f"SymbolBlock: give one output Symbol (a block returning a tuple is one "
                                    f"Symbol), got {len(outputs)}")
            outputs = outputs[0]
        names = list(outputs._vars())
        given = [getattr(v, "name", None) for v in inputs]
        if any(not getattr(v, "_kiln_symbol", False) or v._var is None for v in inputs) or sorted(given) != sorted(names):
            raise ArgumentError(f"SymbolBlock: inputs must be the vars of the output Symbol, {names}; got {given}")
        self._symbol, self._symbol_inputs = outputs, given
        merged = _merged_params(outputs._blocks())
        for name, p in (params or {}).items():
            merged.setdefault(name, p)
        for name, p in merged.items():
            self._reg_params[name] = p  # shared with the blocks of the Symbol, as in Gluon
        self._graph_text = None
        self._source = repr(outputs)
        try:
            self._from_trace(outputs._graph(what="SymbolBlock"))
        except ShapeError:
            pass  # no var shape known yet: the first call gives them

    def _from_trace(self, t):
        """Takes the Symbol's graph of trace `t` (inputs ordered as `inputs` were given)."""
        if list(t.input_names) != self._symbol_inputs:
            # The graph's inputs follow the Symbol's vars in order of first use.
            raise ArgumentError(f"SymbolBlock: inputs {self._symbol_inputs} are not in the order of the Symbol's "
                                f"vars {list(t.input_names)}; list them in that order")
        doc = t.doc
        params = []
        for name, arr in zip(t.param_names, t.captured):
            p = self._reg_params.get(name)
            if p is None:  # a tensor the trace captured that is no parameter: a constant
                p = self._reg_params[name] = Parameter(name, shape=tuple(arr.shape), dtype=arr._dtype_name,
                                                       grad_req="null")
                p._load_init(arr, [arr.device])
            params.append(p)
        self._init_graph(t.tojson(), t.input_names, t.param_names,
                         [(tuple(a["shape"]), a["dtype"]) for a in doc["inputs"]], t.structure, self._source, params)

    @staticmethod
    def imports(symbol_file, input_names, param_file=None, device=None, ctx=None):
        """Loads an exported block: the graph from `symbol_file`, whose inputs must be named
        `input_names` exactly (in order), and the parameters from `param_file` onto `device` (a
        Device or a list; cpu by default). Without `param_file` the parameters are left
        uninitialized: call initialize() or load_parameters() before the first call."""
        symbol_file = os.fspath(symbol_file)
        names = [input_names] if isinstance(input_names, str) else list(input_names)
        loaded = _C.load_graph(symbol_file)
        if names != list(loaded.input_names):
            missing = [n for n in loaded.input_names if n not in names]
            extra = [n for n in names if n not in loaded.input_names]
            what = (f"missing {missing}" if missing else "") + ("; " if missing and extra else "") + \
                   (f"unknown {extra}" if extra else "") or "the order differs"
            raise FormatError(f"SymbolBlock.imports('{symbol_file}'): input_names {names} do not match "
                              f"the graph's inputs {list(loaded.input_names)} ({what}); pass "
                              f"input_names={list(loaded.input_names)}")
        with open(symbol_file, encoding="utf-8") as f:
            text = f.read()
        block = SymbolBlock._of_graph(text, loaded.input_names, loaded.param_names, loaded.input_types,
                                      loaded.param_types, loaded.output_structure, symbol_file)
        if param_file is not None:
            devices = _devices(device, ctx)
            values, frozen = _load_params(os.fspath(param_file), block._param_names,
                                          [(tuple(s), d) for s, d in loaded.param_types], devices[0])
            for param, value in zip(block._sym_params, values):
                param._load_init(value, devices)
                if param.name in frozen:
                    param.grad_req = "null"
        return block

    def hybridize(self, active=True, **kwargs):
        """A no-op: a SymbolBlock is compiled already."""

    def __call__(self, *args):
        for a in args:
            if getattr(a, "_kiln_symbol", False):
                return a._of_block(self, args)  # a Symbol of this block's graph (kiln.sym)
        return self.forward(*args)

    def __repr__(self):
        if self._graph_text is None:
            return f"SymbolBlock({', '.join(self._symbol_inputs)}: shapes from the first call; of {self._source})"
        inputs = ", ".join(f"{n}: {d}{s}" for n, (s, d) in zip(self._input_names, self._input_types))
        return f"SymbolBlock({inputs}; {len(self._param_names)} parameters; from {self._source})"

    def _check_inputs(self, args):
        if len(args) != len(self._input_names):
            raise ArgumentError(f"SymbolBlock: expected {len(self._input_names)} input(s) "
                                f"{self._input_names}, got {len(args)}")
        for name, (shape, dtype), x in zip(self._input_names, self._input_types, args):
            if not isinstance(x, _C.NDArray):
                raise ArgumentError(f"SymbolBlock: input '{name}' must be an NDArray, got {type(x).__name__}")
            if len(x.shape) != len(shape):
                raise ShapeError(f"SymbolBlock: input '{name}' has shape {tuple(x.shape)} but the exported "
                                 f"graph takes rank-{len(shape)} inputs like {shape}; only the sizes "
                                 f"(such as the batch size) may differ")
            if x._dtype_name != dtype:
                raise DTypeError(f"SymbolBlock: input '{name}' is {x._dtype_name} but the exported graph "
                                 f"expects {dtype}; convert it with .astype('{dtype}')")

    def _graph_for(self, device, shapes=None):
        """The graph compiled on `device` for data inputs of `shapes` (default: the exported ones)
        with the parameters' current arrays there."""
        shapes = tuple(s for s, _ in self._input_types) if shapes is None else tuple(map(tuple, shapes))
        arrays = []
        for param in self._sym_params:
            copies = [a for a in param.list_data() if a.device == device]
            if not copies:
                raise DeviceError(f"SymbolBlock: the input is on {device} but parameter '{param.name}' "
                                  f"lives on {param.list_device()}; move the input, or import with "
                                  f"device={device}")
            arrays.append(copies[0])
        key = (device, shapes)
        entry = self._compiled.get(key)
        if entry is None or len(entry[1]) != len(arrays) or any(a is not b for a, b in zip(entry[1], arrays)):
            loaded = _C.parse_graph_json(self._graph_text)
            if shapes != tuple(s for s, _ in self._input_types):
                try:
                    loaded = loaded.reshaped(list(shapes))
                except ShapeError as e:
                    raise ShapeError(f"SymbolBlock ({self._source}): {e}") from None
            entry = self._compiled[key] = (loaded.compile(arrays, device), arrays)
            while len(self._compiled) > MAX_PLANS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        self._last_used_graph = entry[0]  # for compile_report()
        return entry[0]

    def forward(self, *args):
        if self._graph_text is None:  # made from a Symbol whose shapes were unknown: these give them
            if len(args) != len(self._symbol_inputs) or not all(isinstance(a, _C.NDArray) for a in args):
                raise ArgumentError(f"SymbolBlock: expected {len(self._symbol_inputs)} NDArray input(s) "
                                    f"{self._symbol_inputs}, got {len(args)}")
            shapes = dict(zip(self._symbol_inputs, (tuple(a.shape) for a in args)))
            self._from_trace(self._symbol._graph(shapes, "SymbolBlock"))
        self._check_inputs(args)
        device = args[0].device if args else (self._sym_params[0].list_device()[0] if self._sym_params else _C.cpu())
        outs = self._graph_for(device, [x.shape for x in args])(list(args))
        return _rebuild(outs, self._output_structure)

    def export(self, path, epoch=0):
        """Writes this block's graph and its parameters' current values (see HybridBlock.export)."""
        path = os.fspath(path)
        if self._graph_text is None:
            raise StateError(f"SymbolBlock.export('{path}'): the Symbol's input shapes are not known yet; "
                             f"run a batch through the block first (net(x)), then export")
        device = self._sym_params[0].list_device()[0] if self._sym_params else _C.cpu()
        graph = self._graph_for(device)
        frozen = [p.name for p in self._sym_params if p.grad_req == "null"]
        return _export_graph(graph, path, epoch, self._input_names, self._param_names, frozen,
                             self._output_structure, "SymbolBlock")
