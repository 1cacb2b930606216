"""save_parameters / load_parameters: the safetensors layout (checked with a plain reader written
here), exact round trips, atomic writes, and every bad-file case raising kiln.FormatError."""
import json
import os
import struct

import numpy as np
import pytest

import kiln
from kiln import autograd, nd, nn
from kiln.nn import serialization

_NP = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1",
       "BOOL": "?", "BF16": "<u2"}


def read_safetensors(path):
    """A plain reader of the format, independent of kiln: (header, {name: numpy array})."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        arrays[name] = np.frombuffer(data[begin:end], _NP[entry["dtype"]]).reshape(entry["shape"])
    return header, arrays


def _net():
    net = nn.Sequential()
    net.add(nn.Conv2D(4, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.GlobalAvgPool2D(), nn.Dense(3))
    return net


def _trained(x):
    net = _net()
    net.initialize(kiln.init.Xavier())
    with autograd.record():  # a training pass, so the running statistics are not the defaults
        net(x)
    return net


def _values(net):
    return {k: p.data().asnumpy() for k, p in net.collect_params().items()}


@pytest.fixture
def saved(tmp_path):
    x = nd.random.normal(shape=(2, 3, 5, 5))
    net = _trained(x)
    path = tmp_path / "net.safetensors"
    net.save_parameters(str(path))
    return net, path, x


def test_file_layout_is_safetensors(saved):
    net, path, _ = saved
    header, arrays = read_safetensors(path)
    (n,) = struct.unpack("<Q", open(path, "rb").read(8))
    assert (8 + n) % 8 == 0
    assert header["__metadata__"] == {"format": "kiln"}
    params = net.collect_params()
    assert list(arrays) == list(params)
    end = 0
    for name, p in params.items():
        entry = header[name]
        assert entry["dtype"] == "F32" and tuple(entry["shape"]) == p.shape
        assert entry["data_offsets"][0] == end
        end = entry["data_offsets"][1]
        np.testing.assert_array_equal(arrays[name], p.data().asnumpy())
    assert os.path.getsize(path) == 8 + n + end
    assert os.listdir(path.parent) == ["net.safetensors"]  # no temporary file left behind


def test_round_trip_is_exact_into_a_deferred_network(saved):
    net, path, x = saved
    fresh = _net()
    fresh.load_parameters(str(path))  # shapes still unknown: taken from the file
    for name, value in _values(net).items():
        np.testing.assert_array_equal(fresh.collect_params()[name].data().asnumpy(), value, err_msg=name)
    np.testing.assert_array_equal(fresh(x).asnumpy(), net(x).asnumpy())
    assert fresh.collect_params()["1.running_var"].grad_req == "null"


def test_load_into_initialized_network_keeps_arrays_and_device(saved):
    net, path, x = saved
    other = _trained(x)
    held = other[0].weight.data()
    other.load_parameters(str(path))
    assert other[0].weight.data() is held  # a Trainer holding the arrays sees the loaded values
    np.testing.assert_array_equal(held.asnumpy(), net[0].weight.data().asnumpy())
    on_cpu1 = _net()
    on_cpu1.load_parameters(str(path), device=kiln.cpu(1))
    assert on_cpu1[4].weight.list_device() == [kiln.cpu(1)]


def test_every_dtype_round_trips(tmp_path):
    arrays = {
        "f32": nd.array(np.random.randn(3, 2).astype(np.float32)),
        "f64": nd.array(np.random.randn(4)),
        "f16": nd.array(np.random.randn(2, 2).astype(np.float16)),
        "bf16": nd.array(np.array([1.5, -2.25, 3.0e10, 0.0], np.float32), dtype="bfloat16"),
        "i32": nd.array(np.array([1, -2, 2**31 - 1], np.int32)),
        "i64": nd.array(np.array([2**40, -1], np.int64)),
        "u8": nd.array(np.array([0, 255], np.uint8)),
        "bool": nd.array(np.array([True, False, True])),
        "empty": nd.zeros((0, 3)),
    }
    path = str(tmp_path / "a.safetensors")
    serialization.save_arrays(path, arrays)
    loaded, meta = serialization.load_arrays(path)
    assert meta == {}
    for name, arr in arrays.items():
        assert loaded[name]._dtype_name == arr._dtype_name and loaded[name].shape == arr.shape
        np.testing.assert_array_equal(loaded[name].asnumpy(), arr.asnumpy(), err_msg=name)
    header, raw = read_safetensors(path)
    assert header["bf16"]["dtype"] == "BF16" and raw["bf16"][0] == 0x3FC0  # 1.5 in bfloat16
    assert header["bool"]["dtype"] == "BOOL" and header["u8"]["dtype"] == "U8"


def test_failed_save_leaves_old_file_intact(saved, monkeypatch):
    net, path, _ = saved
    before = open(path, "rb").read()
    calls = []

    def failing(arr):
        calls.append(arr)
        if len(calls) == 3:
            raise OSError("disk full")
        return original(arr)
    original = serialization._to_bytes
    monkeypatch.setattr(serialization, "_to_bytes", failing)
    net[0].weight.set_data(nd.zeros(net[0].weight.shape))
    with pytest.raises(OSError, match="disk full"):
        net.save_parameters(str(path))
    assert open(path, "rb").read() == before
    assert os.listdir(path.parent) == ["net.safetensors"]


# -- bad files: each raises kiln.FormatError saying what was expected, found and what to do ----------

def _rewrite(path, header=None, raw_header=None):
    """Replaces the header of a valid file, keeping its data section."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    body = blob[8 + n:]
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)


