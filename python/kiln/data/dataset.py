"""Datasets as Gluon's: anything with __len__ and __getitem__, plus ArrayDataset, Subset and the lazy
transform / transform_first wrappers.

A dataset may also answer `_take(indices)` with its fields gathered for a whole batch (NumPy
arrays, one per field); the DataLoader then converts a batch in one vectorised step instead of
calling __getitem__ per sample. Transforms from kiln.data.transforms that reduce to a per-channel
affine map (ToTensor, Normalize, Compose of them) run in that step, in C++ without the GIL.
"""
import gzip
import zlib

import numpy as np

from .. import _C, nd

__all__ = ["Dataset", "ArrayDataset", "SimpleDataset", "Subset", "read_idx"]


def read_idx(path):
    """Reads an IDX file (MNIST's format), gzip-compressed (.gz) or raw, into a NumPy array.

    Raises FileNotFoundError when the file is missing and kiln.FormatError when it is corrupt or
    truncated (a bad magic number, a header that promises more data than the file has, or a
    gzip stream that ends early).
    """
    path = str(path)
    with open(path, "rb") as f:
        head = f.read(2)
    if head != b"\x1f\x8b":
        return _C.read_idx(path)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (EOFError, OSError, zlib.error) as e:
        raise _C.FormatError(f"IDX file '{path}': the gzip stream is corrupt or truncated ({e}); "
                             f"download or install the file again") from None
    return _C.parse_idx(raw, path)


def _as_batch_array(a, device=None):
    """A NumPy batch as an NDArray, narrowing float64 to float32 and int64 to int32 as Gluon."""
    a = np.asarray(a)
    if a.dtype == np.float64 or a.dtype == np.float16:
        a = a.astype(np.float32)
    elif a.dtype.kind in "iu" and a.dtype != np.uint8:
        a = a.astype(np.int32)
    return nd.array(a, device=device)


class Dataset:
    """The interface of every dataset: __len__ and __getitem__ (as gluon.data.Dataset)."""

    def __len__(self):
        raise NotImplementedError

    def __getitem__(self, idx):
        raise NotImplementedError

    def transform(self, fn, lazy=True):
        """A dataset whose samples are fn(*sample) (or fn(sample) for single-field samples)."""
        ds = _TransformDataset(self, fn, first_only=False)
        return ds if lazy else SimpleDataset([ds[i] for i in range(len(ds))])

    def transform_first(self, fn, lazy=True):
        """A dataset whose samples have fn applied to their first field (the image) only.

        With a kiln.data.transforms transform such as Compose([ToTensor(), Normalize(...)]), the
        DataLoader converts whole batches in one vectorised step.
        """
        ds = _TransformDataset(self, fn, first_only=True)
        return ds if lazy else SimpleDataset([ds[i] for i in range(len(ds))])

    def _take(self, indices):
        """The fields of the samples at `indices` gathered as NumPy arrays, or None (no fast path)."""
        return None

    def _batch(self, indices, device=None):
        """A batch as a tuple of NDArrays in one vectorised step, or None (no fast path)."""
        raw = self._take(indices)
        return None if raw is None else tuple(_as_batch_array(a, device) for a in raw)


class SimpleDataset(Dataset):
    """A dataset over a list (or anything indexable with a length)."""

    def __init__(self, data):
        self._data = data

    def __len__(self):
        return len(self._data)

    def __getitem__(self, idx):
        return self._data[idx]


class ArrayDataset(Dataset):
    """Samples taken from several arrays of the same length: ds[i] = (a[i], b[i], ...).

    With one array, ds[i] is a[i]. NumPy arrays, NDArrays and lists are accepted; NDArrays are
    converted to NumPy once (samples are cheap to index there; the DataLoader converts batches).
    """

    def __init__(self, *args):
        if not args:
            raise ValueError("ArrayDataset needs at least one array")
        n = len(args[0])
        for i, a in enumerate(args):
            if len(a) != n:
                raise ValueError(f"ArrayDataset: all arrays must have the same length; array 0 has {n} "
                                 f"samples, array {i} has {len(a)}")
        self._arrays = [a.asnumpy() if isinstance(a, _C.NDArray) else a for a in args]
        self._length = n

    def __len__(self):
        return self._length

    def __getitem__(self, idx):
        if len(self._arrays) == 1:
            return self._arrays[0][idx]
        return tuple(_item(a[idx]) for a in self._arrays)

    def _take(self, indices):
        if not all(isinstance(a, np.ndarray) for a in self._arrays):
            return None
        return tuple(a[indices] for a in self._arrays)


def _item(x):
    # Scalar labels come back as Python numbers, as Gluon's datasets give them.
    return x.item() if isinstance(x, np.generic) else x


class Subset(Dataset):
    """The samples of `dataset` at `indices` (a range, list or array of positions)."""

    def __init__(self, dataset, indices):
        self._dataset = dataset
        self._indices = np.asarray(indices, dtype=np.int64)
        n = len(dataset)
        if self._indices.size and (self._indices.min() < -n or self._indices.max() >= n):
            raise IndexError(f"Subset: indices must lie in [0, {n}) for a dataset of {n} samples")
        self._indices %= max(n, 1)

    def __len__(self):
        return len(self._indices)

    def __getitem__(self, idx):
        return self._dataset[int(self._indices[idx])]

    def _take(self, indices):
        return self._dataset._take(self._indices[indices])

    def _batch(self, indices, device=None):
        return self._dataset._batch(self._indices[np.asarray(indices)], device)


class _TransformDataset(Dataset):
    def __init__(self, dataset, fn, first_only):
        self._dataset, self._fn, self._first_only = dataset, fn, first_only

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, idx):
        item = self._dataset[idx]
        if self._first_only:
            return (self._fn(item[0]),) + tuple(item[1:]) if isinstance(item, tuple) else self._fn(item)
        return self._fn(*item) if isinstance(item, tuple) else self._fn(item)

    def _batch(self, indices, device=None):
        affine = _affine_of(self._fn) if self._first_only else None
        raw = self._dataset._take(indices) if affine is not None else None
        if raw is None or not _is_image_batch(raw[0]):
            return None
        return (_images_to_batch(raw[0], affine, device),) + tuple(_as_batch_array(a, device) for a in raw[1:])


def _affine_of(fn):
    from .transforms import Transform
    return fn._affine() if isinstance(fn, Transform) else None


def _is_image_batch(a):
    return isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.ndim in (3, 4)


def _images_to_batch(images, affine, device):
    scale, mean, std = affine
    return _C.images_to_batch(np.ascontiguousarray(images), np.arange(len(images)), scale,
                              [float(m) for m in mean], [float(s) for s in std], device)
