"""kiln.kvstore: key-value stores for data-parallel training, as mxnet.kvstore.

    kv = kiln.kvstore.create("device")
    kv.init(3, nd.zeros((2, 3)))
    kv.push(3, [nd.ones((2, 3), device=d) for d in devices])   # summed over the devices
    outs = [nd.empty((2, 3), device=d) for d in devices]
    kv.pull(3, out=outs)                                         # every device gets the sum
    kv.pushpull(3, grads)                                        # sum in place (the Trainer's path)

Kinds:
  'local'      the stored value lives on the CPU;
  'device'     it lives on the device of the first value pushed or initialized;
  'nccl'       as 'device', for GPU arrays only (NCCL carries the sums);
  'dist_sync'  (also 'dist', 'dist_sync_device', 'dist_device_sync') as 'device', then summed across
               the processes of kiln.distributed (launched by mpirun), which it initializes.

Sums among the devices of a process run as one engine task per call (kiln's collectives: a
threaded reduction over CPU devices' memory, NCCL on GPUs), summed in device order so every
device gets bit-identical results; across processes, through kiln.distributed (MPI or NCCL).
Every call returns at once; reading a result waits for it.

With set_optimizer, push applies the optimizer to the stored weight with the summed gradient
(update on the store), and pull returns the updated weight.

What it does not do: asynchronous 'dist_async' training, parameter-server processes, sparse
(row_sparse) values, gradient compression.
"""
import numbers
import os
import pickle

from . import _C

__all__ = ["create", "KVStore"]

_KINDS = ("local", "device", "nccl", "dist_sync", "dist", "dist_sync_device", "dist_device_sync")


def create(name="local"):
    """A new KVStore of kind `name` ('local', 'device', 'nccl' or 'dist_sync')."""
    if isinstance(name, KVStore):
        return name
    if not isinstance(name, str) or name not in _KINDS:
        raise ValueError(f"kvstore.create: unknown kind {name!r}; use one of {', '.join(map(repr, _KINDS))}"
                         " ('dist_async' and parameter servers are not supported)")
    return KVStore(name)


def _is_array(x):
    return isinstance(x, _C.NDArray)


def _same(a, b):
    """The same array (views handed out again, e.g. by Parameter.list_grad(), count)."""
    return a is b or (a._shares_storage(b) and tuple(a.shape) == tuple(b.shape))


