"""kiln.Trainer: applies an optimizer to a set of Parameters, as gluon.Trainer.

    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch_size)

With several devices (net.initialize(device=[...])) or several processes (kiln.distributed under
mpirun), step() first sums every gradient over the devices and processes, through a KVStore
(`kvstore=`, 'device' by default, 'dist_sync' automatically once kiln.distributed runs with more
than one process). The gradients are grouped into buckets of about `bucket_mb` megabytes
(KILN_BUCKET_MB, default 25) in reverse order of the parameters, which is the order backward
produces them; each bucket is one collective, queued on the engine at once, so it starts the
moment the backward tasks writing its gradients finish and overlaps the rest of the backward.
Then every parameter whose grad_req is not 'null' is updated with ONE fused optimizer call per
device (one engine task per device per step). Gradients are scaled by 1/batch_size inside that
call.

A parameter that got no gradient since the last step (not used in the loss, or backward not
called) is named in an error instead of being updated with a stale gradient, as in Gluon;
ignore_stale_grad=True skips it instead. Code that writes a gradient by hand marks it with
`arr._fresh_grad = True` (on the parameter's data array).

A Parameter is anything with: name, grad_req ('write' | 'add' | 'null'), lr_mult, wd_mult,
list_data() and list_grad() (one NDArray per device, in the same device order for every
parameter).

What it does not do: update_on_kvstore=True (updates always run on every device after the
sum), gradient compression, or zeroing gradients after a step (grad_req 'add' accumulates until
the caller zeroes them).
"""
import os
import pickle

from . import _C
from . import optim as _optim

__all__ = ["Trainer"]


