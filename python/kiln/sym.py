"""kiln.sym: the ops a hybridized block sees while it is traced (F in hybrid_forward), and the
Symbol API of mxnet.symbol for composing and looking at the graph a block compiles to.

Inside a trace the same functions as kiln.nd apply to symbolic arrays and are recorded into the
graph instead of run; they are re-exported here so that code written for Gluon's F.* reads the
same.

    data = sym.var("data")                 # no shape needed, as in MXNet
    out = net(data)                        # a Symbol: a recipe, traced when shapes are known
    out.list_arguments()                   # ['data', '0.weight', '0.bias', ...]
    out.infer_shape(data=(8, 512))         # ([(8, 512), (256, 512), ...], [(8, 2)], [])
    text = out.tojson()                    # what net.export() writes as NAME-symbol.json
    exe = out.simple_bind(kiln.cpu(), data=(8, 512)); exe.forward(data=x)[0]
    nn.SymbolBlock(out, data)              # a block of it (runs at any batch size, exports)

How it works (kiln is not MXNet's symbolic engine, but answers as it does):
- A Symbol is a recipe: vars, and HybridBlocks (or nd functions and operators: sym.relu(s),
  s * 2 + 1) called on Symbols. Building one traces nothing; kiln's graphs have static shapes,
  so the recipe is traced, in inference mode on the device of the blocks' parameters, when a
  query needs the graph, at the vars' shapes: those given to the query (infer_shape(data=...),
  simple_bind, eval), else var(shape=...), else the shapes last given to this Symbol, else the
  shapes a block that takes the var was last called with (a hybridized block that ran a batch,
  a SymbolBlock's exported shapes). A var whose shape none of these gives is a ShapeError that
  names it and says what to call, except for tojson(): as MXNet's symbol JSON, which holds no
  shapes, it then gives the recipe (format 'kiln-symbol': vars, parameters, the blocks and ops
  called). Traces are cached per shapes (the last few).
- The batch size a graph is traced at does not matter for export: SymbolBlock.imports,
  kiln::load and kiln-run re-shape an exported graph for other input sizes.
- list_arguments() needs no shapes: the vars in order of first use, then the blocks' parameters
  in collect_params() order (when several blocks are composed and their names clash, each is
  prefixed by the block's position in call order: '0.', '1.', ...), then the tensors a trace
  captured that are no parameter ('const0', ...; known once traced). infer_shape() answers in
  this order. tojson() lists the parameters the graph reads, in the order it reads them.
- BatchNorm's running statistics are arguments like any parameter: kiln has no auxiliary-state
  category (export writes them as parameters, marked not trainable), so list_auxiliary_states()
  and the aux lists of infer_shape() are empty.
- The block must be initialized (net.initialize()); a deferred shape is completed by one eager
  call on zeros of the vars' shapes.
- Executors (bind, simple_bind, eval) run the inference graph; there is no backward through an
  executor: train with autograd and a HybridBlock, or nn.SymbolBlock(out, data).
"""
import collections
import json

from .nd import *  # noqa: F401,F403
from .nd import random  # noqa: F401
from . import _C
from ._C import ArgumentError, ShapeError, StateError

__all__ = ["Symbol", "var", "Variable", "Executor"]

_MAX_TRACES = 8  # traces a Symbol keeps, one per set of input shapes


class _Graph:
    """One trace of a Symbol's recipe: the compiled graph and its manifest, its parameters in
    list_arguments() order (`param_names`, `captured`; `order` indexes the graph's captured)."""

    def __init__(self, graph, input_names, param_names, structure, shapes, order):
        self.graph, self.input_names, self.structure, self.shapes = graph, input_names, structure, shapes
        self.order = list(order)
        self.param_names = [param_names[i] for i in self.order]
        captured = graph.captured
        self.captured = [captured[i] for i in self.order]
        self.doc = json.loads(self.tojson())

    def tojson(self):
        return self.graph.to_json(self.input_names, self.param_names, self.structure, param_order=self.order)

    def save(self, fname):
        self.graph.save(fname, self.input_names, self.param_names, self.structure, param_order=self.order)


