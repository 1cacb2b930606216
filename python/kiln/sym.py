"""kiln.sym: the ops a hybridized block sees while it is traced (F in hybrid_forward), and a small
Symbol API in the names of mxnet.symbol for looking at the graph a block compiles to.

Inside a trace the same functions as kiln.nd apply to symbolic arrays and are recorded into the
graph instead of run; they are re-exported here so that code written for Gluon's F.* reads the
same.

    data = sym.var("data", shape=(1, 512))
    out = net(data)                        # a Symbol: net traced on a (1, 512) input
    out.list_arguments()                   # ['data', '0.weight', '0.bias', ...]
    out.infer_shape(data=(8, 512))         # ([(8, 512), (256, 512), ...], [(8, 2)], [])
    text = out.tojson()                    # what net.export() writes as NAME-symbol.json

How it works and what it does not do (kiln is not MXNet's symbolic engine):
- A Symbol is a recipe (vars, and HybridBlocks called on Symbols) plus the graph it was traced to.
  Calling a HybridBlock on Symbols traces it at once, on symbolic inputs of the vars' shapes and
  dtypes, in inference mode, on the device of the block's parameters. kiln traces with static
  shapes, so every var needs a shape; infer_shape() with other shapes traces the recipe again.
- The block must be initialized (net.initialize()); a deferred shape is completed by one eager
  call on zeros of the vars' shapes.
- The nd functions here and Symbol's operators also compose Symbols (sym.relu(s), s * 2 + 1):
  each such call becomes a small block in the recipe.
- Parameters are named by their structural names in the block (collect_params()); when several
  blocks are composed and their names clash, each is prefixed by the block's position in call
  order ('0.', '1.', ...). Captured tensors that are no parameter are named 'const0', ...
- BatchNorm's running statistics are arguments like any parameter: kiln has no auxiliary-state
  category, so infer_shape() returns an empty aux_shapes list.
- There is no symbolic executor (bind/simple_bind): use nn.SymbolBlock or a hybridized block.
"""
import json

from .nd import *  # noqa: F401,F403
from .nd import random  # noqa: F401
from . import _C
from ._C import ArgumentError, ShapeError, StateError

__all__ = ["Symbol", "var", "Variable"]


class _Graph:
    """One trace of a Symbol's recipe: the compiled graph and its manifest."""

    def __init__(self, graph, input_names, param_names, structure):
        self.graph, self.input_names, self.param_names = graph, input_names, param_names
        self.structure = structure
        self.doc = json.loads(graph.to_json(input_names, param_names, structure))


