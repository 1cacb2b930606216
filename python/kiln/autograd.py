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
    """Attaches gradient buffers to `variables` (MXNet's name for attach_grad on many arrays)."""
    variables = _as_list(variables)
    reqs = grad_reqs if isinstance(grad_reqs, (list, tuple)) else [grad_reqs] * len(variables)
    for v, r in zip(variables, reqs):
        v.attach_grad(r)
