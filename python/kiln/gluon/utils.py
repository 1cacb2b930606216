"""kiln.gluon.utils, as mxnet.gluon.utils: split_data, split_and_load (kiln.utils's) and
clip_global_norm. Not here: download and check_sha1 (kiln reads datasets from local files).
"""
import math
import warnings

from .. import _C, autograd
from ..utils import split_and_load, split_data

__all__ = ["split_data", "split_and_load", "clip_global_norm"]


def clip_global_norm(arrays, max_norm, check_isfinite=True):
    """Rescales `arrays` in place so that their joint L2 norm is at most `max_norm`, as Gluon.

    The norm is sqrt(sum of every element squared, over every array), computed on the first
    array's device (the arrays may live on several). Returns it as a Python float, which waits for
    the result; with check_isfinite=False it is returned as a one-element NDArray instead (no
    wait), and a non-finite norm is not reported.
    """
    arrays = list(arrays)
    if not arrays:
        raise _C.ArgumentError("clip_global_norm: arrays is empty; pass the gradients to clip "
                               "(e.g. [p.grad() for p in net.collect_params().values()])")
    if max_norm <= 0:
        raise _C.ArgumentError(f"clip_global_norm: max_norm must be positive, got {max_norm}")
    device = arrays[0].device
    with autograd.pause():
        total = None
        for arr in arrays:
            sq = _C.square(arr.astype("float32", copy=False)).sum(axis=None, keepdims=False)
            sq = sq.as_in_context(device)
            total = sq if total is None else total + sq
        norm = _C.sqrt(total)._reshape((1,))
        # scale = min(max_norm / (norm + eps), 1), kept on the device: no wait before the update
        scale = _C.minimum(max_norm / (norm + 1e-8), _C.ones((1,), "float32", device))
        for arr in arrays:
            arr *= scale.as_in_context(arr.device).astype(arr._dtype_name, copy=False)
    if not check_isfinite:
        return norm
    value = float(norm.asscalar())
    if not math.isfinite(value):
        warnings.warn(f"clip_global_norm: the global norm is {value}; the arrays were scaled by a "
                      f"non-finite factor. Look for a NaN or Inf in the gradients", RuntimeWarning,
                      stacklevel=2)
    return value
