"""kiln.optim: optimizers in the manner of mxnet.optimizer (SGD, Adam, AdamW).

An optimizer holds the hyperparameters, the learning-rate schedule and the per-parameter step
counts; the update itself is one fused call (kiln._C.sgd_update / adam_update) for all the
parameters of a device, which queues one engine task. States (momentum, Adam's moments) are
NDArrays of zeros like each weight, created on first use by the caller (kiln.Trainer) through
create_state().

    opt = kiln.optim.create("sgd", learning_rate=0.1, momentum=0.9)
    trainer = kiln.Trainer(net.collect_params(), opt)

What it does not do: multi-precision (float16 weights with float32 master copies), sparse
gradients, or optimizers beyond SGD/Adam/AdamW.
"""
from . import _C

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "create", "register"]

_registry = {}


def register(cls):
    """Makes `cls` available to create() under its lower-cased class name."""
    _registry[cls.__name__.lower()] = cls
    return cls


def create(name, **kwargs):
    """The optimizer registered as `name` ('sgd', 'adam', 'adamw'), built with kwargs."""
    key = name.lower()
    if key not in _registry:
        raise ValueError(f"unknown optimizer '{name}'; expected one of {sorted(_registry)}")
    return _registry[key](**kwargs)


class Optimizer:
    """Base of kiln's optimizers.

    learning_rate: the base rate (or lr_scheduler(num_update) when a scheduler is given).
    wd: weight decay (L2), scaled per parameter by its wd_mult.
    rescale_grad: gradients are multiplied by this first (kiln.Trainer sets 1/batch_size).
    clip_gradient: clips rescaled gradients to [-clip, clip]; None disables clipping.
    lr_scheduler: optional callable num_update -> learning rate.
    """

    def __init__(self, learning_rate=0.01, wd=0.0, rescale_grad=1.0, clip_gradient=None,
                 lr_scheduler=None, param_dict=None, begin_num_update=0):
        self.lr = float(learning_rate)
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        self.clip_gradient = clip_gradient
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is not None and hasattr(lr_scheduler, "base_lr"):
            lr_scheduler.base_lr = self.lr
        self.param_dict = dict(param_dict or {})  # index -> Parameter, for lr_mult and wd_mult
        self.num_update = begin_num_update
        self._index_update_count = {}
        self._begin_num_update = begin_num_update

    # ---- learning rate ----

    @property
    def learning_rate(self):
        """The learning rate of the current step."""
        if self.lr_scheduler is not None:
            return float(self.lr_scheduler(self.num_update))
        return self.lr

    def set_learning_rate(self, lr):
        """Sets the base learning rate (the scheduler's base_lr when there is a scheduler)."""
        if self.lr_scheduler is not None:
            if not hasattr(self.lr_scheduler, "base_lr"):
                raise ValueError("this optimizer's learning rate comes from its lr_scheduler, "
                                 "which has no base_lr to set; change the scheduler instead")
            self.lr_scheduler.base_lr = float(lr)
        self.lr = float(lr)

    # ---- per-parameter multipliers and step counts ----

    def _mults(self, indices):
        lr, wd = [], []
        for i in indices:
            p = self.param_dict.get(i)
            lr.append(float(getattr(p, "lr_mult", 1.0)))
            wd.append(float(getattr(p, "wd_mult", 1.0)))
        return lr, wd

    def _clip(self):
        return -1.0 if self.clip_gradient is None else float(self.clip_gradient)

    def increment(self, indices):
        """Counts one step for each of `indices` (once per step, whatever the number of devices)."""
        for i in indices:
            n = self._index_update_count.get(i, self._begin_num_update) + 1
            self._index_update_count[i] = n
            self.num_update = max(self.num_update, n)

    # ---- updates ----

    def create_state(self, index, weight):
        """The state of one parameter: a tuple of NDArrays (zeros like the weight), maybe empty."""
        return ()

    def update(self, indices, weights, grads, states):
        """Counts a step and updates the parameters `indices` (all on one device) in one fused call."""
        self.increment(indices)
        self.fused_update(indices, weights, grads, states)

    def fused_update(self, indices, weights, grads, states):
        """Updates the weights (one device) in place; does not count a step."""
        raise NotImplementedError(f"{type(self).__name__} does not implement fused_update")

    def __repr__(self):
        return f"{type(self).__name__}(learning_rate={self.learning_rate}, wd={self.wd})"


def _zeros_like(w):
    return _C.zeros(w.shape, w._dtype_name, w.device)


@register
class SGD(Optimizer):
    """SGD with optional momentum, in MXNet's formulation:
    g = clip(rescale_grad * grad) + wd * w;  mom = momentum * mom - lr * g;  w += mom
    (without momentum: w -= lr * g)."""

    def __init__(self, learning_rate=0.01, momentum=0.0, wd=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, wd=wd, **kwargs)
        self.momentum = float(momentum)

    def create_state(self, index, weight):
        return (_zeros_like(weight),) if self.momentum != 0 else ()

    def fused_update(self, indices, weights, grads, states):
        lr_mults, wd_mults = self._mults(indices)
        moms = [s[0] for s in states] if self.momentum != 0 else []
        _C.sgd_update(list(weights), list(grads), moms, self.learning_rate, self.momentum, self.wd,
                      self.rescale_grad, self._clip(), lr_mults, wd_mults)


@register
class Adam(Optimizer):
    """Adam with bias correction as torch.optim.Adam: wd is L2 added to the gradient."""

    _decoupled = False

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, wd=wd, **kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))  # mean, variance

    def fused_update(self, indices, weights, grads, states):
        # The bias correction needs each parameter's own step count; parameters counted alike
        # (normally all of them) share one call.
        groups = {}
        for k, i in enumerate(indices):
            groups.setdefault(self._index_update_count.get(i, max(self.num_update, 1)), []).append(k)
        for t, ks in groups.items():
            lr_mults, wd_mults = self._mults([indices[k] for k in ks])
            _C.adam_update([weights[k] for k in ks], [grads[k] for k in ks], [states[k][0] for k in ks],
                           [states[k][1] for k in ks], self.learning_rate, self.beta1, self.beta2,
                           self.epsilon, self.wd, self.rescale_grad, self._clip(), int(t),
                           self._decoupled, lr_mults, wd_mults)


@register
class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW): w -= lr * wd * w besides the Adam step."""

    _decoupled = True

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0.01, **kwargs):
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, wd=wd,
                         **kwargs)