class Symbol:
    """A symbolic input (var) or the outputs of HybridBlocks called on Symbols."""

    def __init__(self, name, var=None, call=None, item=None):
        self.name = name
        self._var = var      # (shape or None, dtype) of a var
        self._call = call    # (block, args) of a block output
        self._item = item    # (Symbol, index) of one output of a multi-output Symbol
        self._traces = collections.OrderedDict()  # input shapes -> _Graph, most recent last
        self._known = {}     # var name -> the shape last given to a query of this Symbol

    _kiln_symbol = True  # how nn.block tells a Symbol argument, without importing this module

    def __repr__(self):
        return f"<Symbol {self.name}>"

    @staticmethod
    def _of_block(block, args):
        return _apply(block, args)

    # -- structure --------------------------------------------------------------------------------

    def _args(self):
        return self._call[1] if self._call else [self._item[0]] if self._item else []

    def _vars(self, out=None):
        """The vars this Symbol depends on, in order of first use."""
        out = {} if out is None else out
        if self._var is not None:
            out.setdefault(self.name, self)
        for arg in self._args():
            if isinstance(arg, Symbol):
                arg._vars(out)
        return out

    def _blocks(self, out=None):
        out = [] if out is None else out
        for arg in self._args():
            if isinstance(arg, Symbol):
                arg._blocks(out)
        if self._call and not any(b is self._call[0] for b in out):
            out.append(self._call[0])
        return out

    def _called_shapes(self, out=None):
        """var name -> the shape a block taking it directly was last called with."""
        out = {} if out is None else out
        if self._call:
            shapes = _last_input_shapes(self._call[0])
            for i, arg in enumerate(self._call[1]):
                if isinstance(arg, Symbol) and arg._var is not None and shapes and i < len(shapes) \
                        and shapes[i] is not None:
                    out.setdefault(arg.name, tuple(shapes[i]))
        for arg in self._args():
            if isinstance(arg, Symbol):
                arg._called_shapes(out)
        return out

    def _outputs_count(self):
        if self._var is not None or self._item is not None:
            return 1
        return len(self._graph(what="list_outputs").doc["outputs"])

    def __getitem__(self, index):
        n = self._outputs_count()
        if not isinstance(index, int) or not -n <= index < n:
            raise ArgumentError(f"{self!r} has {n} output(s); index it with an integer in [0, {n})")
        if n == 1:
            return self
        return Symbol(f"{self.name}_output{index % n}", item=(self, index % n))

    def __len__(self):
        return self._outputs_count()

    # -- shapes and traces ------------------------------------------------------------------------

    def _shapes(self, given, what, required=True):
        """Every var's shape for a trace (see the module's docstring for where each comes from);
        None when some var has none and not `required`."""
        variables = self._vars()
        called = None
        shapes, missing = {}, []
        for name, v in variables.items():
            shape = given.get(name, v._var[0])
            if shape is None:
                shape = self._known.get(name)
            if shape is None:
                called = self._called_shapes() if called is None else called
                shape = called.get(name)
            if shape is None:
                missing.append(name)
            else:
                shapes[name] = tuple(shape)
        if missing and not required:
            return None
        if missing:
            example = ", ".join(f"{n}=(batch, ...)" for n in missing)
            raise ShapeError(
                f"Symbol.{what}: var {', '.join(repr(n) for n in missing)} has no shape yet, and kiln "
                f"traces a graph at known shapes; give them first: call infer_shape({example}) on "
                f"this Symbol (or simple_bind / eval with them), or create sym.var({missing[0]!r}, "
                f"shape=...), or run a batch through the hybridized block (any batch size: an exported "
                f"graph runs at others too)")
        return shapes

    def _graph(self, given=None, what="tojson"):
        """The trace at the vars' shapes (given ones first); remembers given shapes."""
        if self._var is not None:
            raise StateError(f"Symbol.{what}: var '{self.name}' alone has no graph; call a HybridBlock "
                             f"on it (out = net({self.name})) and ask the result")
        shapes = self._shapes(given or {}, what)
        if given:
            self._known.update({k: v for k, v in shapes.items() if k in given})
        key = tuple(sorted(shapes.items()))
        t = self._traces.get(key)
        if t is None:
            t = self._traces[key] = _trace(self, shapes)
            while len(self._traces) > _MAX_TRACES:
                self._traces.popitem(last=False)
        self._traces.move_to_end(key)
        return t

    # -- the MXNet-style queries ------------------------------------------------------------------

    def list_arguments(self):
        """The data inputs (vars) in order, then the parameters by name (no shapes needed)."""
        if self._var is not None:
            return [self.name]
        params = list(_merged_params(self._blocks()))
        consts = [n for t in list(self._traces.values())[-1:] for n in t.param_names if n.startswith("const")
                  and n not in params]
        return list(self._vars()) + params + consts

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
        """The graph as NAME-symbol.json holds it (see HybridBlock.export) once every var's shape
        is known (see the module's docstring). Before, as MXNet's symbol JSON, which holds no shapes:
        the recipe (format 'kiln-symbol'), in MXNet's layout: `nodes` (the vars and parameters as
        'null' nodes, then each block or op called, with its inputs as [node, output, 0]),
        `arg_nodes` and `heads`. Its parameters are named as list_arguments() names them; the
        shapes come later, from infer_shape(), simple_bind() or export, which trace the graph."""
        if self._var is None and self._shapes({}, "tojson", required=False) is None:
            return json.dumps(_recipe(self), indent=2)
        return self._graph(what="tojson").tojson()

    def save(self, fname):
        """Writes tojson() to `fname` atomically: the traced graph, which SymbolBlock.imports,
        kiln::load and kiln-run read, so every var's shape must be known."""
        self._graph(what="save").save(fname)

    def _types(self, given, what):
        """(arg shapes, out shapes, arg dtypes, out dtypes) in list_arguments() order."""
        if self._var is not None:
            shape, dtype = self._var
            shape = given.get(self.name, shape)
            if shape is None:
                raise ShapeError(f"Symbol.{what}: var '{self.name}' has no shape; pass it: "
                                 f"{self.name}.{what}({self.name}=(batch, ...))")
            return [tuple(shape)], [tuple(shape)], [dtype], [dtype]
        t = self._graph(given, what)
        doc = t.doc
        traced = {a["name"]: (tuple(a["shape"]), a["dtype"]) for a in doc["params"]}
        traced.update({a["name"]: (tuple(a["shape"]), a["dtype"]) for a in doc["inputs"]})
        params = _merged_params(self._blocks())
        args = []
        for name in self.list_arguments():
            if name in traced:
                args.append(traced[name])
            else:  # a parameter the graph does not read
                p = params[name]
                args.append((tuple(p.shape) if p.shape is not None else None, p.dtype))
        return ([a[0] for a in args], [tuple(o["shape"]) for o in doc["outputs"]],
                [a[1] for a in args], [o["dtype"] for o in doc["outputs"]])

    def _shape_args(self, args, kwargs, what):
        names = list(self._vars())
        if len(args) > len(names):
            raise ArgumentError(f"Symbol.{what}: {len(args)} positional shapes for {len(names)} input(s) {names}")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ArgumentError(f"Symbol.{what}: '{k}' is not an input of {self!r}; its inputs are {names}")
            given[k] = v
        out = {}
        for k, v in given.items():
            if v is None:
                continue
            v = (v,) if isinstance(v, int) else tuple(int(d) for d in v)
            if any(d <= 0 for d in v):
                raise ShapeError(f"Symbol.{what}: {k}={v}: every dimension must be positive")
            out[k] = v
        return out

    def infer_shape(self, *args, **kwargs):
        """(arg_shapes, out_shapes, aux_shapes) as MXNet: arguments in list_arguments() order.
        Shapes given here are remembered as this Symbol's (tojson() and save() then trace at them)."""
        arg, out, _, _ = self._types(self._shape_args(args, kwargs, "infer_shape"), "infer_shape")
        return arg, out, []

    def infer_type(self, *args, **kwargs):
        """(arg_types, out_types, aux_types) as dtype names (vars are float32 unless var(dtype=))."""
        _, _, arg, out = self._types(self._shape_args(args, kwargs, "infer_type"), "infer_type")
        return arg, out, []

    # -- executors --------------------------------------------------------------------------------

    def simple_bind(self, ctx=None, grad_req="null", type_dict=None, **shapes):
        """An Executor for inputs of `shapes` on `ctx`: its data inputs are zeros (fill them, or
        pass arrays to forward()), its parameters the blocks' own arrays (copied to `ctx`)."""
        from .executor import Executor
        return Executor._simple(self, ctx, grad_req, shapes)

    def bind(self, ctx=None, args=None, args_grad=None, grad_req="null", aux_states=None, **kwargs):
        """An Executor on `ctx` reading `args`: a dict by name or a list in list_arguments() order;
        the vars must be there, parameters left out read the blocks' own arrays."""
        from .executor import Executor
        return Executor._bind(self, ctx, args, args_grad, grad_req)

    def eval(self, ctx=None, **kwargs):
        """The outputs, as a list of NDArrays, for the vars bound to the arrays in `kwargs`."""
        return self.bind(ctx, kwargs).forward()