class Symbol:
    """A symbolic input (var) or the outputs of HybridBlocks called on Symbols."""

    def __init__(self, name, var=None, call=None, item=None, shapes=None):
        self.name = name
        self._var = var      # (shape or None, dtype) of a var
        self._call = call    # (block, args) of a block output
        self._item = item    # (Symbol, index) of one output of a multi-output Symbol
        self._traced = None if var is not None else _trace(self, shapes or {})

    _kiln_symbol = True  # how nn.block tells a Symbol argument, without importing this module

    def __repr__(self):
        return f"<Symbol {self.name}>"

    @staticmethod
    def _of_block(block, args):
        return _apply(block, args)

    # -- structure --------------------------------------------------------------------------------

    def _vars(self, out=None):
        """The vars this Symbol depends on, in order of first use."""
        out = {} if out is None else out
        if self._var is not None:
            out.setdefault(self.name, self)
        for arg in (self._call[1] if self._call else [self._item[0]] if self._item else []):
            if isinstance(arg, Symbol):
                arg._vars(out)
        return out

    def _blocks(self, out=None):
        out = [] if out is None else out
        for arg in (self._call[1] if self._call else [self._item[0]] if self._item else []):
            if isinstance(arg, Symbol):
                arg._blocks(out)
        if self._call and not any(b is self._call[0] for b in out):
            out.append(self._call[0])
        return out

    def _outputs_count(self):
        return 1 if self._var is not None else len(self._traced.doc["outputs"])

    def __getitem__(self, index):
        n = self._outputs_count()
        if not isinstance(index, int) or not -n <= index < n:
            raise ArgumentError(f"{self!r} has {n} output(s); index it with an integer in [0, {n})")
        if n == 1:
            return self
        return Symbol(f"{self.name}_output{index % n}", item=(self, index % n))

    def __len__(self):
        return self._outputs_count()

    # -- the MXNet-style queries ------------------------------------------------------------------

    def _need_graph(self, what):
        if self._traced is None:
            raise StateError(f"Symbol.{what}: var '{self.name}' alone has no graph; call a HybridBlock "
                             f"on it (out = net({self.name})) and ask the result")
        return self._traced

    def list_arguments(self):
        """The data inputs (vars) in order, then the parameters by name."""
        if self._var is not None:
            return [self.name]
        return list(self._traced.input_names) + list(self._traced.param_names)

    list_inputs = list_arguments

    def list_outputs(self):
        n = self._outputs_count()
        if self._var is not None:
            return [self.name]
        return [f"{self.name}_output"] if n == 1 else [f"{self.name}_output{i}" for i in range(n)]

    def list_auxiliary_states(self):
        """Always []: kiln lists BatchNorm's running statistics among the arguments."""
        return []

    def tojson(self):
        """The graph as NAME-symbol.json holds it (see HybridBlock.export)."""
        t = self._need_graph("tojson")
        return t.graph.to_json(t.input_names, t.param_names, t.structure)

    def save(self, fname):
        """Writes tojson() to `fname` atomically."""
        t = self._need_graph("save")
        t.graph.save(fname, t.input_names, t.param_names, t.structure)

    def _types(self, shapes, dtypes_too=False):
        if self._var is not None:
            shape, dtype = self._var
            shape = shapes.get(self.name, shape)
            if shape is None:
                raise ShapeError(_NO_SHAPE.format(name=self.name))
            return [tuple(shape)], [tuple(shape)], [dtype], [dtype]
        t = self._traced
        if any(tuple(s) != tuple(v._var[0] or ()) for n, s in shapes.items() for v in [self._vars()[n]]):
            t = _trace(self, shapes)
        doc = t.doc
        args = doc["inputs"] + doc["params"]
        return ([tuple(a["shape"]) for a in args], [tuple(o["shape"]) for o in doc["outputs"]],
                [a["dtype"] for a in args], [o["dtype"] for o in doc["outputs"]])

    def _shape_args(self, args, kwargs, what):
        names = list(self._vars())
        if len(args) > len(names):
            raise ArgumentError(f"Symbol.{what}: {len(args)} positional shapes for {len(names)} input(s) {names}")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ArgumentError(f"Symbol.{what}: '{k}' is not an input of {self!r}; its inputs are {names}")
            given[k] = v
        return {k: tuple(int(d) for d in v) for k, v in given.items() if v is not None}

    def infer_shape(self, *args, **kwargs):
        """(arg_shapes, out_shapes, aux_shapes) as MXNet: arguments in list_arguments() order.
        Input shapes default to the vars' shapes; other shapes trace the recipe again."""
        arg, out, _, _ = self._types(self._shape_args(args, kwargs, "infer_shape"))
        return arg, out, []

    def infer_type(self, *args, **kwargs):
        """(arg_types, out_types, aux_types) as dtype names, for the vars' shapes."""
        _, _, arg, out = self._types({})
        return arg, out, []


_NO_SHAPE = "kiln traces with static shapes: give var({name!r}, shape=...)"


