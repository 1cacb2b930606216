"""Reading and writing named arrays in the safetensors layout (what save_parameters writes).

Layout: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian bytes, offsets relative to the end of the header. Writes go to a
temporary file in the same directory that is os.replace'd into place, so a crash never leaves a
half-written file. Reads check every field and raise kiln.FormatError saying what was expected,
what was found and what to do. Not here: memory mapping, lazy loading.
"""
import json
import math
import os
import struct
import tempfile

import numpy as np

from .. import nd
from .._C import FormatError

__all__ = ["save_arrays", "load_arrays"]

# kiln dtype name -> (safetensors tag, NumPy storage type of the raw bytes)
_TAGS = {"float32": ("F32", "<f4"), "float64": ("F64", "<f8"), "float16": ("F16", "<f2"),
         "bfloat16": ("BF16", "<u2"), "int32": ("I32", "<i4"), "int64": ("I64", "<i8"),
         "uint8": ("U8", "u1"), "bool": ("BOOL", "?")}
_BY_TAG = {tag: (name, storage) for name, (tag, storage) in _TAGS.items()}
_HEADER_LIMIT = 100 * 1024 * 1024  # the reference implementation's bound on the JSON header


def _to_bytes(arr):
    name = arr._dtype_name
    values = arr.asnumpy()
    if name == "bfloat16":
        # asnumpy widens bfloat16 to float32 exactly, so the upper 16 bits are the bfloat16 bits.
        values = (np.ascontiguousarray(values, "<f4").view("<u4") >> 16).astype("<u2")
    return np.ascontiguousarray(values, _TAGS[name][1]).tobytes()


def _from_bytes(raw, name, shape, device):
    values = np.frombuffer(raw, _TAGS[name][1]).reshape(shape)
    if name == "bfloat16":
        values = (values.astype("<u4") << 16).view("<f4")
    return nd.array(np.array(values), dtype=name, device=device)


def save_arrays(path, arrays, metadata=None):
    """Writes {name: NDArray} to `path` atomically."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in arrays.items():
        if arr._dtype_name not in _TAGS:
            raise FormatError(f"cannot save '{name}': dtype {arr._dtype_name} has no safetensors tag "
                              f"(supported: {sorted(_TAGS)}); cast it first")
        raw = _to_bytes(arr)
        header[name] = {"dtype": _TAGS[arr._dtype_name][0], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad so the data starts 8-byte aligned, as the reference writer
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for raw in chunks:
                f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a saved file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _read_header(path, blob):
    resave = "re-save it with save_parameters, or check the path"
    if len(blob) < 8:
        raise FormatError(f"'{path}' is not a safetensors file: expected at least an 8-byte header "
                          f"length, found a file of {len(blob)} bytes; {resave}")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > min(len(blob) - 8, _HEADER_LIMIT):
        raise FormatError(f"'{path}' is not a safetensors file (or is truncated): the header length "
                          f"field says {n} bytes but only {len(blob) - 8} bytes follow it; {resave}")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"'{path}' has a bad safetensors header: expected {n} bytes of UTF-8 JSON, "
                          f"found unparsable text ({e}); the file is damaged or not a safetensors "
                          f"file; {resave}") from None
    if not isinstance(header, dict):
        raise FormatError(f"'{path}' has a bad safetensors header: expected a JSON object, found "
                          f"{type(header).__name__}; {resave}")
    return header, 8 + n


def _check_entry(path, name, entry, data_len):
    bad = f"'{path}': tensor '{name}' has a bad header entry"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise FormatError(f"{bad}: expected the keys dtype, shape, data_offsets, found {entry!r}")
    tag, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if tag not in _BY_TAG:
        raise FormatError(f"{bad}: dtype {tag!r} is not supported by kiln (expected one of "
                          f"{sorted(_BY_TAG)}); convert the tensor before loading")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise FormatError(f"{bad}: expected shape to be a list of non-negative integers, found {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise FormatError(f"{bad}: expected data_offsets [begin, end] with 0 <= begin <= end, "
                          f"found {offsets!r}")
    name_, storage = _BY_TAG[tag]
    want = math.prod(shape) * np.dtype(storage).itemsize
    if offsets[1] - offsets[0] != want:
        raise FormatError(f"{bad}: a {tag} tensor of shape {tuple(shape)} needs {want} bytes but "
                          f"data_offsets {offsets} span {offsets[1] - offsets[0]}; the file is damaged")
    if offsets[1] > data_len:
        raise FormatError(f"'{path}' is truncated: tensor '{name}' needs bytes {offsets} of the data "
                          f"section but only {data_len} bytes are there; the write or copy was cut "
                          f"short, save the parameters again")
    return name_, tuple(shape), offsets


def load_arrays(path, device=None):
    """Reads `path` into (dict name -> NDArray on `device`, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    header, start = _read_header(path, blob)
    metadata = header.pop("__metadata__", {}) or {}
    data_len = len(blob) - start
    entries = {name: _check_entry(path, name, entry, data_len) for name, entry in header.items()}
    spans = sorted(offsets for _, _, offsets in entries.values())
    covered = 0
    for begin, end in spans:
        if begin != covered:
            raise FormatError(f"'{path}': the tensors' data_offsets must tile the data section without "
                              f"gaps or overlaps; expected the next tensor at byte {covered}, found "
                              f"{begin}; the file is damaged")
        covered = end
    if covered != data_len:
        raise FormatError(f"'{path}': the header describes {covered} bytes of data but {data_len} "
                          f"follow it; the file is damaged or has trailing garbage")
    device = device if device is not None else nd._C.cpu()
    arrays = {name: _from_bytes(blob[start + b:start + e], dtype, shape, device)
              for name, (dtype, shape, (b, e)) in entries.items()}
    return arrays, metadata