def var(name, shape=None, dtype="float32", **kwargs):
    """A symbolic input named `name`. `shape` may be left out (the usual MXNet way): the shapes
    come from a query, or from a block's last call (see the module's docstring). MXNet's attr,
    lr_mult, wd_mult, init and stype are accepted and have no effect on a data input."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"var: the name must be a non-empty string, got {name!r}")
    unknown = sorted(set(kwargs) - {"attr", "lr_mult", "wd_mult", "init", "stype"})
    if unknown:
        raise ArgumentError(f"var({name!r}): unknown argument(s) {unknown}; var takes name, shape and dtype")
    if kwargs.get("stype") not in (None, "default"):
        raise ArgumentError(f"var({name!r}): stype={kwargs['stype']!r}: kiln has dense arrays only")
    if shape is not None:
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ShapeError(f"var({name!r}): every dimension must be positive, got {shape}")
    from .nn.parameter import _dtype_name
    return Symbol(name, var=(shape, _dtype_name("float32" if dtype is None else dtype)))


Variable = var


def _last_input_shapes(block):
    """The shapes of the data arguments `block` was last called with (None for a non-array
    argument), or None when it records none."""
    specs = None
    last = getattr(block, "_last_trace", None)
    if last is not None:
        specs = last.specs
    elif getattr(block, "_input_types", None) is not None:  # a SymbolBlock: its exported shapes
        return [s for s, _ in block._input_types]
    if specs is None:
        return None
    return [tuple(a.shape) if hasattr(a, "shape") and hasattr(a, "device") else None for a in specs]


def _apply(block, args):
    """block(*args) where some args are Symbols: the Symbol of its outputs (traced when needed)."""
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


def _recipe(s):
    """The recipe of Symbol `s` as a shape-free document in the layout of MXNet's symbol JSON. A
    (Hybrid)Sequential called on one Symbol lists its children in order; any other block is one
    node (its forward is Python that only a trace can look into), with every parameter it reads
    among its inputs."""
    names = {id(p): n for n, p in _merged_params(s._blocks()).items()}
    nodes, arg_nodes, done, counts = [], [], {}, collections.Counter()

    def null(name, what):
        nodes.append({"op": "null", "name": name, "attrs": {"kind": what}, "inputs": []})
        arg_nodes.append(len(nodes) - 1)
        return [len(nodes) - 1, 0, 0]

    params_done = {}

    def param(p):
        if id(p) not in params_done:
            params_done[id(p)] = null(names.get(id(p), p.name), "parameter")
        return params_done[id(p)]

    def node(op, attrs, inputs):
        counts[op] += 1
        nodes.append({"op": op, "name": f"{op.lower()}{counts[op] - 1}", "attrs": attrs, "inputs": inputs})
        return [len(nodes) - 1, 0, 0]

    def call(block, inputs, extra_attrs):
        sequential = getattr(type(block), "_kiln_sequential_forward", None)
        if sequential is not None and type(block).forward is sequential and len(inputs) == 1 and block._children:
            out = inputs
            for child in block._children.values():
                out = [call(child, out, {})]
            return out[0]
        attrs = dict(extra_attrs)
        attrs.update({k: repr(v) for k, v in getattr(block, "_kwargs", {}).items()})
        if hasattr(block, "_children"):  # a Block: what it is, as print(net) shows it
            attrs["block"] = repr(block)
        params = [param(p) for p in block.collect_params().values()]
        return node(type(block).__name__, attrs, inputs + params)

    def visit(x):
        if id(x) in done:
            return done[id(x)]
        if x._var is not None:
            shape, dtype = x._var
            out = null(x.name, "data")
            nodes[out[0]]["attrs"].update({"dtype": dtype, **({"shape": str(tuple(shape))} if shape else {})})
        elif x._item is not None:
            parent = visit(x._item[0])
            out = [parent[0], x._item[1], 0]
        else:
            block, args = x._call
            inputs = [visit(a) for a in args if isinstance(a, Symbol)]
            attrs = {f"arg{i}": repr(a) for i, a in enumerate(args) if not isinstance(a, Symbol)}
            out = call(block, inputs, attrs)
        done[id(x)] = out
        return out

    head = visit(s)
    return {"format": "kiln-symbol",
            "note": "the recipe, without shapes: kiln traces the graph (format 'kiln-graph') once every "
                    "var's shape is known: infer_shape(data=...), simple_bind, or a call of the block",
            "nodes": nodes, "arg_nodes": arg_nodes, "heads": [head]}


def _merged_params(blocks):
    """The blocks' parameters by name, each once, prefixed by block position when names clash."""
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
    return merged