def var(name, shape=None, dtype="float32"):
    """A symbolic input named `name`; `shape` is needed before a block is called on it."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"var: the name must be a non-empty string, got {name!r}")
    if shape is not None:
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ShapeError(f"var({name!r}): every dimension must be positive, got {shape}")
    from .nn.parameter import _dtype_name
    return Symbol(name, var=(shape, _dtype_name(dtype)))


Variable = var


def _apply(block, args):
    """block(*args) where some args are Symbols: the Symbol of its outputs (traced now)."""
    for a in args:
        if isinstance(a, _C.NDArray):
            raise ArgumentError(f"{type(block).__name__} was called on Symbols and NDArrays together; "
                                f"make every array input a sym.var")
    name = type(block).__name__.lower()
    return Symbol(name, call=(block, list(args)))


def _eval(s, env, memo):
    """Runs the recipe of `s` with vars bound by `env` (symbolic or concrete arrays)."""
    if id(s) in memo:
        return memo[id(s)]
    if s._var is not None:
        out = env[s.name]
    elif s._item is not None:
        out = _eval(s._item[0], env, memo)
        from .nn._structure import _flatten
        out = _flatten(out)[0][s._item[1]]
    else:
        block, args = s._call
        out = block(*[_eval(a, env, memo) if isinstance(a, Symbol) else a for a in args])
    memo[id(s)] = out
    return out


def _param_names(blocks, captured):
    from .nn._structure import _captured_names
    from .nn.parameter import ParameterDict
    dicts = [b.collect_params() for b in blocks]
    merged, seen = ParameterDict(), set()
    keys = [k for d in dicts for k in d]
    prefix = len(set(keys)) != len(keys)
    for i, d in enumerate(dicts):
        for k, p in d.items():
            if id(p) not in seen:
                seen.add(id(p))
                merged[f"{i}.{k}" if prefix else k] = p
    return _captured_names(captured, merged)


def _trace(s, shapes):
    """Traces the recipe of `s` on symbolic inputs (`shapes` overriding the vars' shapes)."""
    from . import autograd, nd
    from .nn._structure import _flatten, _structure_indices
    variables = s._vars()
    types = {}
    for name, v in variables.items():
        shape = shapes.get(name, v._var[0])
        if shape is None:
            raise ShapeError(_NO_SHAPE.format(name=name))
        types[name] = (tuple(shape), v._var[1])
    blocks = s._blocks()
    params = [p for b in blocks for p in b.collect_params().values()]
    device = next((p.list_device()[0] for p in params if p._data is not None or p._deferred), _C.cpu())
    with autograd.pause(), autograd.predict_mode():
        if any(p._data is None and p._deferred is not None for p in params):
            # Deferred shapes are completed by one eager run, as a hybridized block's first call.
            _eval(s, {n: nd.zeros(sh, dt, device) for n, (sh, dt) in types.items()}, {})
        with _C.TraceScope() as scope:
            env = {n: scope.input(n, sh, dt, device) for n, (sh, dt) in types.items()}
            arrays, structure = _flatten(_eval(s, env, {}))
            for a in arrays:
                if not isinstance(a, _C.NDArray):
                    raise ArgumentError(f"{s!r}: a block returned {type(a).__name__}; a traced block must "
                                        f"return NDArrays (or lists/tuples of them)")
            graph = scope.finish(arrays)
    return _Graph(graph, list(types), _param_names(blocks, graph.captured), _structure_indices(structure)[0])


# ---- ops on Symbols -----------------------------------------------------------------------------

import operator as _operator

from . import nd as _nd


def _op_block(fn, name, kwargs):
    class _Op:
        """One kiln.nd function applied to its inputs, as a block of a Symbol's recipe (it has no
        parameters; it is only ever called on arrays, symbolic while tracing)."""

        def __call__(self, *args):
            return fn(*args, **kwargs)

        def collect_params(self):
            from .nn.parameter import ParameterDict
            return ParameterDict()

    _Op.__name__ = name
    return _Op()


def _symbolic(fn, name):
    def op(*args, **kwargs):
        if any(isinstance(a, Symbol) for a in args):
            return Symbol(name, call=(_op_block(fn, name, kwargs), list(args)))
        return fn(*args, **kwargs)  # arrays (symbolic while tracing, or concrete): the nd function
    op.__name__ = name
    op.__doc__ = fn.__doc__
    return op


_CREATION = {"NDArray", "array", "zeros", "ones", "full", "arange", "empty", "invoke", "waitall", "random",
             "zeros_like", "ones_like"}
for _name in dir(_nd):
    _fn = getattr(_nd, _name)
    if _name.startswith("_") or _name in _CREATION or not callable(_fn) or isinstance(_fn, type):
        continue
    globals()[_name] = _symbolic(_fn, _name)

for _dunder, _fn in {"__add__": _operator.add, "__sub__": _operator.sub, "__mul__": _operator.mul,
                     "__truediv__": _operator.truediv, "__pow__": _operator.pow, "__neg__": _operator.neg,
                     "__radd__": lambda a, b: b + a, "__rsub__": lambda a, b: b - a,
                     "__rmul__": lambda a, b: b * a, "__rtruediv__": lambda a, b: b / a}.items():
    setattr(Symbol, _dunder, _symbolic(_fn, _dunder.strip("_")))