class Trainer:
    """Updates `params` (a dict name -> Parameter, such as a ParameterDict, or a list of
    Parameters) with `optimizer` (an Optimizer, or a name for kiln.optim.create with
    `optimizer_params`)."""

    def __init__(self, params, optimizer, optimizer_params=None, kvstore="device", update_on_kvstore=None,
                 compression_params=None, bucket_mb=None):
        names = None  # structural names ('0.weight') when given a dict, for messages
        if hasattr(params, "values") and callable(params.values):
            names = [str(k) for k in params.keys()]
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
        self._names = names or [str(getattr(p, "name", i)) for i, p in enumerate(self._params)]
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
        if update_on_kvstore:
            raise ValueError("Trainer: update_on_kvstore=True is not supported; kiln sums the gradients "
                             "and then updates on every device (leave update_on_kvstore None or False)")
        if compression_params:
            raise ValueError("Trainer: gradient compression is not supported; pass compression_params=None")
        if bucket_mb is None:
            bucket_mb = float(os.environ.get("KILN_BUCKET_MB", "25"))
        if not bucket_mb > 0:
            raise ValueError(f"Trainer: bucket_mb must be positive, got {bucket_mb}")
        self._bucket_bytes = int(bucket_mb * (1 << 20))
        self._kvstore_arg = kvstore
        self._kv = None
        self._buckets = None  # (signature, [[parameter index, ...], ...])

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

    @property
    def kvstore(self):
        """The KVStore that sums gradients (None until a step needs one)."""
        return self._kv

    def step(self, batch_size, ignore_stale_grad=False):
        """Sums gradients across devices and processes, then updates with gradients scaled by
        1/batch_size."""
        if batch_size <= 0:
            raise ValueError(f"Trainer.step: batch_size must be positive, got {batch_size}")
        self.allreduce_grads(ignore_stale_grad)
        self.update(batch_size, ignore_stale_grad)

    def allreduce_grads(self, ignore_stale_grad=False):
        """Sums each parameter's gradients over its devices (and processes), in place on every
        device, one bucket of gradients per collective (nothing to do on one device and one
        process)."""
        trainable = self._trainable()
        self._check_fresh(trainable, ignore_stale_grad)
        kv = self._store(trainable)
        if kv is None:
            return
        grads = [p.list_grad() for _, p in trainable]
        for bucket in self._bucket_plan(trainable, grads):
            groups = [[grads[j][d] for j in bucket] for d in range(len(grads[bucket[0]]))]
            kv.allreduce_groups(groups, [self._names[trainable[j][0]] for j in bucket])

    def _store(self, trainable):
        if self._kv is not None:
            return self._kv
        ndev = max((len(p.list_data()) for _, p in trainable), default=1)
        arg = self._kvstore_arg
        from . import kvstore as _kvstore
        if isinstance(arg, _kvstore.KVStore):
            self._kv = arg
            return arg
        dist = False
        import sys
        if "kiln.distributed" in sys.modules:  # only when the user started it
            d = sys.modules["kiln.distributed"]
            dist = d.is_initialized() and d.size() > 1
        if ndev < 2 and not dist and not (isinstance(arg, str) and arg.startswith("dist")):
            return None  # nothing to sum
        kind = arg if isinstance(arg, str) else "device"
        if dist and not kind.startswith("dist"):
            kind = "dist_sync"
        self._kv = _kvstore.create(kind)
        return self._kv

    def _bucket_plan(self, trainable, grads):
        """Buckets of indices into `trainable`, last parameters first, each about bucket_mb."""
        sig = tuple((i, tuple(g[0].shape), g[0]._dtype_name, len(g)) for (i, _), g in zip(trainable, grads))
        if self._buckets is not None and self._buckets[0] == sig:
            return self._buckets[1]
        for (_, p), g in zip(trainable, grads):
            if len(g) != len(grads[0]):
                raise ValueError(f"Trainer: parameter '{p.name}' lives on {len(g)} devices but "
                                 f"'{trainable[0][1].name}' on {len(grads[0])}; initialize every "
                                 "parameter on the same devices")
        buckets, current, size = [], [], 0
        for j in reversed(range(len(trainable))):
            nbytes = grads[j][0].size * _itemsize(grads[j][0])
            if current and size + nbytes > self._bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(j)
            size += nbytes
        if current:
            buckets.append(current)
        self._buckets = (sig, buckets)
        return buckets

    def _check_fresh(self, trainable, ignore_stale_grad):
        if ignore_stale_grad:
            return
        stale = []
        for i, p in trainable:
            datas = p.list_data()
            fresh = [w._fresh_grad for w in datas]
            if not any(fresh):
                stale.append(f"'{self._names[i]}'")
            elif not all(fresh):
                # A device that got no samples (an uneven last batch split over more devices than
                # samples) adds nothing to the sum.
                grads = p.list_grad()
                from . import nd
                for w, g, f in zip(datas, grads, fresh):
                    if not f:
                        if p.grad_req == "write":  # 'add' keeps what it accumulated
                            nd.zeros(g.shape, g._dtype_name, g.device).copyto(g)
                        w._fresh_grad = True
        if stale:
            raise _C.StateError(
                "Trainer.step: no gradient was computed for " + ", ".join(stale[:8]) +
                (f" and {len(stale) - 8} more" if len(stale) > 8 else "") +
                " since the last step: call backward() on a loss that uses them first; if they "
                "take no part in this loss, set their grad_req='null' or pass ignore_stale_grad=True")

    def update(self, batch_size, ignore_stale_grad=False):
        """Updates the parameters from their gradients (without allreduce_grads), scaling the
        gradients by 1/batch_size: one fused optimizer call per device."""
        if batch_size <= 0:
            raise ValueError(f"Trainer.step: batch_size must be positive, got {batch_size}")
        opt = self._optimizer
        opt.rescale_grad = self._scale / batch_size
        self._check_fresh(self._trainable(), ignore_stale_grad)
        per_device = {}  # device -> (indices, weights, grads, states), in first-seen order
        indices = []
        for i, p in self._trainable():
            datas, grads = p.list_data(), p.list_grad()
            fresh = [w._fresh_grad for w in datas]
            for w in datas:
                w._fresh_grad = False
            if ignore_stale_grad and not all(fresh):
                continue  # no gradient since the last step: left as it is
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


def _itemsize(a):
    import numpy as np
    return np.dtype(a._dtype_name).itemsize if a._dtype_name != "bfloat16" else 2