class KVStore:
    """A store of arrays under int or str keys, summed over devices (and processes for dist)."""

    def __init__(self, kind="local"):
        if kind not in _KINDS:
            raise ValueError(f"KVStore: unknown kind {kind!r}; use kiln.kvstore.create")
        self._kind = kind
        self._dist = kind.startswith("dist")
        self._store = {}     # key -> NDArray
        self._optimizer = None
        self._states = {}    # key -> optimizer state tuple
        self._index = {}     # key -> optimizer index
        if self._dist:
            from . import distributed
            distributed.init()

    # ---- identity ----

    @property
    def type(self):
        return self._kind

    @property
    def rank(self):
        if not self._dist:
            return 0
        from . import distributed
        return distributed.rank()

    @property
    def num_workers(self):
        if not self._dist:
            return 1
        from . import distributed
        return distributed.size()

    def __repr__(self):
        return f"KVStore({self._kind!r}, keys={len(self._store)}, workers={self.num_workers})"

    # ---- the operations ----

    def init(self, key, value):
        """Stores `value` (an NDArray, or a list of them on several devices: the first is taken)
        under `key`; a list of keys takes a list of values. With dist kinds every process starts
        from rank 0's value."""
        for k, vals in self._pairs("init", key, value):
            if k in self._store:
                raise ValueError(f"KVStore.init: key {k!r} is already initialized; each key is "
                                 "initialized once")
            v = vals[0]
            dev = _C.cpu() if self._kind == "local" else v.device
            stored = v.copyto(dev)
            if self._dist and self.num_workers > 1:
                from . import distributed
                distributed.broadcast([stored], root=0)
            self._store[k] = stored

    def push(self, key, value, priority=0):
        """Sums `value` (an NDArray or a list of them on distinct devices) over the devices, and
        over the processes for dist kinds, into the stored value of `key` (replacing it, or
        updating it with the optimizer after set_optimizer). A list of keys takes a list of
        values."""
        for k, vals in self._pairs("push", key, value):
            stored = self._stored(k, "push")
            self._check_like(k, stored, vals, "push")
            total = self._sum(k, vals, stored.device)
            if self._optimizer is not None:
                self._update(k, stored, total)
            else:
                total.copyto(stored)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copies the stored value of `key` into `out` (an NDArray or a list of them)."""
        if out is None:
            raise ValueError("KVStore.pull: pass out= (the arrays to copy the stored value into)")
        for k, outs in self._pairs("pull", key, out):
            stored = self._stored(k, "pull")
            self._check_like(k, stored, outs, "pull")
            for o in outs:
                stored.copyto(o)

    def pushpull(self, key, value, out=None, priority=0):
        """push then pull in one step: the stored value becomes the sum, and so does `out` (or
        `value` itself when out is None). Without an optimizer, values summed in place take one
        collective for all keys together."""
        if self._optimizer is not None:
            self.push(key, value, priority)
            self.pull(key, value if out is None else out, priority)
            return
        pairs = self._pairs("pushpull", key, value)
        outs = [o for _, o in self._pairs("pushpull", key, out)] if out is not None else [v for _, v in pairs]
        if len(outs) != len(pairs):
            raise ValueError(f"KVStore.pushpull: {len(pairs)} keys but {len(outs)} outputs")
        inplace = []
        for (k, vals), os_ in zip(pairs, outs):
            stored = self._stored(k, "pushpull")
            self._check_like(k, stored, vals, "pushpull")
            self._check_like(k, stored, os_, "pushpull")
            if len(os_) != len(vals) and len(os_) != 1:
                raise ValueError(f"KVStore.pushpull: key {k!r} has {len(vals)} values but {len(os_)} "
                                 "outputs; pass one output per value, or one")
            if len(os_) == len(vals) and all(_same(o, v) for o, v in zip(os_, vals)):
                inplace.append((k, vals))
            else:
                total = self._sum(k, vals, stored.device)
                total.copyto(stored)
                for o in os_:
                    total.copyto(o)
        if inplace:
            ndev = len(inplace[0][1])
            if any(len(v) != ndev for _, v in inplace):
                raise ValueError("KVStore.pushpull: keys pushed together must have values on the same "
                                 "number of devices")
            self.allreduce_groups([[v[d] for _, v in inplace] for d in range(ndev)], [k for k, _ in inplace])
            for k, vals in inplace:
                vals[0].copyto(self._store[k])

    def allreduce_groups(self, groups, names=None, check=True):
        """Sums in place: groups[d] is the list of arrays of device d (the same shapes on every
        device). Over the devices as one collective, then over the processes for dist kinds.
        With `check`, processes first compare what they are about to sum (names, shapes, dtypes)
        and fail with the difference instead of hanging; the Trainer checks each new plan once."""
        if len(groups) > 1:
            _C.allreduce(groups, "sum")
        if self._dist and self.num_workers > 1:
            from . import distributed
            names = list(names) if names is not None else list(range(len(groups[0])))
            if check:  # ranks must reduce the same arrays in the same order
                distributed.check_schedule([(str(n), tuple(a.shape), a._dtype_name)
                                            for n, a in zip(names, groups[0])])
            distributed.allreduce(groups[0], "sum")
            if len(groups) > 1:
                _C.broadcast(groups, 0)

    # ---- update on the store ----

    def set_optimizer(self, optimizer):
        """Updates stored values on push with `optimizer` (a kiln.optim.Optimizer)."""
        from . import optim
        if not isinstance(optimizer, optim.Optimizer):
            raise TypeError(f"KVStore.set_optimizer: expected a kiln.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizer = optimizer
        self._states = {}

    def save_optimizer_states(self, fname):
        """Saves the optimizer's states (after set_optimizer)."""
        if self._optimizer is None:
            raise ValueError("KVStore.save_optimizer_states: no optimizer; call set_optimizer first")
        _C.waitall()
        blob = {"states": {k: [s.asnumpy() for s in st] for k, st in self._states.items()},
                "index": dict(self._index), "num_update": self._optimizer.num_update}
        _C.write_file_atomic(os.fspath(fname), pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))

    def load_optimizer_states(self, fname):
        if self._optimizer is None:
            raise ValueError("KVStore.load_optimizer_states: no optimizer; call set_optimizer first")
        with open(fname, "rb") as f:
            blob = pickle.load(f)
        self._index = dict(blob["index"])
        self._optimizer.num_update = blob["num_update"]
        self._states = {}
        for k, arrays in blob["states"].items():
            dev = self._store[k].device if k in self._store else _C.cpu()
            self._states[k] = tuple(_C.array(a, a.dtype, dev) for a in arrays)

    def _update(self, k, stored, grad):
        opt = self._optimizer
        i = self._index.setdefault(k, len(self._index))
        if k not in self._states:
            self._states[k] = tuple(opt.create_state(i, stored))
        opt.increment([i])
        opt.fused_update([i], [stored], [grad], [self._states[k]])

    # ---- helpers ----

    def _stored(self, k, op):
        if k not in self._store:
            raise ValueError(f"KVStore.{op}: key {k!r} was never initialized; call init({k!r}, value) first")
        return self._store[k]

    @staticmethod
    def _check_like(k, stored, arrays, op):
        for i, a in enumerate(arrays):
            if tuple(a.shape) != tuple(stored.shape) or a._dtype_name != stored._dtype_name:
                raise ValueError(f"KVStore.{op}: key {k!r} holds {stored._dtype_name} {tuple(stored.shape)} "
                                 f"but array {i} is {a._dtype_name} {tuple(a.shape)}")

    def _sum(self, k, vals, device):
        """The sum of `vals` over devices (and processes), as a new array on `device`."""
        devs = [v.device for v in vals]
        if len(set(map(repr, devs))) != len(devs):
            raise ValueError(f"KVStore: the values of key {k!r} must be on distinct devices, got "
                             f"{[repr(d) for d in devs]}")
        if self._kind == "nccl" and not all(d.device_type == "gpu" for d in devs):
            raise ValueError(f"KVStore('nccl'): key {k!r} has values on {[repr(d) for d in devs]}; NCCL "
                             "sums GPU arrays only: use kvstore 'device' for CPU devices")
        copies = [v.copy() for v in vals]
        self.allreduce_groups([[c] for c in copies], [k])
        on = [c for c in copies if c.device == device]
        return on[0] if on else copies[0].copyto(device)

    def _pairs(self, op, key, value):
        """[(key, [arrays])] from a key or list of keys and the matching value(s)."""
        if isinstance(key, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(key):
                raise ValueError(f"KVStore.{op}: {len(key)} keys need a list of {len(key)} values, got "
                                 f"{type(value).__name__}")
            return [(self._key(op, k), self._arrays(op, k, v)) for k, v in zip(key, value)]
        return [(self._key(op, key), self._arrays(op, key, value))]

    @staticmethod
    def _key(op, k):
        if isinstance(k, bool) or not isinstance(k, (numbers.Integral, str)):
            raise TypeError(f"KVStore.{op}: keys are ints or strings, got {type(k).__name__}")
        return int(k) if isinstance(k, numbers.Integral) else k

    @staticmethod
    def _arrays(op, k, v):
        if _is_array(v):
            return [v]
        if isinstance(v, (list, tuple)) and v and all(_is_array(a) for a in v):
            return list(v)
        raise TypeError(f"KVStore.{op}: the value of key {k!r} must be an NDArray or a non-empty list of "
                        f"NDArrays, got {type(v).__name__}")