def _expect_format_error(net, path, *patterns, **kwargs):
    before = _values(net) if all(p._data is not None for p in net.collect_params().values()) else None
    with pytest.raises(kiln.FormatError) as info:
        net.load_parameters(str(path), **kwargs)
    for pattern in patterns:
        assert pattern in str(info.value), f"{pattern!r} not in: {info.value}"
    if before is not None:  # a failed load changes nothing
        for name, value in _values(net).items():
            np.testing.assert_array_equal(value, before[name])
    return str(info.value)


def test_not_a_safetensors_file(tmp_path, saved):
    net = saved[0]
    short = tmp_path / "short.bin"
    short.write_bytes(b"abc")
    _expect_format_error(net, short, "not a safetensors file", "8-byte", "3 bytes")
    text = tmp_path / "text.txt"
    text.write_text("this is a text file and certainly not tensors\n" * 3)
    _expect_format_error(net, text, "not a safetensors file", "header length")


def test_truncated_file(saved):
    net, path, _ = saved
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:-10])
    _expect_format_error(net, path, "truncated", "save the parameters again")
    open(path, "wb").write(blob[:20])  # cut inside the header
    _expect_format_error(net, path, "header length")


def test_bad_header_json(saved):
    net, path, _ = saved
    good = open(path, "rb").read()
    _rewrite(path, raw_header=b'{"0.weight": {"dtype": "F32", ')
    _expect_format_error(net, path, "bad safetensors header", "JSON")
    open(path, "wb").write(good)
    _rewrite(path, raw_header=b"[1, 2, 3]")
    _expect_format_error(net, path, "expected a JSON object", "list")


def test_bad_header_entries(saved):
    net, path, _ = saved
    header, _ = read_safetensors(path)
    header["0.bias"]["dtype"] = "C64"
    _rewrite(path, header)
    _expect_format_error(net, path, "'0.bias'", "C64", "not supported")
    header["0.bias"]["dtype"] = "F32"
    header["0.bias"]["shape"] = [5]
    _rewrite(path, header)
    _expect_format_error(net, path, "'0.bias'", "needs 20 bytes", "span 16")


def test_trailing_garbage(saved):
    net, path, _ = saved
    with open(path, "ab") as f:
        f.write(b"\0" * 8)
    _expect_format_error(net, path, "trailing garbage")


def test_missing_parameter(tmp_path, saved):
    net, path, x = saved
    smaller = nn.Sequential()
    smaller.add(nn.Conv2D(4, 3, padding=1))
    smaller.initialize()
    smaller(x)
    part = tmp_path / "part.safetensors"
    smaller.save_parameters(str(part))
    msg = _expect_format_error(net, part, "'1.gamma'", "allow_missing=True")
    assert "4.weight" in msg
    before = net[4].weight.data().asnumpy()
    net.load_parameters(str(part), allow_missing=True)
    np.testing.assert_array_equal(net[0].weight.data().asnumpy(), smaller[0].weight.data().asnumpy())
    np.testing.assert_array_equal(net[4].weight.data().asnumpy(), before)


def test_unexpected_parameter(saved):
    net, path, _ = saved
    smaller = nn.Sequential()
    smaller.add(nn.Conv2D(4, 3, padding=1))
    smaller.initialize()
    smaller(nd.ones((1, 3, 5, 5)))
    _expect_format_error(smaller, path, "'1.gamma'", "does not have", "ignore_extra=True")
    smaller.load_parameters(str(path), ignore_extra=True)
    np.testing.assert_array_equal(smaller[0].weight.data().asnumpy(), net[0].weight.data().asnumpy())


def test_shape_mismatch(saved):
    _, path, x = saved
    wider = nn.Sequential()
    wider.add(nn.Conv2D(5, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
              nn.GlobalAvgPool2D(), nn.Dense(3))
    wider.initialize()
    wider(x)
    _expect_format_error(wider, path, "'0.weight'", "(5, 3, 3, 3)", "(4, 3, 3, 3)")


def test_dtype_mismatch_needs_cast_dtype(saved):
    net, path, _ = saved
    double = _net()
    double.cast("float64")
    _expect_format_error(double, path, "'0.weight'", "float64", "float32", "cast_dtype=True")
    double.load_parameters(str(path), cast_dtype=True)
    assert double[0].weight.data().dtype == np.float64
    np.testing.assert_array_equal(double[0].weight.data().asnumpy(),
                                  net[0].weight.data().asnumpy().astype(np.float64))
