"""Recording and differentiation, as mxnet.autograd: record(), pause(), backward(), grad()."""
from . import _C
from ._C import is_recording, is_training, set_training

__all__ = ["record", "pause", "train_mode", "predict_mode", "is_recording", "is_training",
           "backward", "grad", "mark_variables"]


def record(train_mode=True):
    """Records the ops run inside the `with` block for a later backward()."""
    return _C._AutogradScope(True, train_mode)


def pause(train_mode=False):
    """Stops recording inside the `with` block."""
    return _C._AutogradScope(False, train_mode)


class _TrainingScope:
    def __init__(self, training):
        self._training = training

    def __enter__(self):
        self._prev = set_training(self._training)

    def __exit__(self, *exc):
        set_training(self._prev)
        return False


def train_mode():
    """Layers behave as in training (dropout, batch statistics) without changing recording."""
    return _TrainingScope(True)


def predict_mode():
    return _TrainingScope(False)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def backward(heads, head_grads=None, retain_graph=False, train_mode=True):
    """Computes the gradients of `heads` into the .grad of every array with attach_grad()."""
    heads = _as_list(heads)
    if head_grads is not None:
        head_grads = _as_list(head_grads)
        if len(head_grads) != len(heads):
            raise ValueError(f"backward: {len(heads)} heads but {len(head_grads)} head gradients")
    _C.backward(heads, head_grads, retain_graph)


def grad(heads, variables, head_grads=None, retain_graph=False, create_graph=False, train_mode=True):
    """Returns d(heads)/d(variables) without touching .grad."""
    if create_graph:
        raise NotImplementedError("grad(create_graph=True): higher-order gradients are not supported yet")
    single = not isinstance(variables, (list, tuple))
    out = _C.grad(_as_list(heads), _as_list(variables),
                  None if head_grads is None else _as_list(head_grads), retain_graph)
    return out[0] if single else out


def mark_variables(variables, gradients=None, grad_reqs="write"):
    """Attaches gradient buffers to `variables` (MXNet's name for attach_grad on many arrays).

    `gradients`, when given, holds one array per variable of the variable's shape and dtype; its
    values start the buffer (they matter for grad_reqs='add'). The buffer itself is `v.grad`.
    """
    variables = _as_list(variables)
    for i, v in enumerate(variables):
        if not isinstance(v, _C.NDArray):
            raise TypeError(f"mark_variables: variables[{i}] must be an NDArray, found {type(v).__name__}")
    if isinstance(grad_reqs, (list, tuple)):
        reqs = list(grad_reqs)
        if len(reqs) != len(variables):
            raise _C.ArgumentError(f"mark_variables: {len(variables)} variables but {len(reqs)} grad_reqs; "
                                   "give one grad_req per variable or a single string")
    else:
        reqs = [grad_reqs] * len(variables)
    if gradients is not None:
        gradients = _as_list(gradients)
        if len(gradients) != len(variables):
            raise _C.ArgumentError(f"mark_variables: {len(variables)} variables but {len(gradients)} gradients; "
                                   "give one gradient array per variable")
        for i, (v, g) in enumerate(zip(variables, gradients)):
            if not isinstance(g, _C.NDArray):
                raise TypeError(f"mark_variables: gradients[{i}] must be an NDArray, found {type(g).__name__}")
            if tuple(g.shape) != tuple(v.shape):
                raise _C.ShapeError(f"mark_variables: gradients[{i}] has shape {tuple(g.shape)} but variables[{i}] "
                                    f"has shape {tuple(v.shape)}; a gradient has its variable's shape")
            if g._dtype_name != v._dtype_name:
                raise _C.DTypeError(f"mark_variables: gradients[{i}] has dtype {g._dtype_name} but variables[{i}] "
                                    f"has dtype {v._dtype_name}; a gradient has its variable's dtype")
    for v, r in zip(variables, reqs):
        v.attach_grad(r)
    if gradients is not None:
        for v, g in zip(variables, gradients):
            if v.grad is not None:
                g.copyto(v.grad)