def _trace(s, shapes):
    """Traces the recipe of `s` on symbolic inputs of `shapes` (every var's)."""
    from . import autograd
    from .nn._structure import _flatten, _structure_indices
    types = {name: (tuple(shapes[name]), v._var[1]) for name, v in s._vars().items()}
    blocks = s._blocks()
    params = [p for b in blocks for p in b.collect_params().values()]
    device = next((p.list_device()[0] for p in params if p._data is not None or p._deferred), _C.cpu())
    with autograd.pause(), autograd.predict_mode():
        # Deferred shapes are completed while tracing (Parameter._finish_deferred_init pauses it).
        with _C.TraceScope() as scope:
            env = {n: scope.input(n, sh, dt, device) for n, (sh, dt) in types.items()}
            arrays, structure = _flatten(_eval(s, env, {}))
            for a in arrays:
                if not isinstance(a, _C.NDArray):
                    raise ArgumentError(f"{s!r}: a block returned {type(a).__name__}; a traced block must "
                                        f"return NDArrays (or lists/tuples of them)")
            graph = scope.finish(arrays)
    from .nn._structure import _captured_names, _param_order
    merged = _merged_params(blocks)
    names = _captured_names(graph.captured, merged)
    return _Graph(graph, list(types), names, _structure_indices(structure)[0], types, _param_order(names, merged))


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
    op = _Op()
    op._kwargs = dict(kwargs)  # for tojson()'s recipe
    return op


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
                     "__mod__": _operator.mod, "__floordiv__": _operator.floordiv,
                     "__radd__": lambda a, b: b + a, "__rsub__": lambda a, b: b - a,
                     "__rmul__": lambda a, b: b * a, "__rtruediv__": lambda a, b: b / a,
                     "__rmod__": lambda a, b: b % a, "__rfloordiv__": lambda a, b: b // a}.items():
    setattr(Symbol, _dunder, _symbolic(_fn, _dunder.strip("_")))
