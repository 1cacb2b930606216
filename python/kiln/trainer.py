"""kiln.Trainer: applies an optimizer to a set of Parameters, as gluon.Trainer.

    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch_size)

step() sums the gradients of parameters held on several devices (allreduce_grads), then updates
every parameter whose grad_req is not 'null' with ONE fused optimizer call per device (one engine
task per device per step). Gradients are scaled by 1/batch_size inside that call.

A Parameter is anything with: name, grad_req ('write' | 'add' | 'null'), lr_mult, wd_mult,
list_data() and list_grad() (one NDArray per device, in the same device order for every
parameter).

What it does not do: kvstores or distributed training, update_on_kvstore, stale-gradient
detection (ignore_stale_grad is accepted for compatibility and has no effect), or zeroing
gradients after a step (grad_req 'add' accumulates until the caller zeroes them).
"""
import pickle

from . import _C
from . import optim as _optim

__all__ = ["Trainer"]


class Trainer:
    """Updates `params` (a dict name -> Parameter, such as a ParameterDict, or a list of
    Parameters) with `optimizer` (an Optimizer, or a name for kiln.optim.create with
    `optimizer_params`)."""

    def __init__(self, params, optimizer, optimizer_params=None):
        if hasattr(params, "values") and callable(params.values):
            params = list(params.values())
        elif not isinstance(params, (list, tuple)):
            raise TypeError("Trainer: params must be a dict of Parameters (e.g. net.collect_params()) "
                            f"or a list of Parameters, got {type(params).__name__}")
        self._params = []
        seen = set()
        for p in params:
            if not (hasattr(p, "list_data") and hasattr(p, "list_grad") and hasattr(p, "grad_req")):
                raise TypeError("Trainer: every parameter must be a Parameter (with list_data, "
                                f"list_grad and grad_req), got {type(p).__name__}")
            if id(p) in seen:
                raise ValueError(f"Trainer: parameter '{getattr(p, 'name', p)}' is listed twice")
            seen.add(id(p))
            self._params.append(p)
        if isinstance(optimizer, _optim.Optimizer):
            if optimizer_params:
                raise ValueError("Trainer: optimizer_params must be None when optimizer is an "
                                 "Optimizer instance; set them on the instance")
            self._optimizer = optimizer
        else:
            self._optimizer = _optim.create(optimizer, **(optimizer_params or {}))
        self._optimizer.param_dict = dict(enumerate(self._params))
        self._scale = self._optimizer.rescale_grad
        self._states = {}  # (index, device) -> tuple of NDArrays

    # ---- learning rate ----

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def learning_rate(self):
        return self._optimizer.learning_rate

    def set_learning_rate(self, lr):
        """Sets the optimizer's learning rate; the next step uses it."""
        self._optimizer.set_learning_rate(lr)

    # ---- steps ----

    def step(self, batch_size, ignore_stale_grad=False):
        """Sums gradients across devices, then updates with gradients scaled by 1/batch_size."""
        self.allreduce_grads()
        self.update(batch_size, ignore_stale_grad)

    def allreduce_grads(self):
        """Sums each parameter's gradients over its devices, in place on every device (a no-op
        for parameters held on one device)."""
        for _, p in self._trainable():
            grads = p.list_grad()
            if len(grads) < 2:
                continue
            total = grads[0].copy()
            for g in grads[1:]:
                total += g.as_in_context(total.device)
            for g in grads:
                total.copyto(g)

    def update(self, batch_size, ignore_stale_grad=False):
        """Updates the parameters from their gradients (without allreduce_grads), scaling the
        gradients by 1/batch_size: one fused optimizer call per device."""
        if batch_size <= 0:
            raise ValueError(f"Trainer.step: batch_size must be positive, got {batch_size}")
        opt = self._optimizer
        opt.rescale_grad = self._scale / batch_size
        per_device = {}  # device -> (indices, weights, grads, states), in first-seen order
        indices = []
        for i, p in self._trainable():
            datas, grads = p.list_data(), p.list_grad()
            if len(datas) != len(grads):
                raise ValueError(f"Trainer: parameter '{p.name}' has {len(datas)} data arrays but "
                                 f"{len(grads)} gradients")
            indices.append(i)
            for w, g in zip(datas, grads):
                key = (i, w.device)
                if key not in self._states:
                    self._states[key] = tuple(opt.create_state(i, w))
                group = per_device.setdefault(w.device, ([], [], [], []))
                group[0].append(i), group[1].append(w), group[2].append(g)
                group[3].append(self._states[key])
        if not indices:
            return
        opt.increment(indices)
        for ids, ws, gs, ss in per_device.values():
            opt.fused_update(ids, ws, gs, ss)

    def _trainable(self):
        return [(i, p) for i, p in enumerate(self._params) if p.grad_req != "null"]

    # ---- states ----

    def save_states(self, fname):
        """Saves the optimizer's states and step counts (to load into a Trainer over the same
        parameters)."""
        _C.waitall()
        opt = self._optimizer
        blob = {
            "states": {(i, repr(d)): [s.asnumpy() for s in st] for (i, d), st in self._states.items()},
            "num_update": opt.num_update,
            "index_update_count": dict(opt._index_update_count),
            "lr": opt.lr,
        }
        with open(fname, "wb") as f:
            pickle.dump(blob, f)

    def load_states(self, fname):
        """Loads states saved by save_states onto the devices of this Trainer's parameters."""
        with open(fname, "rb") as f:
            blob = pickle.load(f)
        opt = self._optimizer
        opt.num_update = blob["num_update"]
        opt._index_update_count = dict(blob["index_update_count"])
        opt.lr = blob["lr"]
        saved = blob["states"]
        self._states = {}
        for i, p in enumerate(self._params):
            for w in p.list_data():
                arrays = saved.get((i, repr(w.device)))
                if arrays is None:
                    continue
                self._states[(i, w.device)] = tuple(_C.array(a, a.dtype, w.device) for a in arrays)
