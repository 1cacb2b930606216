"""kiln.Trainer: applies an optimizer to a set of Parameters, as gluon.Trainer.

    trainer = kiln.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch_size)

With several devices (net.initialize(device=[...])) or several processes (kiln.distributed under
mpirun), step() first sums every gradient over the devices and processes, through a KVStore
(`kvstore=`, 'device' by default, 'dist_sync' automatically once kiln.distributed runs with more
than one process; unlike Gluon, None sums over the devices too, since the copies of a parameter
must stay equal). Across processes, the first step first gives every process rank 0's parameters. The gradients are grouped into buckets of about `bucket_mb` megabytes
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
            text = _C.env_switch("KILN_BUCKET_MB")  # the switch table's value or default
            try:
                bucket_mb = float(text)
            except ValueError:
                raise ValueError(f"KILN_BUCKET_MB={text!r} is not a number; set it to the megabytes of "
                                 f"gradients summed in one collective, e.g. 25") from None
        if not bucket_mb > 0:
            raise ValueError(f"Trainer: bucket_mb must be positive, got {bucket_mb}")
        self._bucket_bytes = int(bucket_mb * (1 << 20))
        from . import kvstore as _kvstore
        if not (kvstore is None or isinstance(kvstore, _kvstore.KVStore) or kvstore in _kvstore._KINDS):
            raise ValueError(f"Trainer: kvstore must be None, a KVStore or one of "
                             f"{', '.join(map(repr, _kvstore._KINDS))}; got {kvstore!r}")
        self._kvstore_arg = kvstore
        self._kv = None
        self._synced = False  # parameters taken from rank 0 (several processes)
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
        kv = self._store(trainable)
        self._check_fresh(trainable, ignore_stale_grad, kv)
        if kv is None:
            return
        if kv.num_workers > 1 and not self._synced:
            self._sync_parameters(kv)
        grads = [p.list_grad() for _, p in trainable]
        buckets, new = self._bucket_plan(trainable, grads)
        for bucket in buckets:
            groups = [[grads[j][d] for j in bucket] for d in range(len(grads[bucket[0]]))]
            # Processes compare the whole plan once (bucket by bucket) when it is new.
            kv.allreduce_groups(groups, [self._names[trainable[j][0]] for j in bucket], check=new)

    def _sync_parameters(self, kv):
        """Before the first update across processes, every process takes rank 0's parameters (as
        Gluon's kvstore init does), and every device of a process its first device's."""
        from . import distributed
        params = list(self._params)
        firsts = [p.list_data()[0] for p in params]
        if firsts:
            distributed.broadcast(firsts, root=0)
            ndev = len(params[0].list_data())
            if ndev > 1 and all(len(p.list_data()) == ndev for p in params):
                _C.broadcast([[p.list_data()[d] for p in params] for d in range(ndev)], 0)
        self._synced = True

    def _store(self, trainable):
        if self._kv is not None:
            return self._kv
        ndev = max((len(p.list_data()) for _, p in trainable), default=1)
        arg = self._kvstore_arg
        from . import kvstore as _kvstore
        dist = False
        import sys
        if "kiln.distributed" in sys.modules:  # only when the user started it
            d = sys.modules["kiln.distributed"]
            dist = d.is_initialized() and d.size() > 1
        if isinstance(arg, _kvstore.KVStore):
            if dist and not arg.type.startswith("dist"):
                raise ValueError(f"Trainer: kiln.distributed runs {sys.modules['kiln.distributed'].size()} "
                                 f"processes but the kvstore given is {arg.type!r}, which sums within this "
                                 "process only; pass kvstore='dist_sync' (or the default)")
            self._kv = arg
            return arg
        if ndev < 2 and not dist and not (isinstance(arg, str) and arg.startswith("dist")):
            return None  # nothing to sum
        kind = arg if isinstance(arg, str) else "device"
        if dist and not kind.startswith("dist"):
            kind = "dist_sync"
        self._kv = _kvstore.create(kind)
        return self._kv

    def _bucket_plan(self, trainable, grads):
        """Buckets of indices into `trainable`, last parameters first, each about bucket_mb and of
        one dtype; and whether the plan is new."""
        sig = tuple((i, tuple(g[0].shape), g[0]._dtype_name, len(g)) for (i, _), g in zip(trainable, grads))
        if self._buckets is not None and self._buckets[0] == sig:
            return self._buckets[1], False
        for (i, p), g in zip(trainable, grads):
            if len(g) != len(grads[0]):
                raise ValueError(f"Trainer: parameter '{self._names[i]}' lives on {len(g)} devices but "
                                 f"'{self._names[trainable[0][0]]}' on {len(grads[0])}; initialize every "
                                 "parameter on the same devices")
        buckets, current, size = [], [], 0
        for j in reversed(range(len(trainable))):
            g = grads[j][0]
            nbytes = g.size * _itemsize(g)
            if current and (size + nbytes > self._bucket_bytes or g._dtype_name != grads[current[0]][0]._dtype_name):
                buckets.append(current)
                current, size = [], 0
            current.append(j)
            size += nbytes
        if current:
            buckets.append(current)
        self._buckets = (sig, buckets)
        return buckets, True

    def _check_fresh(self, trainable, ignore_stale_grad, kv=None):
        """Raises for parameters that got no gradient on any device since the last step (or,
        with ignore_stale_grad, returns their indices: they are not updated). A device that got
        no gradient while others did (an uneven last batch split over more devices than samples)
        counts as a zero gradient."""
        stale, names = set(), []
        from . import nd
        for i, p in trainable:
            datas = p.list_data()
            fresh = [w._fresh_grad for w in datas]
            if all(fresh):
                continue
            if not any(fresh):
                stale.add(i)
                names.append(f"'{self._names[i]}'")
                continue
            for w, g, f in zip(datas, p.list_grad(), fresh):
                if not f:
                    if p.grad_req == "write":  # 'add' keeps what it accumulated
                        nd.zeros(g.shape, g._dtype_name, g.device).copyto(g)
                    w._fresh_grad = True
        if names and not ignore_stale_grad:
            raise _C.StateError(
                "Trainer.step: no gradient was computed for " + ", ".join(names[:8]) +
                (f" and {len(names) - 8} more" if len(names) > 8 else "") +
                " since the last step: call backward() on a loss that uses them first; if they "
                "take no part in this loss, set their grad_req='null' or pass ignore_stale_grad=True")
        if stale and kv is not None and kv.num_workers > 1:
            # Across processes every rank must update alike: a stale gradient counts as zero.
            for i, p in trainable:
                if i in stale:
                    for w, g in zip(p.list_data(), p.list_grad()):
                        if p.grad_req == "write":
                            nd.zeros(g.shape, g._dtype_name, g.device).copyto(g)
                        w._fresh_grad = True
            stale = set()
        return stale

    def update(self, batch_size, ignore_stale_grad=False):
        """Updates the parameters from their gradients (without allreduce_grads), scaling the
        gradients by 1/batch_size: one fused optimizer call per device (and dtype)."""
        if batch_size <= 0:
            raise ValueError(f"Trainer.step: batch_size must be positive, got {batch_size}")
        opt = self._optimizer
        opt.rescale_grad = self._scale / batch_size
        stale = self._check_fresh(self._trainable(), ignore_stale_grad, self._kv)
        per_device = {}  # (device, dtype) -> (indices, weights, grads, states), in first-seen order
        indices = []
        for i, p in self._trainable():
            datas, grads = p.list_data(), p.list_grad()
            for w in datas:
                w._fresh_grad = False
            if i in stale:
                continue  # ignore_stale_grad: no gradient since the last step, left as it is
            if len(datas) != len(grads):
                raise ValueError(f"Trainer: parameter '{p.name}' has {len(datas)} data arrays but "
                                 f"{len(grads)} gradients")
            indices.append(i)
            for w, g in zip(datas, grads):
                key = (i, w.device)
                if key not in self._states:
                    self._states[key] = tuple(opt.create_state(i, w))
                group = per_device.setdefault((w.device, w._dtype_name), ([], [], [], []))
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
        _C.write_file_atomic(os.fspath(fname), pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))

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
