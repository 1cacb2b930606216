"""Reading and writing named arrays in the safetensors layout (what save_parameters and export
write), through kiln's one implementation of the format (ir/params.cc, which kiln::load in C++
reads as well): an 8-byte little-endian header length, a JSON header with each tensor's dtype,
shape and data offsets, then the raw little-endian bytes. Writes are atomic; reads check every
field and raise kiln.FormatError saying what was expected, what was found and what to do.
"""
import os

from .. import _C

__all__ = ["save_arrays", "load_arrays"]


def _to_bytes(arr):
    """The array's value on the host, as the writer takes it (waits for the array)."""
    return _C.HostTensor(arr)


def save_arrays(path, arrays, metadata=None):
    """Writes {name: NDArray} to `path` atomically; `metadata` ({str: str}) goes to __metadata__."""
    params = [(str(name), _to_bytes(arr)) for name, arr in arrays.items()]
    _C.save_params(os.fspath(path), params, {str(k): str(v) for k, v in (metadata or {}).items()})


def load_arrays(path, device=None):
    """Reads `path` into (dict name -> NDArray on `device`, in file order; metadata dict)."""
    arrays, metadata = _C.load_params(os.fspath(path), device if device is not None else _C.cpu())
    return dict(arrays), metadata
