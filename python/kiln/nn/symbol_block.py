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
and is differentiable. Not here: new input shapes (an exported graph has the static shapes it was
traced with), BatchNorm running statistics that update in training (the exported graph is the
inference one), and exporting a hybridized block that calls a SymbolBlock.
"""
import json
import os

from .. import _C
from .._C import ArgumentError, DeviceError, DTypeError, FormatError, ShapeError
from .block import FROZEN_KEY, HybridBlock, _export_graph
from .parameter import Parameter, _devices
from . import serialization

__all__ = ["SymbolBlock"]


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
                          f"params file exported together with the symbol file")
    try:
        frozen = set(json.loads(metadata.get(FROZEN_KEY, "[]")))
    except (TypeError, ValueError):
        raise FormatError(f"'{param_file}': the metadata entry {FROZEN_KEY!r} must be a JSON list of "
                          f"names, found {metadata.get(FROZEN_KEY)!r}; export the block again") from None
    return [arrays[n] for n in names], frozen


class SymbolBlock(HybridBlock):
    """A HybridBlock whose forward is a compiled graph read from an exported file.

    Build one with SymbolBlock.imports(). It is compiled already, so hybridize() changes nothing;
    it compiles once per device its inputs live on, and again if a parameter's arrays are replaced
    (cast(), reset_device()). Multiple outputs come back as tuples.
    """

    def __init__(self, graph_text, input_names, param_names, input_types, param_types,
                 output_structure, source="<graph>"):
        super().__init__()
        self._graph_text = graph_text
        self._input_names = list(input_names)
        self._param_names = list(param_names)
        self._input_types = [(tuple(s), d) for s, d in input_types]
        self._output_structure = output_structure
        self._source = source
        self._compiled = {}  # device -> (CachedGraph, the parameter arrays it was compiled with)
        self._sym_params = []
        for name, (shape, dtype) in zip(self._param_names, param_types):
            param = Parameter(name, shape=tuple(shape), dtype=dtype)
            self._sym_params.append(param)
            self._reg_params[name] = param  # listed by collect_params() under its saved name

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
        block = SymbolBlock(text, loaded.input_names, loaded.param_names, loaded.input_types,
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
        return self.forward(*args)

    def __repr__(self):
        inputs = ", ".join(f"{n}: {d}{s}" for n, (s, d) in zip(self._input_names, self._input_types))
        return f"SymbolBlock({inputs}; {len(self._param_names)} parameters; from {self._source})"

    def _check_inputs(self, args):
        if len(args) != len(self._input_names):
            raise ArgumentError(f"SymbolBlock: expected {len(self._input_names)} input(s) "
                                f"{self._input_names}, got {len(args)}")
        for name, (shape, dtype), x in zip(self._input_names, self._input_types, args):
            if not isinstance(x, _C.NDArray):
                raise ArgumentError(f"SymbolBlock: input '{name}' must be an NDArray, got {type(x).__name__}")
            if tuple(x.shape) != shape:
                raise ShapeError(f"SymbolBlock: input '{name}' has shape {tuple(x.shape)}, but the exported "
                                 f"graph has static shapes and expects {shape}; pass inputs of that "
                                 f"shape, or export again after calling the block with shape {tuple(x.shape)}")
            if x._dtype_name != dtype:
                raise DTypeError(f"SymbolBlock: input '{name}' is {x._dtype_name} but the exported graph "
                                 f"expects {dtype}; convert it with .astype('{dtype}')")

    def _graph_for(self, device):
        """The graph compiled on `device` with the parameters' current arrays there."""
        arrays = []
        for param in self._sym_params:
            copies = [a for a in param.list_data() if a.device == device]
            if not copies:
                raise DeviceError(f"SymbolBlock: the input is on {device} but parameter '{param.name}' "
                                  f"lives on {param.list_device()}; move the input, or import with "
                                  f"device={device}")
            arrays.append(copies[0])
        entry = self._compiled.get(device)
        if entry is None or len(entry[1]) != len(arrays) or any(a is not b for a, b in zip(entry[1], arrays)):
            graph = _C.parse_graph_json(self._graph_text).compile(arrays, device)
            entry = self._compiled[device] = (graph, arrays)
        self._last_used_graph = entry[0]  # for compile_report()
        return entry[0]

    def forward(self, *args):
        self._check_inputs(args)
        device = args[0].device if args else (self._sym_params[0].list_device()[0] if self._sym_params else _C.cpu())
        outs = self._graph_for(device)(list(args))
        return _rebuild(outs, self._output_structure)

    def export(self, path, epoch=0):
        """Writes this block's graph and its parameters' current values (see HybridBlock.export)."""
        path = os.fspath(path)
        device = self._sym_params[0].list_device()[0] if self._sym_params else _C.cpu()
        graph = self._graph_for(device)
        frozen = [p.name for p in self._sym_params if p.grad_req == "null"]
        return _export_graph(graph, path, epoch, self._input_names, self._param_names, frozen,
                             self._output_structure, "SymbolBlock")
