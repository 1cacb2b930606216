"""kiln.executor: Executor, what Symbol.bind / simple_bind / eval return, as mxnet.executor.

    exe = out.simple_bind(kiln.cpu(), data=(8, 512))
    y = exe.forward(data=x)[0]          # also exe.outputs[0]
    exe.arg_dict["data"]                # the arrays it reads, by list_arguments() name

An Executor holds the Symbol's graph traced at its data inputs' shapes, compiled on one device
with its arguments: the data arrays, and the parameter arrays (given to bind, or the blocks' own,
copied to the device when they live elsewhere). forward() runs it as one engine task. Arrays given
to forward() replace the data inputs (another batch size re-shapes the graph, as a SymbolBlock
does); replacing a parameter's array in arg_dict compiles again. Not here: training (is_train=True,
backward): train the blocks with autograd, or make an nn.SymbolBlock of the Symbol.
"""
import collections

from . import _C
from ._C import ArgumentError, DeviceError, ShapeError, StateError

__all__ = ["Executor"]


class Executor:
    """The inference graph of a Symbol bound to arrays on one device (see the module docstring)."""

    def __init__(self, symbol, device, arg_dict):
        self._symbol, self._device = symbol, device
        self.arg_dict = arg_dict          # list_arguments() name -> NDArray
        self.outputs = []
        self._plan = None                 # (input shapes, parameter arrays, compiled graph)

    # -- construction -----------------------------------------------------------------------------

    @staticmethod
    def _device_of(symbol, ctx):
        if ctx is not None:
            return ctx
        params = [p for b in symbol._blocks() for p in b.collect_params().values()]
        return next((p.list_device()[0] for p in params if p._data is not None), _C.cpu())

    @staticmethod
    def _param_array(symbol, name, device):
        from .sym import _merged_params
        p = _merged_params(symbol._blocks()).get(name)
        if p is None or p._data is None:
            return None
        copies = [a for a in p.list_data() if a.device == device]
        return copies[0] if copies else p.list_data()[0].as_in_context(device)

    @staticmethod
    def _check_grad_req(grad_req):
        reqs = grad_req.values() if isinstance(grad_req, dict) else [grad_req]
        if any(r not in ("null", None) for r in reqs):
            raise StateError(f"bind: grad_req={grad_req!r}: an Executor runs the inference graph and computes "
                             f"no gradients; train the blocks with autograd.record() and a Trainer, or make "
                             f"nn.SymbolBlock(outputs, inputs) of the Symbol")

    @classmethod
    def _simple(cls, symbol, ctx, grad_req, shapes):
        from . import nd
        cls._check_grad_req(grad_req)
        device = cls._device_of(symbol, ctx)
        given = symbol._shape_args((), shapes, "simple_bind")
        full = symbol._shapes(given, "simple_bind")
        symbol._known.update(given)
        variables = symbol._vars()
        args = {n: nd.zeros(full[n], variables[n]._var[1], device) for n in variables}
        return cls._bind(symbol, device, args, None, grad_req)

    @classmethod
    def _bind(cls, symbol, ctx, args, args_grad, grad_req):
        cls._check_grad_req(grad_req)
        if args_grad is not None:
            raise StateError("bind: args_grad: an Executor computes no gradients (see grad_req)")
        names = symbol.list_arguments()
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            args = list(args)
            if len(args) > len(names):
                raise ArgumentError(f"bind: {len(args)} arrays for {len(names)} arguments {names}")
            args = dict(zip(names, args))
        unknown = [k for k in args if k not in names]
        if unknown:
            raise ArgumentError(f"bind: {unknown} are not arguments of {symbol!r}; its arguments are {names}")
        for k, v in args.items():
            if not isinstance(v, _C.NDArray):
                raise ArgumentError(f"bind: argument '{k}' must be an NDArray, got {type(v).__name__}")
        device = ctx if ctx is not None else next((v.device for v in args.values()), None)
        device = cls._device_of(symbol, device)
        variables = list(symbol._vars())
        missing = [n for n in variables if n not in args]
        if missing:
            raise ArgumentError(f"bind: no array for the input(s) {missing}; pass them in args "
                                f"({', '.join(f'{n!r}: x' for n in missing)}), or use simple_bind with their shapes")
        arg_dict = collections.OrderedDict()
        for n in names:
            a = args.get(n)
            if a is None and n not in variables:
                a = cls._param_array(symbol, n, device)
            if a is not None and a.device != device:
                raise DeviceError(f"bind: argument '{n}' is on {a.device} but the executor runs on {device}; "
                                  f"move it with .as_in_context({device})")
            if a is not None:
                arg_dict[n] = a
        return cls(symbol, device, arg_dict)

    # -- running ----------------------------------------------------------------------------------

    @property
    def arg_arrays(self):
        return list(self.arg_dict.values())

    @property
    def aux_arrays(self):
        return []

    @property
    def output_dict(self):
        return collections.OrderedDict(zip(self._symbol.list_outputs(), self.outputs))

    def _compiled(self):
        sym = self._symbol
        variables = list(sym._vars())
        shapes = {n: tuple(self.arg_dict[n].shape) for n in variables}
        t = sym._graph(shapes, "forward")
        missing = [n for n in t.param_names if n not in self.arg_dict and not n.startswith("const")]
        if missing:
            raise ArgumentError(f"Executor.forward: no array for the argument(s) {missing}; bind them, or "
                                f"initialize the blocks' parameters")
        # Tensors the trace captured that are no parameter ('const0', ...) are the graph's own.
        params = [self.arg_dict[n] if n in self.arg_dict else c if c.device == self._device
                  else c.as_in_context(self._device) for n, c in zip(t.param_names, t.captured)]
        if self._plan is None or self._plan[0] is not t or any(a is not b for a, b in zip(self._plan[1], params)):
            graph = _C.parse_graph_json(t.tojson()).compile(params, self._device)
            self._plan = (t, params, graph)
        return t, self._plan[2]

    def forward(self, is_train=False, **kwargs):
        """Runs the graph; `kwargs` replace data inputs (or parameters) by name first. Returns
        (and keeps in .outputs) the outputs as a list of NDArrays."""
        if is_train:
            raise StateError("Executor.forward(is_train=True): an Executor runs the inference graph and computes "
                             "no gradients; train "
                             "the blocks with autograd.record(), or make nn.SymbolBlock(outputs, inputs)")
        for k, v in kwargs.items():
            if k not in self.arg_dict and k not in self._symbol.list_arguments():
                raise ArgumentError(f"Executor.forward: '{k}' is not an argument; the arguments are "
                                    f"{self._symbol.list_arguments()}")
            if not isinstance(v, _C.NDArray):
                raise ArgumentError(f"Executor.forward: '{k}' must be an NDArray, got {type(v).__name__}")
            old = self.arg_dict.get(k)
            if old is not None and len(old.shape) != len(v.shape):
                raise ShapeError(f"Executor.forward: '{k}' has shape {tuple(v.shape)}, the executor was bound "
                                 f"with rank-{len(old.shape)} {tuple(old.shape)}")
            self.arg_dict[k] = v if v.device == self._device else v.as_in_context(self._device)
        t, graph = self._compiled()
        self.outputs = list(graph([self.arg_dict[n] for n in t.input_names]))
        return self.outputs

    def backward(self, out_grads=None, is_train=True):
        raise StateError("Executor.backward: an Executor computes no gradients; train the blocks with "
                         "autograd.record() and a Trainer, or make nn.SymbolBlock(outputs, inputs)")

    def __repr__(self):
        return f"<Executor of {self._symbol!r} on {self._device}>"
