"""DataLoader as gluon.data.DataLoader: batches of NDArrays from a dataset, shuffled under a seed,
prepared in background threads while the model trains.

A batch is built in one vectorised step when the dataset offers it (Dataset._batch: FashionMNIST
and ArrayDataset of NumPy arrays, with or without ToTensor/Normalize), else sample by sample and
stacked (batchify_fn). Worker threads, not processes: the batch conversion runs in C++ without
the GIL, so threads overlap it with training at no pickling cost. An exception in a worker is
raised again in the caller's thread with the same type and the worker's traceback in its message
(as PyTorch's DataLoader does): the caller's own traceback says nothing about where it happened.
"""
import collections
import concurrent.futures
import math
import numbers
import threading
import traceback

import numpy as np

from .. import _C, nd
from .dataset import _as_batch_array

__all__ = ["DataLoader", "default_batchify_fn"]

_LAST_BATCH = ("keep", "discard", "rollover")


def default_batchify_fn(samples, device=None):
    """Stacks a list of samples (tuples of fields) into a tuple of NDArrays, one per field."""
    if isinstance(samples[0], tuple):
        return tuple(default_batchify_fn(list(field), device) for field in zip(*samples))
    if isinstance(samples[0], _C.NDArray):
        out = nd.stack(samples, 0)
        return out if device is None else out.to_device(device)
    return _as_batch_array(np.stack([np.asarray(s) for s in samples]), device)


class _KeyErrorMessage(str):
    """KeyError shows repr() of its argument: this message prints as itself, newlines and all."""

    def __repr__(self):
        return self


class _WorkerFailure(Exception):
    """What a worker thread raises instead of the dataset's exception: that exception, the text of
    its traceback (which the caller's thread cannot see) and where it happened."""

    def __init__(self, error, where):
        super().__init__(where)
        self.error, self.where = error, where
        self.text = "".join(traceback.format_exception(type(error), error, error.__traceback__))

    def reraise(self):
        kind = type(self.error)
        msg = f"Caught {kind.__name__} in {self.where}.\nOriginal traceback (most recent call last, in the worker):\n"
        msg += self.text.split("\n", 1)[1] if self.text.startswith("Traceback") else self.text
        if kind is KeyError:
            msg = _KeyErrorMessage(msg)
        try:
            err = kind(msg)
        except Exception:  # an exception type whose constructor wants more than a message
            err = RuntimeError(msg)
        raise err from None


class DataLoader:
    """Iterates over `dataset` in batches of `batch_size`.

    shuffle: a new order each epoch, drawn from a NumPy Generator seeded with `seed` (the same seed
        gives the same sequence of epochs).
    last_batch: 'keep' (a smaller last batch), 'discard' (drop it) or 'rollover' (carry the leftover
        samples to the start of the next epoch).
    num_workers: threads that build batches (0 or 1: one thread when prefetching).
    prefetch: how many batches are prepared ahead in the background (0: built on demand in the
        caller's thread, no threads at all).
    device: where the batches are placed (default cpu).
    """

    def __init__(self, dataset, batch_size, shuffle=False, last_batch="keep", num_workers=0, prefetch=2,
                 device=None, seed=None, batchify_fn=None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be an integer >= 1, got {batch_size!r}")
        if last_batch not in _LAST_BATCH:
            raise ValueError(f"DataLoader: last_batch must be one of {_LAST_BATCH}, got '{last_batch}'")
        if num_workers < 0 or prefetch < 0:
            raise ValueError(f"DataLoader: num_workers and prefetch must be >= 0, got {num_workers} and {prefetch}")
        self.dataset, self.batch_size, self.shuffle = dataset, int(batch_size), shuffle
        self.last_batch, self.num_workers, self.prefetch = last_batch, num_workers, prefetch
        self.device, self._batchify = device, batchify_fn
        self._rng = np.random.default_rng(seed)
        self._leftover = np.zeros(0, dtype=np.int64)

    def __len__(self):
        n = len(self.dataset) + len(self._leftover)
        if self.last_batch == "keep":
            return math.ceil(n / self.batch_size)
        return n // self.batch_size

    def _epoch_batches(self):
        """The index arrays of this epoch's batches (advances the shuffle and rollover state)."""
        n = len(self.dataset)
        order = self._rng.permutation(n) if self.shuffle else np.arange(n, dtype=np.int64)
        order = np.concatenate([self._leftover, order]) if len(self._leftover) else order
        full = len(order) // self.batch_size * self.batch_size
        batches = [order[i:i + self.batch_size] for i in range(0, full, self.batch_size)]
        self._leftover = np.zeros(0, dtype=np.int64)
        if full < len(order):
            if self.last_batch == "keep":
                batches.append(order[full:])
            elif self.last_batch == "rollover":
                self._leftover = order[full:]
        return batches

    def _make_batch(self, indices):
        if self._batchify is None:
            fast = getattr(self.dataset, "_batch", None)
            batch = fast(indices, self.device) if fast is not None else None
            if batch is not None:
                return batch
            return default_batchify_fn([self.dataset[int(i)] for i in indices], self.device)
        out = self._batchify([self.dataset[int(i)] for i in indices])
        return out

    def _make_batch_in_worker(self, indices, number):
        try:
            return self._make_batch(indices)
        except Exception as e:
            where = f"DataLoader worker thread '{threading.current_thread().name}' (batch {number} of the epoch)"
            raise _WorkerFailure(e, where) from None

    def __iter__(self):
        batches = self._epoch_batches()
        if self.prefetch == 0:
            return (self._make_batch(b) for b in batches)
        return self._prefetching(batches)

    def _prefetching(self, batches):
        # Futures in batch order: the k-th result is the k-th batch whatever thread built it.
        pool = concurrent.futures.ThreadPoolExecutor(max(1, self.num_workers), thread_name_prefix="kiln-data")
        pending = collections.deque()
        ahead = max(self.prefetch, self.num_workers)
        it = iter(enumerate(batches))
        try:
            for number, b in it:
                pending.append(pool.submit(self._make_batch_in_worker, b, number))
                if len(pending) >= ahead:
                    break
            while pending:
                try:
                    batch = pending.popleft().result()
                except _WorkerFailure as failure:
                    failure.reraise()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(self._make_batch_in_worker, nxt[1], nxt[0]))
                yield batch
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=False)
